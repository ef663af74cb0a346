"""Screenshots of the MLflow 3 web UI comparing methods, taken by a real headless browser.

    python benchmarks/mlflow_screenshots.py [--root .] [--experiment rotmnist] \
        [--out benchmarks/out/mlflow] [--metric table/AVG_inter] [--timeout 180]

Starts ``mlflow server`` on a free 127.0.0.1 port over ``<root>/mlflow.db`` (artifacts under
``<root>/mlartifacts``), waits until it answers ``/health``, then drives headless Chromium
(Debian's ``chromium`` package) over the DevTools protocol (``--remote-debugging-pipe``,
standard library only) and saves a PNG of each of three views:

* ``runs.png``: the experiment's runs table restricted to its federated runs (run names
  ``<method> <structure> <scenario>+<public> s<seed>``, sorted by name), with columns
  ``--metric``, ``table/AVG_intra``, ``time/total_s`` and params ``method``, ``structure``;
* ``charts.png``: the chart view of the same runs: the full run names with their colours
  left, then a first section with a bar chart of ``--metric`` (one bar per run, i.e. per
  method and structure), ``avg/inter/top1`` per round and a bar chart of ``time/total_s``;
* ``compare.png``: MLflow's compare-runs page over those runs (parallel-coordinates plot
  of the params MLflow picks, then run names, times and durations side by side).

The table columns and the chart section are the experiment page's view state, which MLflow
3 keeps in the browser's localStorage: the script writes it (into the throw-away browser
profile) before the app loads; the app's left navigation is folded and the run list dragged
wider with real mouse events.

A single-page app shows a loading placeholder first, so each view is captured only once
the page has really rendered: the script polls ``document.body.innerText`` (through
``Runtime.evaluate``) until every run name it expects is there, no spinner or skeleton is
left and the text has stopped changing; if that does not happen within ``--timeout``
seconds it exits 1 naming the view. The server and the browser are stopped in all cases.

Prints the URLs and the files written; exits 2 with one line when Chromium, the store or
the experiment is missing, or the experiment has no federated run.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

PROG = "mlflow_screenshots"


class RenderTimeout(RuntimeError):
    """A view did not finish rendering in time."""


def fail(msg: str, code: int = 2) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return code


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerError(RuntimeError):
    """``mlflow server`` exited or did not answer."""


@contextlib.contextmanager
def mlflow_server(root: Path):
    """``mlflow server`` over ``root/mlflow.db`` (artifacts ``root/mlartifacts``) on a free 127.0.0.1 port, in its
    own session; yields its base URL once ``/health`` answers; stopped (uvicorn workers too) on the way out."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                               f"sqlite:///{(root / 'mlflow.db').resolve()}",
                               "--default-artifact-root", (root / "mlartifacts").resolve().as_uri(),
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(240):
            if server.poll() is not None:
                raise ServerError(f"mlflow server exited with {server.returncode} before answering")
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise ServerError("mlflow server did not answer within 120 s")
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server's own session: uvicorn workers too
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Headless Chromium driven over the DevTools protocol through ``--remote-debugging-pipe``:
    the browser reads NUL-terminated JSON commands on fd 3 and writes replies/events on fd 4,
    so no websocket library is needed."""

    def __init__(self, exe: str, size: tuple[int, int]):
        self.size = size
        self.profile = tempfile.mkdtemp(prefix="mlflow_shots_chromium_")
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()

        def wire_fds():  # in the child: its fd 3 = commands in, fd 4 = replies out
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        cmd = [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
               "--hide-scrollbars", "--no-first-run", "--no-default-browser-check", "--mute-audio",
               "--disable-extensions", "--disable-background-networking", "--disable-sync",
               "--disable-dev-shm-usage", "--disable-breakpad", "--disable-crash-reporter",
               f"--user-data-dir={self.profile}",
               f"--window-size={size[0]},{size[1]}", "about:blank"]
        self.proc = subprocess.Popen(cmd, preexec_fn=wire_fds, pass_fds=(3, 4),  # kept after wire_fds ran
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.session = None
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
            self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                     session=False)["sessionId"]
            self.call("Page.enable")
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.close()
            raise

    def _message(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise RenderTimeout("Chromium did not answer on its DevTools pipe")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe (did it crash?)")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: bool = True, timeout: float = 60) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:  # events and other replies are skipped
            reply = self._message(timeout)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})

    def eval(self, expr: str, timeout: float = 30):
        res = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True},
                        timeout=timeout)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails'].get('text')}: {expr[:80]}")
        return res.get("result", {}).get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def mouse(self, kind: str, x: float, y: float, pressed: bool = False) -> None:
        self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left",
                                               "buttons": int(pressed), "clickCount": 1})

    def drag(self, x: float, y: float, dx: float) -> None:
        """Press at (x, y), move ``dx`` pixels right in steps, release: what a user does to a splitter."""
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, True)
        for i in range(1, 11):
            self.mouse("mouseMoved", x + dx * i / 10, y, True)
        self.mouse("mouseReleased", x + dx, y)
        self.mouse("mouseMoved", 4, self.size[1] - 4)  # park the pointer: no hover toolbars in the shot

    def resize(self, width: int, height: int) -> None:
        self.size = (width, height)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def screenshot(self, out: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png"}, timeout=120)["data"]
        out.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close", session=False, timeout=5)
        except Exception:
            pass
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)


# Number of loading placeholders in the viewport: MLflow's skeletons/spinners (Du Bois design
# system and antd class names) and its "Loading" text.
NOT_LOADING_JS = r"""
(() => {
  const busy = document.querySelectorAll(
    '[class*="skeleton" i], [class*="Skeleton"], [class*="spin-spinning"], [class*="Spinner"],' +
    ' [data-testid*="loading" i], [role="progressbar"]');
  const visible = [...busy].filter(e => { const r = e.getBoundingClientRect();
    return e.offsetParent !== null && r.height > 0 && r.bottom > 0 && r.top < innerHeight; });
  return visible.length;  // charts further down render lazily: only the viewport counts
})()
"""


def wait_rendered(browser: Browser, view: str, needles: list[str], timeout: float, extra_js: str | None = None,
                  settle: float = 3.0) -> None:
    """Poll until ``document.body.innerText`` contains every needle, no placeholder is visible,
    ``extra_js`` (if any) is truthy and the text has been unchanged for ``settle`` seconds."""
    deadline = time.monotonic() + timeout
    last, stable_since, missing, busy = None, None, needles, -1
    probe = ("(() => { const t = document.body ? document.body.innerText : '';"
             f" return [t, {NOT_LOADING_JS.strip()}, {extra_js or 'true'}]; }})()")
    while time.monotonic() < deadline:
        try:
            text, busy, extra = browser.eval(probe)
        except RuntimeError:
            text, busy, extra = "", -1, False
        missing = [n for n in needles if n not in text]
        if not missing and busy == 0 and extra:
            if text == last:
                if time.monotonic() - stable_since >= settle:
                    return
            else:
                last, stable_since = text, time.monotonic()
        else:
            last = None
        time.sleep(0.5)
    raise RenderTimeout(f"view {view!r} did not render within {timeout:.0f} s "
                        f"(missing text: {missing[:3]}, placeholders visible: {busy}); raise --timeout on a loaded machine")


def ui_state(kind_filter: str, metric: str) -> dict:
    """The experiment page's view state: the same one every federated experiment carries as its
    shared view (fedshift.tracking.headline_view_state), written here into the throw-away
    profile's localStorage so the default (non-shared) page shows it too."""
    from fedshift.tracking import headline_view_state

    return headline_view_state(metric, kind_filter)


def seed_ui(browser: Browser, base: str, eid: str, state: dict) -> None:
    """Write the view state into the server origin's localStorage before the app first loads."""
    browser.goto(f"{base}/health")
    deadline = time.monotonic() + 60
    while browser.eval("location.origin") != base:
        if time.monotonic() > deadline:
            raise RenderTimeout(f"{base}/health did not load in the browser")
        time.sleep(0.3)
    key = f'MLflowLocalStorage-1.1-ExperimentPage-["{eid}"]-ReactComponentState'
    browser.eval(f"localStorage.setItem({json.dumps(key)}, {json.dumps(json.dumps(state))});"
                 "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"  # the Assistant side panel
                 "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');")


COLLAPSE_NAV_JS = """(() => { const b = document.querySelector('button[aria-label="Toggle sidebar"]');
  if (b && b.getBoundingClientRect().x > 100) { b.click(); return true; } return false; })()"""

# Where to drag to widen the run names: in the chart view the splitter between the run list
# and the charts (a tall column-resize strip), in the table view the run-name header's resizer.
SPLITTER_JS = """(() => { for (const e of document.querySelectorAll('div')) { const r = e.getBoundingClientRect();
  if (getComputedStyle(e).cursor === 'ew-resize' && r.height > 200) return [r.x + r.width / 2, r.y + 100]; }
  return null; })()"""
RUN_NAME_RESIZER_JS = """(() => { const e = document.querySelector(
  '.ag-header-cell[col-id="attributes.`Run Name`"] .ag-header-cell-resize');
  if (!e) return null; const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="folder holding mlflow.db and mlartifacts/")
    ap.add_argument("--experiment", default="rotmnist", help="MLflow experiment (= scenario)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/mlflow"))
    ap.add_argument("--metric", default="table/AVG_inter", help="headline metric shown in the table and charts")
    ap.add_argument("--timeout", type=float, default=180, help="seconds each view may take to render")
    ap.add_argument("--size", default="1600x1000", help="browser window WIDTHxHEIGHT")
    args = ap.parse_args(argv)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    db = (args.root / "mlflow.db").resolve()
    if not db.exists():
        return fail(f"no MLflow store {db}: run the workflow first")
    exe = find_chromium()
    if exe is None:
        return fail("no Chromium found (chromium, chromium-browser, google-chrome): apt-get install chromium")
    uri = f"sqlite:///{db}"
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        return fail(f"no experiment {args.experiment!r} (has: {', '.join(names)})")
    kind = "tags.`fedshift.kind` = 'federate'"
    runs = client.search_runs([exp.experiment_id], filter_string=kind, max_results=50,
                              order_by=["attributes.run_name ASC"])
    if not runs:
        return fail(f"experiment {args.experiment!r} has no federated run")
    names = [r.info.run_name for r in runs]
    args.out.mkdir(parents=True, exist_ok=True)

    browser = None
    try:
        server = mlflow_server(args.root)
        base = server.__enter__()
    except ServerError as exc:
        return fail(str(exc))
    try:
        eid = exp.experiment_id
        ids = [r.info.run_id for r in runs]
        exp_url = f"{base}/#/experiments/{eid}/runs?"
        charts_ready = ("document.querySelectorAll('.js-plotly-plot').length >= 3 && "
                        f"document.body.innerText.includes({json.dumps(args.metric)})")
        views = [  # (file, url, JS the rendered page must satisfy, JS locating what to drag wider)
            ("runs.png", exp_url + "compareRunsMode=TABLE", None, RUN_NAME_RESIZER_JS),
            ("charts.png", exp_url + "compareRunsMode=CHART", charts_ready, SPLITTER_JS),
            ("compare.png", f"{base}/#/compare-runs?runs={urllib.parse.quote(json.dumps(ids))}"
             f"&experiments={urllib.parse.quote(json.dumps([eid]))}", None, None),
        ]
        browser = Browser(exe, size)
        seed_ui(browser, base, eid, ui_state(kind, args.metric))
        for name, url, extra, widen in views:
            browser.goto(url)
            try:
                wait_rendered(browser, name, names, args.timeout, extra)
                if browser.eval(COLLAPSE_NAV_JS):  # more room for names: the app's left navigation folds
                    wait_rendered(browser, name, names, args.timeout, extra, settle=2)
                if widen and (at := browser.eval(widen)):
                    browser.drag(at[0], at[1], size[0] * 0.16)  # full run names
                    wait_rendered(browser, name, names, args.timeout, extra, settle=2)
                browser.mouse("mouseMoved", 4, size[1] - 4)
            except RenderTimeout as exc:
                shown = args.out / (Path(name).stem + ".timeout.png")
                browser.screenshot(shown)
                raise RenderTimeout(f"{exc} (what it showed: {shown})") from None
            browser.screenshot(args.out / name)
            print(f"{args.out / name}: {url}")
        print(f"{len(runs)} federated runs in experiment {args.experiment!r}: {', '.join(names)}")
    except RenderTimeout as exc:
        return fail(str(exc), 1)
    finally:
        if browser is not None:
            browser.close()
        server.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
