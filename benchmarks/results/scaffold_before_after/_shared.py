"""What the two checks (scratch_check.py on the API before issue 49, check_after.py on today's) share: the
engine's own steps and corrected gradients, recorded by wrapping the federation's optimizer step. Imports
nothing of fedshift, so either API's checkout can run it."""
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]  # the checkout these files live in


def record_grads(fed, store):
    """Wrap fed.optimizer_step: after each step, add each parameter's .grad (the corrected gradient the SGD
    step used) into store[client] and count the step: an independent K_i and mean step direction."""
    orig = fed.optimizer_step

    def step(opt, loss, participant, term):
        ok = orig(opt, loss, participant, term)
        if ok:
            model = next(c.model for c in fed.clients if c.name == participant)
            s = store.setdefault(participant, {"K": 0, "g": {}})
            s["K"] += 1
            for n, p in model.named_parameters():
                s["g"][n] = s["g"].get(n, 0) + p.grad.detach().clone()
        return ok

    fed.optimizer_step = step
