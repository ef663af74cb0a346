// The report as a reader sees it (issue 50): `snakemake --report`'s HTML report with the report.html item
// shown inline (its figures inside the page), and the report folder's report.html itself, whole.
// Playwright (playwright-core, from npm; not part of fedshift's Python environment) drives Debian's
// Chromium (`apt-get install chromium`), as benchmarks/first_hour_screenshots.mjs does.
//
//   npm install --prefix /tmp/pw playwright-core
//   NODE_PATH=/tmp/pw/node_modules node benchmarks/report_screenshots.mjs \
//       --report PROJECT/report.html --page PROJECT/results/report/report.html --out benchmarks/results/report
import { mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) =>
  a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc, []));
const out = path.resolve(args.out || "benchmarks/results/report");
mkdirSync(out, { recursive: true });

async function settle(page) {
  let last = "";
  for (let i = 0; i < 20; i++) {
    const now = await page.evaluate(() => document.body.innerText);
    if (now === last) return;
    last = now;
    await page.waitForTimeout(750);
  }
}

const browser = await chromium.launch({ executablePath: args.chromium || "/usr/bin/chromium", args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1600, height: 1100 } });
  if (args.report) {
    await page.goto(`file://${path.resolve(args.report)}`);
    // the category "report" in the left menu, then the eye icon of its report.html item
    const category = page.locator("li > a", { has: page.locator("span", { hasText: /^report$/ }) }).first();
    await category.waitFor({ timeout: 60000 });
    await category.click();
    await settle(page);
    await page.getByText("report.html", { exact: true }).first().click();  // the FILE label: report.html
    await page.locator("tr", { hasText: "report" }).locator("a").first().click();  // its eye icon
    await settle(page);
    await page.screenshot({ path: `${out}/snakemake_report_inline.png` });
    console.log(`${out}/snakemake_report_inline.png: the report.html item of ${args.report}`);
  }
  if (args.page) {
    await page.goto(`file://${path.resolve(args.page)}`);
    await settle(page);
    await page.screenshot({ path: `${out}/report_html_full.png`, fullPage: true });
    console.log(`${out}/report_html_full.png: ${args.page}, the whole page`);
    const section = page.getByText("Comparison:", { exact: false }).first();
    if (await section.count()) {
      await section.scrollIntoViewIfNeeded();
      await page.evaluate(() => window.scrollBy(0, -20));
      await page.screenshot({ path: `${out}/report_html_comparison.png` });
      console.log(`${out}/report_html_comparison.png: its comparison section`);
    }
  }
} finally {
  await browser.close();
}
