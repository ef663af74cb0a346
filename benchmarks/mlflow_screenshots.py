"""Screenshots of `mlflow ui` comparing methods, taken by a real headless browser.

    python benchmarks/mlflow_screenshots.py [--root .] [--experiment rotmnist] [--out benchmarks/out/mlflow]

Starts ``mlflow ui`` on a free local port over ``<root>/mlflow.db`` (artifacts under
``<root>/mlartifacts``), then opens three views in headless Chromium (Debian's
``chromium`` package) and saves a PNG of each:

* ``runs.png``: the experiment's runs table (run names ``<method> <structure> <scenario>+<public> s<seed>``);
* ``charts.png``: the chart view comparing every run's metrics (headline ``table/AVG_inter``,
  accuracy per round, phase times);
* ``compare.png``: MLflow's run comparison page over the experiment's federated runs
  (params, metrics side by side, parallel coordinates).

Prints the URLs and the files written; exits 2 with one line when Chromium, the store or
the experiment is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise SystemExit("mlflow_screenshots: error: no Chromium found: apt-get install chromium")


def screenshot(browser: str, url: str, out: Path, size=(1600, 1000), wait_ms: int = 60000) -> None:
    """Headless screenshot after ``wait_ms`` of real time (the single-page app fetches and
    renders first; `--virtual-time-budget` never ends on MLflow's polling UI). On a loaded
    machine raise ``--wait``: a grey skeleton in the PNG means the UI had not rendered yet."""
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={size[0]},{size[1]}", f"--timeout={wait_ms}", f"--screenshot={out}", url]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=wait_ms / 1000 + 300)
    if not out.exists():
        raise SystemExit(f"mlflow_screenshots: error: Chromium wrote no {out}: {res.stderr[-500:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="folder holding mlflow.db and mlartifacts/")
    ap.add_argument("--experiment", default="rotmnist", help="MLflow experiment (= scenario)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/mlflow"))
    ap.add_argument("--wait", type=float, default=60, help="seconds each page gets to render")
    args = ap.parse_args(argv)
    db = (args.root / "mlflow.db").resolve()
    if not db.exists():
        print(f"mlflow_screenshots: error: no MLflow store {db}: run the workflow first", file=sys.stderr)
        return 2
    browser = chromium()
    uri = f"sqlite:///{db}"
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        print(f"mlflow_screenshots: error: no experiment {args.experiment!r} (has: {', '.join(names)})", file=sys.stderr)
        return 2
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`fedshift.kind` = 'federate'", max_results=50)
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true")
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                               "--default-artifact-root", (args.root / "mlartifacts").resolve().as_uri(),
                               "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            print("mlflow_screenshots: error: mlflow ui did not answer within 120 s", file=sys.stderr)
            return 2
        eid = exp.experiment_id
        ids = [r.info.run_id for r in runs]
        views = {
            "runs.png": f"{base}/#/experiments/{eid}",
            "charts.png": f"{base}/#/experiments/{eid}?compareRunsMode=CHART",
            "compare.png": f"{base}/#/compare-runs?runs={urllib.parse.quote(json.dumps(ids))}"
                           f"&experiments={urllib.parse.quote(json.dumps([eid]))}",
        }
        for name, url in views.items():
            screenshot(browser, url, args.out / name, size=(1600, 1400 if name == "compare.png" else 1000),
                       wait_ms=int(args.wait * 1000))
            print(f"{args.out / name}: {url}")
        print(f"{len(runs)} federated runs in experiment {args.experiment!r}: "
              + ", ".join(sorted(r.info.run_name for r in runs)))
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
