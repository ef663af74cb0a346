// What a researcher sees first (issue 39): `mlflow ui` on first open, the scenario's experiment
// (its description and the link to the headline view), that view, and the `snakemake --report`
// HTML report's report.md item shown inline. Playwright (playwright-core, from npm; not part of
// fedshift's Python environment) drives Debian's Chromium (`apt-get install chromium`).
//
//   npm install --prefix /tmp/pw playwright-core
//   NODE_PATH=/tmp/pw/node_modules node benchmarks/first_hour_screenshots.mjs \
//       --root PROJECT --report PROJECT/report.html --experiment rotmnist --out benchmarks/results/first_hour
//
// PROJECT holds mlflow.db and mlartifacts/ (a finished workflow) and report.html (`snakemake
// --report report.html`). Starts `mlflow server` (from PATH) on a free port, stops it at the end.
import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) =>
  a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc, []));
const root = path.resolve(args.root || ".");
const out = path.resolve(args.out || "benchmarks/results/first_hour");
const experiment = args.experiment || "rotmnist";
const chrome = args.chromium || "/usr/bin/chromium";
mkdirSync(out, { recursive: true });

const freePort = () => new Promise((ok) => { const s = createServer(); s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => ok(p)); }); });
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const server = spawn("mlflow", ["server", "--host", "127.0.0.1", "--port", String(port),
  "--backend-store-uri", `sqlite:///${root}/mlflow.db`, "--default-artifact-root", `${root}/mlartifacts`],
  { cwd: root, env: { ...process.env, MLFLOW_DISABLE_TELEMETRY: "true" }, stdio: "ignore", detached: true });
const stop = () => { try { process.kill(-server.pid); } catch {} };
process.on("exit", stop);

async function waitHealth(seconds) {
  for (let i = 0; i < seconds * 2; i++) {
    try { if ((await fetch(`${base}/health`)).ok) return; } catch {}
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`mlflow server did not answer ${base}/health in ${seconds} s`);
}

async function settle(page, text, seconds = 120) {
  // the single-page app renders a skeleton first: wait for the text, then for the page to stop changing
  if (text) await page.getByText(text, { exact: false }).first().waitFor({ timeout: seconds * 1000 });
  let last = "";
  for (let i = 0; i < 20; i++) {
    const now = await page.evaluate(() => document.body.innerText);
    if (now === last) return;
    last = now;
    await page.waitForTimeout(750);
  }
}

let browser;
try {
  await waitHealth(180);
  browser = await chromium.launch({ executablePath: chrome, args: ["--no-sandbox"] });
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });

  await page.goto(`${base}/`);  // what `mlflow ui` opens on, in a fresh profile
  await settle(page, experiment);
  await page.screenshot({ path: `${out}/mlflow_first_open.png` });
  console.log(`${out}/mlflow_first_open.png: ${base}/`);

  await page.getByText(experiment, { exact: true }).first().click();  // the scenario's experiment
  await settle(page, "Open the headline view");
  await page.screenshot({ path: `${out}/mlflow_experiment.png` });
  console.log(`${out}/mlflow_experiment.png: ${page.url()}`);

  const tip = page.getByRole("button", { name: "Got it" });  // MLflow's GenAI tip covers the page (modal)
  if (await tip.count()) await tip.first().click();
  // the description's link (MLflow opens description links in a new tab)
  const [view] = await Promise.all([page.context().waitForEvent("page"),
                                    page.getByText("Open the headline view").first().click()]);
  await view.setViewportSize({ width: 1600, height: 1000 });
  await settle(view, "table/AVG_inter");
  await view.screenshot({ path: `${out}/mlflow_headline_view.png` });
  console.log(`${out}/mlflow_headline_view.png: ${view.url()}`);

  if (args.report) {
    await page.goto(`file://${path.resolve(args.report)}`);
    // the category "report" in the left menu, then the eye icon of its report.html item
    const category = page.locator("li > a", { has: page.locator("span", { hasText: /^report$/ }) }).first();
    await category.waitFor({ timeout: 60000 });
    await category.click();
    await settle(page, "report.html");
    await page.screenshot({ path: `${out}/snakemake_report_list.png` });
    await page.getByText("report.html", { exact: true }).first().click();  // the FILE label: report.html
    await page.locator("tr", { hasText: "report" }).locator("a").first().click();  // its eye icon
    await settle(page, null);
    await page.screenshot({ path: `${out}/snakemake_report_md.png` });
    console.log(`${out}/snakemake_report_md.png: the report.html item of ${args.report}`);
  }
} finally {
  if (browser) await browser.close();
  stop();
}
