"""SCAFFOLD (Karimireddy et al. 2020, Algorithm 1, option II) written against the pre-issue-49 API
(b530c1b): hooks take the Federation `fed`; `aggregate()` is not called under eval_models: local.
Scratch file for the before/after note; never committed."""
import torch
import torch.nn.functional as F

from fedshift.engine.sampling import round_clients
from fedshift.methods.base import ServerParams
from fedshift.methods.fedavg import FedAvg


class Scaffold(FedAvg):
    """SCAFFOLD (option II): control variates correct each local step's drift."""

    name, Params = "scaffold_old", ServerParams  # init, weighting, eval_models: the protocol is a method param
    supports_server_model = False  # per-participant state (c_i); a shared model would mix them
    state_attrs = ("c", "c_i")

    def setup(self, fed):
        # No way to declare "plain SGD" to `fedshift validate`: refuse at the job's start instead.
        if fed.cfg.optimizer != "sgd" or fed.cfg.momentum != 0:
            raise ValueError(f"{self.name} needs engine.optimizer: sgd with momentum: 0, got "
                             f"{fed.cfg.optimizer} / momentum {fed.cfg.momentum}")
        super().setup(fed)
        zeros = {n: torch.zeros_like(w) for n, w in fed.clients[0].model.named_parameters()}
        self.c, self.c_i = dict(zeros), {cl.name: dict(zeros) for cl in fed.clients}

    def begin_round(self, fed, r, global_state):  # both protocols call it: x = the round's start
        self._x, self._steps = global_state, {}

    def local_loss(self, fed, client, x, y, step):  # its gradient gains c - c_i (line 10)
        self._steps[client.name] = self._steps.get(client.name, 0) + 1  # K_i: no step count from the engine
        drift = sum(((self.c[n] - self.c_i[client.name][n]) * w).sum() for n, w in client.model.named_parameters())
        return F.cross_entropy(client.model(x), y) + drift

    def after_round(self, fed, r):
        # aggregate() is skipped under eval_models: local, so the control update lives here, where both
        # protocols still hold each trained client's weights (FedAvg.after_round then loads the average).
        lr = fed.make_optimizer(fed.clients[0].model).param_groups[0]["lr"]  # this round's local lr
        c = self.c  # the round's c for every client's line 12
        for cl in round_clients(fed, r):  # the round's clients (every client under local)
            y = dict(cl.model.named_parameters())
            c_new = {n: self.c_i[cl.name][n] - c[n] + (self._x[n] - y[n].detach())
                     / (max(self._steps.get(cl.name, 0), 1) * lr) for n in c}  # line 12, option II
            self.c = {n: self.c[n] + (c_new[n] - self.c_i[cl.name][n]) / len(fed.clients) for n in c}
            self.c_i[cl.name] = c_new
        super().after_round(fed, r)  # global: load the average; local: the next round's collaborate averages
