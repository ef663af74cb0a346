"""What a newcomer sees first, photographed by a real headless browser (issue 50): ``mlflow ui`` on a store made
by a tiny run, the one per-browser click that remains, the experiment's runs and headline view, and the HTML
report (``snakemake --report report.html``).

    python benchmarks/first_view_screenshots.py --root PROJECT [--experiment rotmnist] \
        [--report PROJECT/report.html] [--out benchmarks/results/first_view]

Debian's ``chromium`` (``apt-get install -y chromium``), headless, in a new throw-away profile (nothing in
localStorage: a browser that never opened MLflow), driven over the DevTools protocol by
``benchmarks/mlflow_screenshots.py``'s ``Browser`` (standard library only). Each view is captured once its text
is there and has stopped changing. Files written into ``--out``:

* ``mlflow_first_open.png``: ``/`` as MLflow opens it: its home in "GenAI" mode (MLflow's default, kept per
  browser in localStorage ``mlflow.workflowType``; the store cannot change it), the experiments with the start
  of their descriptions;
* ``mlflow_runs.png``: after the one click on the "Model training" switch (top left; remembered by the browser)
  and a click on the experiment: its runs, its description's first line with the headline link;
* ``mlflow_headline_view.png``: that link (or ``fedshift ui-url``, or the URL ``fedshift run`` prints): the
  federated runs with ``table/AVG_inter`` / ``table/AVG_intra`` first;
* ``report_html.png`` (with ``--report``): the HTML report as it opens.

Prints each file with what the page said; exits 1 naming a view that did not render in ``--timeout`` seconds
(``<view>.timeout.png`` shows what it showed), 2 when Chromium, the store or the experiment is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlflow_screenshots import Browser, RenderTimeout, ServerError, fail, find_chromium, mlflow_server  # noqa: E402

TEXT_JS = "document.body ? document.body.innerText : ''"
CLICK_JS = """((sel, text) => { const e = [...document.querySelectorAll(sel)].find(e => (e.innerText || '').trim() === text);
  if (!e) return false; e.click(); return true; })(%s, %s)"""


def wait_text(browser: Browser, view: str, needles, timeout: float, out: Path, settle: float = 3.0) -> str:
    """Poll the page's text until it holds every needle and has not changed for ``settle`` seconds."""
    deadline, last, since = time.monotonic() + timeout, None, 0.0
    while time.monotonic() < deadline:
        text = browser.eval(TEXT_JS) or ""
        if all(n in text for n in needles) and "Loading..." not in text:
            if text == last and time.monotonic() - since >= settle:
                return text
            if text != last:
                last, since = text, time.monotonic()
        else:
            last = None
        time.sleep(0.5)
    browser.screenshot(out / f"{view}.timeout.png")
    raise RenderTimeout(f"view {view!r} did not show {list(needles)} within {timeout:.0f} s "
                        f"(what it showed: {out / (view + '.timeout.png')})")


def click(browser: Browser, selector: str, text: str) -> None:
    if not browser.eval(CLICK_JS % (json.dumps(selector), json.dumps(text))):
        raise RenderTimeout(f"no {selector} reading {text!r} to click")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, required=True, help="project folder holding mlflow.db and mlartifacts/")
    ap.add_argument("--experiment", default="rotmnist", help="the federated experiment (= scenario) to open")
    ap.add_argument("--report", type=Path, default=None, help="the HTML report (snakemake --report report.html)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/first_view"))
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--size", default="1400x900")
    args = ap.parse_args(argv)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    root = args.root.resolve()
    if not (root / "mlflow.db").exists():
        return fail(f"no MLflow store {root / 'mlflow.db'}: run the workflow first")
    exe = find_chromium()
    if exe is None:
        return fail("no Chromium found: apt-get install -y chromium")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    exp = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_experiment_by_name(args.experiment)
    if exp is None:
        return fail(f"no experiment {args.experiment!r} in {root / 'mlflow.db'}")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        with mlflow_server(root) as base:
            return _photograph(Browser(exe, size), base, args)
    except ServerError as exc:
        return fail(str(exc))
    except RenderTimeout as exc:
        return fail(str(exc), 1)


def _photograph(browser: Browser, base: str, args) -> int:
    try:
        shots = []
        browser.goto(f"{base}/")
        wait_text(browser, "mlflow_first_open", [args.experiment, "Model training"], args.timeout, args.out)
        before = browser.eval("localStorage.getItem('mlflow.workflowType_v1')")
        shots.append(("mlflow_first_open.png", f"a new profile: localStorage mlflow.workflowType_v1 = {before}"))
        browser.screenshot(args.out / shots[-1][0])
        click(browser, "label,button,span,div", "Model training")  # the one per-browser click
        time.sleep(2)
        mode = browser.eval("localStorage.getItem('mlflow.workflowType_v1')")
        click(browser, "a", args.experiment)
        wait_text(browser, "mlflow_runs", ["matching runs", "Open the headline view"], args.timeout, args.out)
        shots.append(("mlflow_runs.png", f"workflow type kept by the browser: {mode}"))
        browser.screenshot(args.out / shots[-1][0])
        link = browser.eval("(() => { const a = [...document.querySelectorAll('a')].find("
                            "a => a.innerText.includes('Open the headline view')); return a ? a.href : null; })()")
        browser.goto(link)
        wait_text(browser, "mlflow_headline_view", ["table/AVG_inter", "matching runs"], args.timeout, args.out)
        shots.append(("mlflow_headline_view.png", link))
        browser.screenshot(args.out / shots[-1][0])
        if args.report:
            browser.goto(args.report.resolve().as_uri())
            wait_text(browser, "report_html", ["report"], args.timeout, args.out)
            shots.append(("report_html.png", str(args.report)))
            browser.screenshot(args.out / shots[-1][0])
        for name, note in shots:
            print(f"{args.out / name}: {note}")
    finally:
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
