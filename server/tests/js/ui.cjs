// Drives the web UI in headless Chromium (Debian's chromium, npm's
// playwright-core): loads a service's flamegraph, zooms a frame, searches
// a function, compares with the previous period, opens a trace ID and a
// span's flamegraph, opens the SVG
// export. Prints a JSON report; screenshots go to ARTIFACTS.
// Usage: node ui.cjs URL SERVICE FUNCTION SEARCH TRACE_ID ARTIFACTS JIT_SERVICE
// (JIT_SERVICE: a service whose innerLoop frame is v8js, above a native main)
"use strict";
const path = require("path");
const fs = require("fs");
const { chromium } = require("playwright-core");

const [url, service, fn, search, traceId, artifacts, jitService] = process.argv.slice(2);

// The hue (0-360) of a CSS rgb() colour.
function hue(css) {
  const [r, g, b] = css.match(/\d+(\.\d+)?/g).slice(0, 3).map((v) => Number(v) / 255);
  const max = Math.max(r, g, b), min = Math.min(r, g, b), d = max - min;
  if (d === 0) return 0;
  let h = max === r ? ((g - b) / d) % 6 : max === g ? (b - r) / d + 2 : (r - g) / d + 4;
  return Math.round(((h * 60) + 360) % 360);
}

(async () => {
  fs.mkdirSync(artifacts, { recursive: true });
  const userDataDir = fs.mkdtempSync(path.join(require("os").tmpdir(), "symtrace-chromium-"));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1400, height: 900 },
  });
  const report = {};
  const errors = [];
  try {
    const page = await context.newPage();
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
    await page.goto(url + "/?", { waitUntil: "load" });
    await page.waitForSelector(`#service option[value="${service}"]`, { state: "attached" });
    await page.selectOption("#service", service);
    await page.click("#load");
    const frame = page.locator(`.frame[data-name="${fn}"]`).first();
    await frame.waitFor();
    report.summary = await page.textContent("#summary");
    report.frames = await page.locator("#flame .frame").count();
    report.modules_hidden_when_named = await page.locator("#modules").isHidden();
    report.top = await page.locator("#top tbody tr").allTextContents();
    const before = await frame.boundingBox();
    // Hover shows file:line.
    await frame.hover();
    report.tooltip = await page.textContent("#tooltip");
    await frame.click();
    await page.waitForFunction(() => document.getElementById("zoom-label").textContent !== "");
    report.zoom_label = await page.textContent("#zoom-label");
    const after = await page.locator(`.frame[data-name="${fn}"]`).first().boundingBox();
    report.width_before = before.width;
    report.width_after = after.width;
    await page.screenshot({ path: path.join(artifacts, "ui-flamegraph-zoomed.png"), fullPage: true });
    await page.click("#reset-zoom");
    await page.fill("#search", search);
    await page.waitForFunction(() => document.getElementById("search-stats").textContent !== "");
    report.matches = await page.locator(".frame.match").count();
    report.match_names = await page.locator(".frame.match").evaluateAll((els) => els.map((e) => e.dataset.name));
    report.search_stats = await page.textContent("#search-stats");
    await page.screenshot({ path: path.join(artifacts, "ui-flamegraph-search.png"), fullPage: true });
    // The diff view: the previous period (empty) against this one.
    await page.click('.tab[data-tab="diff"]');
    await page.click("#load-diff");
    await page.waitForFunction(() => document.getElementById("diff-summary").textContent !== "");
    report.diff_summary = await page.textContent("#diff-summary");
    report.diff_frames = await page.locator("#diff .frame").evaluateAll((els) => els.map((e) => e.dataset.name));
    await page.screenshot({ path: path.join(artifacts, "ui-diff.png"), fullPage: true });
    await page.fill("#trace-id", traceId);
    await page.click("#open-trace");
    await page.waitForSelector("#spans tbody tr");
    report.spans = await page.locator("#spans tbody tr").allTextContents();
    await page.screenshot({ path: path.join(artifacts, "ui-trace.png"), fullPage: true });
    await page.locator("#spans a.span-flame").first().click();
    await page.waitForFunction(() => document.getElementById("summary").textContent.startsWith("span"));
    report.span_summary = await page.textContent("#summary");
    report.span_frames = await page.locator("#flame .frame").evaluateAll((els) => els.map((e) => e.dataset.name));
    await page.screenshot({ path: path.join(artifacts, "ui-span.png"), fullPage: true });
    // The SVG export, opened by the browser itself.
    const svgUrl = await page.getAttribute("#download-svg", "href");
    const svg = await context.newPage();
    await svg.goto(url + svgUrl, { waitUntil: "load" });
    report.svg_texts = await svg.locator("text").allTextContents();
    await svg.screenshot({ path: path.join(artifacts, "ui-svg.png") });
    // Each span's running and waiting time, and its off-CPU flamegraph.
    await page.click('.tab[data-tab="trace"]');
    report.span_time = await page.locator("#span-time tbody tr").allTextContents();
    report.split_titles = await page.locator("#span-time .split").evaluateAll((els) => els.map((e) => e.title));
    await page.locator("#span-time a.off-cpu-flame").first().click();
    await page.waitForFunction(() => document.getElementById("summary").textContent.includes("off_cpu"));
    report.off_cpu_summary = await page.textContent("#summary");
    report.off_cpu_frames = await page.locator("#flame .frame").evaluateAll((els) => els.map((e) => e.dataset.name));
    await page.screenshot({ path: path.join(artifacts, "ui-off-cpu.png"), fullPage: true });
    // Memory: the types by name, bytes in MiB, in-use as a gauge.
    await page.click('.tab[data-tab="flame"]');
    report.type_labels = await page.locator("#type option").allTextContents();
    report.gauge_hidden_for_cpu = await page.isHidden("#gauge-label");
    await page.selectOption("#type", "inuse_space:bytes::");
    report.gauge_shown_for_inuse = await page.isVisible("#gauge-label");
    await page.click("#load");
    await page.waitForFunction(() => document.getElementById("summary").textContent.includes("inuse_space"));
    report.inuse_summary = await page.textContent("#summary");
    await page.selectOption("#gauge", "average");
    await page.click("#load");
    await page.waitForFunction(() => document.getElementById("summary").textContent.includes("average"));
    report.inuse_average_summary = await page.textContent("#summary");
    await page.selectOption("#type", "alloc_objects:count::");
    await page.click("#load");
    await page.waitForFunction(() => document.getElementById("summary").textContent.includes("alloc_objects"));
    report.objects_summary = await page.textContent("#summary");
    await page.screenshot({ path: path.join(artifacts, "ui-memory.png"), fullPage: true });
    // A span's allocations from the trace view.
    await page.fill("#trace-id", traceId);
    await page.click("#open-trace");
    await page.waitForSelector("#span-time a.alloc-flame");
    report.trace_summary = await page.textContent("#trace-summary");
    await page.locator("#span-time a.alloc-flame").first().click();
    await page.waitForFunction(() => document.getElementById("summary").textContent.includes("alloc_space"));
    report.alloc_span_summary = await page.textContent("#summary");
    report.status_text = await page.textContent("#status");
    // Frames by type: a JIT (v8js) frame in its own colours, its type and
    // file:line in the tooltip.
    await page.selectOption("#type", "samples:count:cpu:nanoseconds");
    await page.selectOption("#service", jitService);
    await page.click("#load");
    const jit = page.locator('#flame .frame[data-name="innerLoop"]').first();
    await jit.waitFor();
    report.jit_kind = await jit.getAttribute("data-kind");
    report.jit_hue = hue(await jit.evaluate((e) => getComputedStyle(e).backgroundColor));
    report.native_kind = await page.locator('#flame .frame[data-name="main"]').first().getAttribute("data-kind");
    report.native_hue = hue(await page.locator('#flame .frame[data-name="main"]').first()
      .evaluate((e) => getComputedStyle(e).backgroundColor));
    await jit.hover();
    report.jit_tooltip = await page.textContent("#tooltip");
    // The module nothing names, and why.
    report.modules = await page.textContent("#modules");
    await page.screenshot({ path: path.join(artifacts, "ui-jit.png"), fullPage: true });
  } finally {
    report.errors = errors;
    await context.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  }
  console.log(JSON.stringify(report));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
