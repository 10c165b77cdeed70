// Drives the dashboard of a running job in headless Chromium, as a user would (playwright-core,
// Debian's chromium): waits for the checkpoint history, clicks an older checkpoint and waits for its
// trace, changes the checkpoint interval in the settings form and applies it, and takes a
// screenshot. Prints one JSON object with what it saw. Usage: node dashboard.js URL SCREENSHOT
const { chromium } = require("playwright-core");

(async () => {
  const [url, screenshot] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: process.env.CUTLINE_CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  const seen = {};
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1600 } });
    page.setDefaultTimeout(20000);
    await page.goto(url);
    await page.waitForFunction(() => document.querySelectorAll("#checkpoints tr[data-checkpoint]").length >= 3);
    seen.state = await page.textContent("#job-state");
    // An older checkpoint: its row, then its trace.
    const rows = await page.$$eval("#checkpoints tr[data-checkpoint]", (trs) => trs.map((t) => t.dataset.checkpoint));
    const older = rows[rows.length - 1];
    await page.click(`#checkpoints tr[data-checkpoint="${older}"]`);
    await page.waitForFunction((id) => document.querySelector("#trace-title").textContent.startsWith(`checkpoint ${id} `), older);
    seen.clicked = Number(older);
    seen.traceTitle = await page.textContent("#trace-title");
    seen.slowest = await page.textContent("#slowest-step");
    seen.timelineTasks = await page.$$eval("#timeline g.task-trace", (gs) => gs.map((g) => g.dataset.task));
    // Tune: a new interval, applied from the page.
    await page.fill("#set-interval", "750ms");
    await page.click("#settings-apply");
    await page.waitForFunction(() => document.querySelector("#settings-result").textContent !== "");
    seen.applied = await page.textContent("#settings-result");
    // A bad value is refused with the job's reason, shown on the page.
    await page.fill("#set-max-concurrent", "99");
    await page.click("#settings-apply");
    await page.waitForFunction(() => document.querySelector("#settings-result").className === "bad");
    seen.refused = await page.textContent("#settings-result");
    await page.screenshot({ path: screenshot, fullPage: true });
  } catch (e) {
    seen.error = String(e);
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(seen));
})();
