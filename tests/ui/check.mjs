// The dashboard in a real browser: Debian's chromium driven by playwright-core (installed by
// tests/run into $UI_NODE_MODULES). Run by tests/python/test_dashboard.py and
// test_real_engines.py, which start Switchyard and the engines, and by tests/bench/dashboard:
//
//   node tests/ui/check.mjs '{"mode": "real" | "release" | "managed" | "measure" | "fleet", "admin": URL,
//                             "client": URL, "token": TOKEN, "out": DIR, "release": ID?,
//                             "reason": TEXT?, "backend": NAME?}'
//
// It reads what the page shows and prints one JSON object on stdout, for the Python test to
// judge against the admin API's own answers; it fails (exit 1) only when the page does not get
// as far as showing something. Screenshots of each view go to DIR.

import { createRequire } from "node:module";
import path from "node:path";

const config = JSON.parse(process.argv[2]);
const modules = process.env.UI_NODE_MODULES;
const executablePath = process.env.UI_CHROMIUM;
if (!modules || !executablePath) {
  console.error("check.mjs: UI_NODE_MODULES and UI_CHROMIUM must be set (tests/run sets them)");
  process.exit(2);
}
const { chromium } = createRequire(path.join(modules, "noop.js"))("playwright-core");

// Longest wait for the page to show something it should (the engines on this CPU are slow, but
// everything the page draws is already in the ledger when this runs).
const WAIT_MS = 20000;
const result = { mode: config.mode, screenshots: [], console: [], page_errors: [] };

function watch(page, into) {
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") into.push({ type: m.type(), text: m.text(), url: m.location().url });
  });
  page.on("pageerror", (e) => result.page_errors.push(String(e)));
}

async function shot(page, name) {
  const file = path.join(config.out, `dashboard-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  result.screenshots.push(file);
}

async function view(page, name) {
  // Wait for this view to finish drawing after its tab is chosen.
  const before = await page.evaluate((n) => document.getElementById("view-" + n)?.dataset.loaded || "", name);
  await page.click(`#tab-${name}`);
  await page.waitForFunction(([n, b]) => {
    const el = document.getElementById("view-" + n);
    return el && !el.hidden && el.dataset.loaded && el.dataset.loaded !== b;
  }, [name, before], { timeout: WAIT_MS });
  return page.evaluate((n) => document.querySelector(`#view-${n} .error`).textContent, name);
}

// The login form: the page answers 401 with it; a wrong token is refused; the right one opens
// the dashboard. A token kept in sessionStorage only.
async function login(browser) {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const page = await context.newPage();
  const messages = [];
  watch(page, messages);
  const response = await page.goto(config.admin + "/ui");
  const out = { status: response.status() };
  await page.waitForSelector("#login:not([hidden])", { timeout: WAIT_MS });
  await shot(page, "login");
  await page.fill("#login-token", "sya_wrong");
  await page.click("#login-submit");
  await page.waitForFunction(() => document.getElementById("login-error").textContent.includes("refused"), null, { timeout: WAIT_MS });
  out.refused_message = await page.textContent("#login-error");
  await page.fill("#login-token", config.token);
  await page.click("#login-submit");
  await page.waitForSelector("#app:not([hidden]) #view-models[data-loaded]", { timeout: WAIT_MS });
  out.opened = true;
  out.stored = await page.evaluate(() => ({ session: !!sessionStorage.getItem("switchyard-admin-token"), local: localStorage.length }));
  out.console = messages;
  await context.close();
  return out;
}

// Shadow: the comparator's groups, their verdicts, and a mismatch's two outputs.
async function shadow(page) {
  const error = await view(page, "shadow");
  result.rollups = await page.$$eval("tr.rollup", (rows) => rows.map((row) => ({
    model: row.dataset.model,
    candidate: row.dataset.candidate,
    pairs: Number(row.dataset.pairs),
    verdict: row.querySelector(".verdict-line").textContent,
    counts: Object.fromEntries([...row.querySelectorAll("td[data-verdict]")].map((td) => [td.dataset.verdict, Number(td.textContent)])),
  })));
  result.comparisons = await page.$$eval("article.comparison", (els) => els.map((el) => ({
    status: el.dataset.status,
    title: el.querySelector("h3").textContent,
    verdicts: [...el.querySelectorAll(".verdict")].map((v) => v.textContent),
    side_by_side: [...el.querySelectorAll(".side-by-side pre")].map((pre) => pre.textContent),
    ratios: !!el.querySelector(".ratios"),
  })));
  // Pairs judged token by token that parted: each side's choice and its likeliest tokens.
  result.parted = await page.$$eval("article.divergence", (els) => els.map((el) => ({
    verdict: el.dataset.verdict,
    request: el.dataset.request,
    title: el.querySelector("h3").textContent,
    prefix: el.querySelector("q.prefix").textContent,
    sides: [...el.querySelectorAll(".output")].map((side) => ({
      side: side.dataset.side,
      chose: side.querySelector("h4").textContent,
      top: [...side.querySelectorAll("table.top tr")].map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent)),
      chosen: [...side.querySelectorAll("table.top tr.chosen td code")].map((c) => c.textContent),
    })),
  })));
  await shot(page, "shadow");
  return error;
}

// The model overview: each model's row, with its backends by role and their states.
async function models(page) {
  const error = await view(page, "models");
  result.models = await page.$$eval("tr.model", (rows) => rows.map((row) => ({
    model: row.dataset.model,
    state: row.querySelector("td .badge").textContent,
    requests: row.querySelector(".requests").textContent,
    roles: [...row.querySelectorAll("li.role")].map((li) => ({ backend: li.dataset.backend, role: li.dataset.role, state: li.dataset.state })),
  })));
  await shot(page, "models");
  return error;
}

// The engine cards: name, state and what the card shows.
async function engines(page) {
  return page.$$eval("article.engine", (els) => els.map((el) => ({
    backend: el.dataset.backend,
    state: el.dataset.state,
    badge: el.querySelector("h2 .badge").textContent,
    engine: el.querySelector(".engine-build").textContent,
    engine_title: el.querySelector(".engine-build").getAttribute("title"),
    artifact: el.querySelector(".artifact").getAttribute("title"),
    shown: el.querySelector(".artifact").textContent,
    load: el.querySelector(".load").textContent,
    buttons: [...el.querySelectorAll(".actions button")].map((b) => b.dataset.action),
  })));
}

// Presses an engine card's button, gives the reason, and waits for the card to reach `until`.
async function engineAction(page, backend, action, until) {
  const card = `article.engine[data-backend="${backend}"]`;
  await page.click(`${card} button[data-action=${action}]`);
  await page.waitForSelector("#reason-dialog[open]", { timeout: WAIT_MS });
  await page.fill("#reason-dialog textarea", `${action} from the browser test`);
  await page.click("#reason-dialog .confirm");
  await page.waitForSelector(`${card}[data-state="${until}"]`, { timeout: 3 * WAIT_MS });
  return page.textContent(card);
}

// A managed engine: shown stopped before any request, loaded and unloaded from its card.
async function managed(page) {
  const errors = {};
  errors.models = await models(page);
  errors.engines = await view(page, "engines");
  result.engines_before = await engines(page);
  await shot(page, "engines-stopped");
  result.after_load = await engineAction(page, config.backend, "load", "ready");
  result.engines_loaded = await engines(page);
  await shot(page, "engines-loaded");
  result.after_unload = await engineAction(page, config.backend, "unload", "stopped");
  result.engines_unloaded = await engines(page);
  await page.click(`article.engine[data-backend="${config.backend}"] details.history summary`);
  result.history = await page.textContent(`article.engine[data-backend="${config.backend}"] details.history`);
  await shot(page, "engines-unloaded");
  result.view_errors = errors;
}

// A pool: the overview lists every member as a primary, each member's card names its pool and
// its state there (and what the detectors found, with the baseline), and the live tail names the
// pool and the placement beside the member.
async function pooled(page) {
  const errors = {};
  errors.models = await models(page);
  errors.engines = await view(page, "engines");
  result.pool_cards = await page.$$eval("article.engine", (els) => els.map((el) => ({
    backend: el.dataset.backend,
    pool: el.querySelector("dd.pool") ? el.querySelector("dd.pool").textContent : null,
    pool_state: el.querySelector("dd.pool") ? el.querySelector("dd.pool").dataset.poolState : null,
    degraded: el.querySelector("dd.degraded") ? el.querySelector("dd.degraded").textContent : null,
    baseline: el.querySelector("dd.baseline") ? el.querySelector("dd.baseline").textContent : null,
  })));
  await shot(page, "engines-pool");
  errors.live = await view(page, "live");
  result.tail_backends = await page.$$eval("#tail-rows td.backend", (cells) => cells.map((c) => c.textContent));
  await shot(page, "live-pool");
  result.view_errors = errors;
}

async function real(page) {
  const errors = {};
  errors.models = await models(page);
  // Engines: each backend with its build, artifact digest and verification.
  errors.engines = await view(page, "engines");
  result.engines = await engines(page);
  await shot(page, "engines");

  // Where the time goes: the stacked bars, as drawn (their width on screen).
  errors.time = await view(page, "time");
  result.bars = await page.$$eval(".bar-row", (rows) => rows.map((row) => ({
    group: row.dataset.group,
    total: Number(row.dataset.totalMs),
    width: row.querySelector(".bar").getBoundingClientRect().width,
    segments: [...row.querySelectorAll(".seg")].map((s) => ({
      phase: s.dataset.phase, ms: Number(s.dataset.ms), width: s.getBoundingClientRect().width,
    })),
  })));
  result.charts = await page.$$eval("figure.dist canvas", (c) => c.length);
  await shot(page, "time");

  errors.shadow = await shadow(page);

  // Releases: each card with its transitions; evaluations hidden until asked for.
  errors.releases = await view(page, "releases");
  result.releases = await page.$$eval("article.release", (els) => els.map((el) => ({
    id: el.dataset.release,
    state: el.dataset.state,
    weight: el.querySelector(".weight").textContent,
    events: el.querySelectorAll(".log li.event").length,
    evaluations: el.querySelectorAll(".log li.evaluation").length,
  })));
  await shot(page, "releases");

  // Live tail: the latest requests, then one more arriving through the event stream.
  errors.live = await view(page, "live");
  await page.waitForSelector("#stream-state.ready", { timeout: WAIT_MS });
  result.tail_rows = await page.$$eval("#tail-rows tr", (rows) => rows.length);
  const id = "ui-live-" + Date.now();
  const answer = await fetch(config.client + "/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json", "x-request-id": id },
    body: JSON.stringify({ model: config.model, max_tokens: 4, temperature: 0, messages: [{ role: "user", content: "Say hi." }] }),
  });
  result.live_status = answer.status;
  await page.waitForSelector(`#tail-rows tr[data-request="${id}"]`, { timeout: WAIT_MS });
  result.live_row = await page.textContent(`#tail-rows tr[data-request="${id}"]`);
  await shot(page, "live");
  // Filtered by variant: only shadow rows.
  await page.fill("#filter-variant", "shadow");
  await page.click(".filters button[type=submit]");
  await page.waitForFunction(() => [...document.querySelectorAll("#tail-rows tr td:nth-child(5)")].every((td) => td.textContent === "shadow"), null, { timeout: WAIT_MS });
  result.filtered_variants = await page.$$eval("#tail-rows tr td:nth-child(5)", (tds) => [...new Set(tds.map((td) => td.textContent))]);
  result.view_errors = errors;
}

async function release(page) {
  const errors = {};
  errors.releases = await view(page, "releases");
  const card = `article.release[data-release="${config.release}"]`;
  await page.waitForSelector(card, { timeout: WAIT_MS });
  result.before = { state: await page.getAttribute(card, "data-state"), weight: await page.textContent(`${card} .weight`) };
  // Transitions only, until every evaluation is asked for.
  result.log_by_default = {
    events: await page.$$eval(`${card} .log li.event`, (lis) => lis.length),
    evaluations: await page.$$eval(`${card} .log li.evaluation`, (lis) => lis.length),
  };
  await shot(page, "release-running");
  await page.click("#show-evaluations");
  await page.waitForSelector(`${card} .log li.evaluation`, { timeout: WAIT_MS });
  result.log_with_evaluations = await page.$$eval(`${card} .log li.evaluation`, (lis) => lis.length);
  await page.click("#show-evaluations");
  await page.waitForFunction((c) => !document.querySelector(`${c} .log li.evaluation`), card, { timeout: WAIT_MS });
  await page.click(`${card} button[data-action=abort]`);
  await page.waitForSelector("#reason-dialog[open]", { timeout: WAIT_MS });
  // An empty reason is refused by the page before anything is sent.
  await page.click("#reason-dialog .confirm");
  result.empty_reason_message = await page.textContent("#reason-dialog .error");
  await page.fill("#reason-dialog textarea", config.reason);
  await page.click("#reason-dialog .confirm");
  await page.waitForSelector(`${card}[data-state=aborted]`, { timeout: WAIT_MS });
  result.after = {
    state: await page.getAttribute(card, "data-state"),
    weight: await page.textContent(`${card} .weight`),
    log: await page.$$eval(`${card} .log li.event`, (lis) => lis.map((li) => li.textContent)),
  };
  await shot(page, "release-aborted");
  errors.shadow = await shadow(page);
  result.view_errors = errors;
}

// How long each view takes to draw, the window set to config.window (tests/bench/dashboard).
async function measure(page) {
  result.views = {};
  await page.selectOption("#window", config.window);
  for (const v of ["time", "shadow", "releases", "live", "engines", "models"]) {
    const started = Date.now();
    const error = await view(page, v);
    result.views[v] = { ms: Date.now() - started, error };
  }
  result.tail_rows = await page.$$eval("#tail-rows tr", (rows) => rows.length).catch(() => null);
  result.bars = await page.$$eval(".bar-row", (rows) => rows.length).catch(() => null);
}

// The fleet on the shared ledger, as the models view says it above its table: the running
// instances, and those configured otherwise than this one.
async function fleet(page) {
  await page.waitForSelector("#view-models .fleet", { timeout: WAIT_MS });
  result.fleet = await page.$eval("#view-models .fleet", (el) => ({
    running: Number(el.dataset.running),
    drift: Number(el.dataset.drift),
    instances: [...el.querySelectorAll("p:first-child .instance")].map((i) => i.dataset.instance),
    drifted: [...el.querySelectorAll(".drift .instance")].map((i) => i.dataset.instance),
    text: el.textContent,
  }));
  // The figures are the fleet's: the requests of every instance, each row of the tail naming
  // the instance that served it.
  result.fleet.figures_from = await page.textContent("#view-models .figures-from").catch(() => null);
  result.fleet.requests = await page.$$eval("#view-models tr.model", (rows) =>
    Object.fromEntries(rows.map((r) => [r.dataset.model, r.querySelector("td.requests").textContent])));
  await shot(page, "fleet");
  result.fleet.tail_error = await view(page, "live");
  result.fleet.tail_instances = await page.$$eval("#tail-rows small.instance", (tags) =>
    [...new Set(tags.map((t) => t.textContent.trim()))].sort());
  // The releases view says which instance evaluates the fleet's releases.
  result.fleet.releases_error = await view(page, "releases");
  result.fleet.evaluator = await page.textContent("#view-releases .evaluator").catch(() => null);
}

const browser = await chromium.launch({ executablePath, args: ["--no-sandbox"] });
let failed = null;
try {
  result.login = await login(browser);
  // As behind a reverse proxy that adds the token: every request carries it, the page included.
  const context = await browser.newContext({
    viewport: { width: 1400, height: 900 },
    extraHTTPHeaders: { authorization: "Bearer " + config.token },
  });
  const page = await context.newPage();
  watch(page, result.console);
  const started = Date.now();
  const response = await page.goto(config.admin + "/ui");
  result.page_status = response.status();
  await page.waitForSelector("#view-models[data-loaded]", { timeout: WAIT_MS });
  result.first_view_ms = Date.now() - started;
  if (config.mode === "real") await real(page);
  else if (config.mode === "managed") await managed(page);
  else if (config.mode === "pool") await pooled(page);
  else if (config.mode === "measure") await measure(page);
  else if (config.mode === "fleet") await fleet(page);
  else await release(page);
  await context.close();
} catch (err) {
  failed = err;
  result.failure = String(err && err.stack || err);
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(result) + "\n");
process.exit(failed ? 1 : 0);
