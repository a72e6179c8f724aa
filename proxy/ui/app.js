// The Switchyard dashboard. It holds no data of its own: every view is drawn from the admin
// API's JSON (the same answers scripts read), and the live tail from its event stream.
(() => {
  "use strict";

  const auth = window.switchyardAuth;
  const VIEWS = ["engines", "time", "shadow", "releases", "live"];
  const PHASE_COLORS = { queue: "#8c6bb1", load: "#e08214", ttfb: "#4393c3", prefill: "#5aae61", decode: "#d6604d" };
  const TAIL_MAX = 200;
  const REFRESH_MS = 5000;

  // --- helpers ---------------------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "style") el.setAttribute("style", v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  async function api(path, options) {
    const init = Object.assign({ cache: "no-store" }, options || {});
    init.headers = Object.assign({}, auth.headers(), init.headers || {});
    const r = await fetch(path, init);
    const body = await r.json().catch(() => ({}));
    if (r.status === 401) { auth.signOut(); throw new Error("signed out"); }
    if (!r.ok) throw new Error((body.error && body.error.message) || r.status + " " + path);
    return body;
  }

  const ms = (v) => (v === null || v === undefined ? "–" : v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(1) + " ms");
  const num = (v, d = 1) => (v === null || v === undefined ? "–" : Number(v).toFixed(d));
  const short = (digest) => {
    if (!digest) return "–";
    const i = digest.indexOf("sha256:");
    return i >= 0 && digest.length > i + 19 ? digest.slice(0, i + 19) + "…" : digest;
  };
  const time = (tsMs) => new Date(tsMs).toLocaleTimeString();
  const when = (tsMs) => new Date(tsMs).toLocaleString();
  const badge = (text, kind) => h("span", { class: "badge " + (kind || text) }, text);
  const windowParam = () => document.getElementById("window").value;

  function setError(view, err) {
    const box = document.querySelector(`#view-${view} .error`);
    if (box) box.textContent = err ? String(err.message || err) : "";
  }

  // --- layout ----------------------------------------------------------------------------------

  const app = document.getElementById("app");
  app.hidden = false;
  app.append(
    h("header", {},
      h("h1", {}, "Switchyard"),
      h("nav", {}, VIEWS.map((v) => h("a", { href: "#" + v, id: "tab-" + v, "data-view": v }, {
        engines: "Engines", time: "Where the time goes", shadow: "Shadow", releases: "Releases", live: "Live tail",
      }[v]))),
      h("label", { class: "window" }, "window ",
        h("select", { id: "window", onchange: () => refresh() },
          ["15m", "1h", "6h", "24h", "7d"].map((w) => h("option", { value: w, selected: w === "1h" }, w)))),
      h("button", { class: "signout", onclick: () => auth.signOut() }, "Sign out")),
    h("main", {}, VIEWS.map((v) => h("section", { id: "view-" + v, class: "view", hidden: true },
      h("p", { class: "error", role: "alert" }), h("div", { class: "body" })))),
  );

  function current() {
    const v = location.hash.slice(1);
    return VIEWS.includes(v) ? v : "engines";
  }

  function show() {
    const view = current();
    for (const v of VIEWS) {
      document.getElementById("view-" + v).hidden = v !== view;
      document.getElementById("tab-" + v).classList.toggle("active", v === view);
    }
    refresh();
  }
  window.addEventListener("hashchange", show);

  const body = (view) => document.querySelector(`#view-${view} .body`);

  // --- engines ---------------------------------------------------------------------------------

  async function drawEngines() {
    const [backends, history] = await Promise.all([
      api("/admin/backends"),
      api("/admin/identities?limit=10&window=" + windowParam()),
    ]);
    const rows = Object.entries(backends.backends).map(([name, b]) => {
      const m = b.managed;
      const past = (history.backends[name] || []).map((s) =>
        h("li", {}, time(s.ts_ms), " ", badge(s.health), " ", badge(s.verification), s.note ? " " + s.note : ""));
      return h("article", { class: "engine", "data-backend": name },
        h("h2", {}, name, " ", badge(b.state), b.reason ? h("span", { class: "reason" }, b.reason) : null),
        h("dl", {},
          h("dt", {}, "engine"), h("dd", { class: "engine-build" }, b.engine || "unknown", b.build_note ? h("span", { class: "note" }, " " + b.build_note) : null),
          h("dt", {}, "artifact"), h("dd", { class: "artifact", title: b.artifact }, short(b.artifact), " ", badge(b.identity),
            b.identity_note ? h("span", { class: "note" }, " " + b.identity_note) : null),
          h("dt", {}, "served model"), h("dd", {}, b.served_model || "–"),
          h("dt", {}, "in flight"), h("dd", { class: "in-flight" }, b.in_flight),
          h("dt", {}, "queued"), h("dd", { class: "queued" }, b.waiting),
          h("dt", {}, "free slots"), h("dd", {}, b.free_slots ?? "–"),
          h("dt", {}, "url"), h("dd", {}, b.url),
          m ? [
            h("dt", {}, "managed"), h("dd", { class: "managed" }, badge(m.state), " pid ", m.pid ?? "–",
              ", last load ", m.last_load_ms == null ? "–" : ms(m.last_load_ms),
              ", resident ", m.resident_ms == null ? "–" : ms(m.resident_ms),
              ", starts ", m.starts, ", crashes ", m.crashes, m.reason ? " (" + m.reason + ")" : ""),
          ] : null),
        h("details", { class: "history" }, h("summary", {}, `health history (${past.length} changes in ${windowParam()})`),
          past.length ? h("ul", {}, past) : h("p", {}, "no change recorded in this window")));
    });
    body("engines").replaceChildren(h("p", { class: "digest" }, "configuration ", short(backends.config_digest)), ...rows);
  }

  // --- where the time goes ---------------------------------------------------------------------

  const charts = [];

  function histogram(title, dist, unit) {
    const box = h("figure", { class: "dist" }, h("figcaption", {}, title));
    if (!dist) { box.append(h("p", { class: "none" }, "none in this window")); return box; }
    box.append(h("p", { class: "quantiles" }, `n=${dist.n} · p50 ${num(dist.p50)} · p90 ${num(dist.p90)} · p99 ${num(dist.p99)} ${unit}`));
    const xs = dist.bins.map((b) => (b.from + b.to) / 2);
    const ys = dist.bins.map((b) => b.count);
    const target = h("div", { class: "plot" });
    box.append(target);
    if (window.uPlot) {
      const plot = new uPlot({
        width: 300, height: 120, legend: { show: false }, cursor: { show: false },
        scales: { x: { time: false } },
        axes: [{ size: 30 }, { size: 35 }],
        series: [{}, { label: "count", stroke: "#4393c3", fill: "rgba(67,147,195,.4)", paths: uPlot.paths.bars({ size: [0.9, 40] }) }],
      }, [xs, ys], target);
      charts.push(plot);
    }
    return box;
  }

  async function drawTime() {
    const stats = await api("/admin/stats/phases?window=" + windowParam());
    while (charts.length) charts.pop().destroy();
    const groups = stats.groups.filter((g) => g.requests > g.errors);
    const max = Math.max(1, ...groups.map((g) => stats.phases.reduce((s, p) => s + (g.phases[p] ? g.phases[p].mean_ms : 0), 0)));
    const legend = h("p", { class: "legend" }, stats.phases.map((p) => h("span", {}, h("i", { style: `background:${PHASE_COLORS[p]}` }), p)),
      " — mean per answered request; a phase no request had is left out, never zero. ttfb includes the engine's prefill.");
    const bars = groups.map((g) => {
      const label = `${g.model} · ${g.backend} · ${g.variant} · ${g.warmth}`;
      return h("div", { class: "bar-row", "data-group": label },
        h("span", { class: "bar-label" }, label, h("small", {}, ` ${g.requests} req, ${g.errors} err`)),
        h("span", { class: "bar" }, stats.phases.filter((p) => g.phases[p]).map((p) =>
          h("i", {
            class: "seg " + p, "data-phase": p, "data-ms": g.phases[p].mean_ms.toFixed(3),
            title: `${p}: ${ms(g.phases[p].mean_ms)} (n=${g.phases[p].n})`,
            style: `width:${(100 * g.phases[p].mean_ms / max).toFixed(3)}%;background:${PHASE_COLORS[p]}`,
          }))));
    });
    const dists = groups.map((g) => h("article", { class: "group" },
      h("h3", {}, `${g.model} · ${g.backend} · ${g.variant} · `, badge(g.warmth)),
      h("div", { class: "dists" },
        histogram("ttft (ms)", g.ttft_ms, "ms"),
        histogram("decode tok/s — engine-reported", g.decode_tok_s.engine, "tok/s"),
        histogram("decode tok/s — measured by Switchyard", g.decode_tok_s.measured, "tok/s"),
        histogram("prefill tok/s — engine-reported", g.prefill_tok_s.engine, "tok/s"),
        histogram("prefill tok/s — measured by Switchyard", g.prefill_tok_s.measured, "tok/s"))));
    body("time").replaceChildren(
      h("h2", {}, "Phases per model and backend, cold and warm apart"), legend,
      groups.length ? h("div", { class: "bars" }, bars) : h("p", {}, "no answered requests in this window"),
      h("h2", {}, "Distributions"), ...dists);
  }

  // --- shadow ----------------------------------------------------------------------------------

  async function drawShadow() {
    const data = await api("/admin/comparisons?window=" + windowParam());
    const groups = data.groups.map((g) => {
      const verdicts = ["match", "mismatch", "candidate_error", "incomparable"].filter((k) => g.counts[k] > 0)
        .map((k) => h("span", { class: "verdict " + k, "data-verdict": k }, `${k.replace("_", "-")} ${g.counts[k]}`));
      const side = (title, s) => h("div", { class: "output" }, h("h4", {}, title, " ", h("code", {}, short(s.output))),
        h("pre", {}, s.text == null ? "(text not kept)" : s.text));
      return h("article", { class: "comparison", "data-status": g.status },
        h("h3", {}, g.model, " · ", g.primary.backend, " → ", g.candidate.backend, " ", badge(g.warm ? "warm" : "cold"),
          " ", h("small", {}, `${g.mode}, ${g.streamed ? "stream" : "whole"}, workload ${short(g.workload)}`)),
        h("p", {}, `${g.counts.pairs} pairs: `, verdicts, " ", badge(g.status, "status " + g.status)),
        h("p", { class: "detail" }, g.detail),
        // Ratios only where the comparator gives them: never beside a mismatch.
        g.ratios ? h("p", { class: "ratios" }, "candidate / primary: ",
          Object.entries(g.ratios).filter(([, r]) => r).map(([k, r]) => `${k} ${num(r.median, 2)} (n=${r.n}) `)) : null,
        g.mismatch ? h("div", { class: "side-by-side" }, side("primary " + g.primary.backend, g.mismatch.primary),
          side("candidate " + g.candidate.backend, g.mismatch.candidate)) : null);
    });
    body("shadow").replaceChildren(h("p", {}, `Groups of shadow pairs in ${windowParam()}; a group needs ${data.min_repetitions} repetitions for ratios.`),
      ...(groups.length ? groups : [h("p", {}, "no comparisons in this window")]));
  }

  // --- releases --------------------------------------------------------------------------------

  const ACTIONS = ["promote", "pause", "resume", "abort", "undo"];

  function ask(release, action) {
    const dialog = document.getElementById("reason-dialog");
    dialog.querySelector(".what").textContent = `${action} release ${release.id} (${release.model}: ${release.primary} → ${release.candidate})`;
    dialog.querySelector("textarea").value = "";
    dialog.querySelector(".error").textContent = "";
    dialog.dataset.release = release.id;
    dialog.dataset.action = action;
    dialog.showModal();
  }

  async function act(event) {
    event.preventDefault();
    const dialog = document.getElementById("reason-dialog");
    const reason = dialog.querySelector("textarea").value.trim();
    if (!reason) { dialog.querySelector(".error").textContent = "every action needs a reason"; return; }
    try {
      await api(`/admin/releases/${encodeURIComponent(dialog.dataset.release)}/${dialog.dataset.action}`, {
        method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ reason }),
      });
      dialog.close();
      refresh();
    } catch (err) {
      dialog.querySelector(".error").textContent = err.message;
    }
  }

  async function drawReleases() {
    let list;
    try {
      list = await api("/admin/releases");
    } catch (err) {
      body("releases").replaceChildren(h("p", {}, err.message));
      return;
    }
    const details = await Promise.all(list.releases.map((r) => api("/admin/releases/" + encodeURIComponent(r.id))));
    const cards = details.map(({ release: r, events, evaluations }) => {
      const steps = (r.steps || []).map((s, i) => h("li", { class: i === r.step ? "current" : i < r.step ? "done" : "" }, s));
      const log = [
        ...events.map((e) => ({ ts: e.ts_ms, el: h("li", { class: "event" }, time(e.ts_ms), " ", h("b", {}, e.actor), `: ${e.from_state || "–"} → ${e.to_state}`,
          e.from_step !== e.to_step ? ` (step ${e.from_step ?? "–"} → ${e.to_step})` : "", " — ", h("q", { class: "reason" }, e.reason)) })),
        ...evaluations.map((e) => ({ ts: e.ts_ms, el: h("li", { class: "evaluation" }, time(e.ts_ms), " evaluation of step ", e.step, ": ", badge(e.decision),
          e.reason ? " — " + e.reason : "", h("details", {}, h("summary", {}, "evidence"), h("pre", {}, JSON.stringify(e.evidence, null, 2)))) })),
      ].sort((a, b) => b.ts - a.ts).map((x) => x.el);
      return h("article", { class: "release", "data-release": r.id, "data-state": r.state },
        h("h3", {}, r.model, ": ", r.primary, " → ", r.candidate, " ", badge(r.state), h("small", {}, ` ${r.id} · plan ${r.plan} · started ${when(r.created_ms)}`)),
        h("p", {}, "weight ", h("b", { class: "weight" }, r.weight + "%"), " · step ", r.step, r.step_label ? ` (${r.step_label})` : "",
          r.waiting_for ? h("span", { class: "waiting" }, " · ", r.waiting_for) : null),
        r.override_correctness ? h("p", { class: "override" }, "correctness overridden: " + r.override_correctness) : null,
        h("ol", { class: "steps" }, steps),
        h("div", { class: "actions" }, ACTIONS.map((a) => h("button", { "data-action": a, onclick: () => ask(r, a) }, a))),
        h("h4", {}, "decision log"), h("ul", { class: "log" }, log));
    });
    body("releases").replaceChildren(...(cards.length ? cards : [h("p", {}, "no releases")]));
  }

  document.body.append(h("dialog", { id: "reason-dialog" },
    h("form", { method: "dialog", onsubmit: act },
      h("p", { class: "what" }), h("label", {}, "reason", h("textarea", { rows: 3 })),
      h("p", { class: "error" }),
      h("menu", {}, h("button", { value: "cancel", type: "button", onclick: () => document.getElementById("reason-dialog").close() }, "cancel"),
        h("button", { type: "submit", class: "confirm" }, "confirm")))));

  // --- live tail -------------------------------------------------------------------------------

  const tail = [];
  const FILTERS = ["model", "backend", "variant", "status"];
  const filterOf = () => Object.fromEntries(FILTERS.map((f) => [f, document.getElementById("filter-" + f).value.trim()]));
  const failed = (r) => !(r.status >= 200 && r.status < 300) || r.error_class || r.error;
  const passes = (r, f) => (!f.model || r.model === f.model) && (!f.backend || r.backend === f.backend) && (!f.variant || r.variant === f.variant)
    && (!f.status || (f.status === "ok" ? !failed(r) : f.status === "error" ? failed(r) : String(r.status) === f.status));

  function tailRow(r) {
    return h("tr", { class: failed(r) ? "failed" : "", "data-request": r.request_id },
      h("td", {}, time(r.ts_ms)), h("td", {}, h("code", {}, r.request_id)), h("td", {}, r.model ?? "–"), h("td", {}, r.backend ?? "–"),
      h("td", {}, r.variant), h("td", { class: "status" }, r.status, r.error_class ? " " + r.error_class : ""),
      h("td", { title: r.engine || "" }, short(r.engine)), h("td", { title: r.artifact || "" }, short(r.artifact)),
      h("td", {}, r.warm === null ? "–" : r.warm ? "warm" : "cold"),
      h("td", {}, ms(r.queue_ms)), h("td", {}, ms(r.ttft_ms ?? r.ttfb_ms)),
      h("td", {}, r.decode_ms && r.decode_tokens ? `${num(r.decode_tokens * 1000 / r.decode_ms)} (${r.decode_source})` : "–"),
      h("td", {}, ms(r.total_ms)), h("td", {}, `${r.prompt_tokens ?? "–"}/${r.completion_tokens ?? "–"}`));
  }

  function drawTailRows() {
    const f = filterOf();
    const rows = tail.filter((r) => passes(r, f)).slice(0, TAIL_MAX).map(tailRow);
    document.getElementById("tail-rows").replaceChildren(...rows);
  }

  async function loadTail() {
    const f = filterOf();
    const q = new URLSearchParams({ limit: String(TAIL_MAX) });
    for (const k of FILTERS) if (f[k]) q.set(k, f[k]);
    const data = await api("/admin/requests?" + q);
    tail.splice(0, tail.length, ...data.requests);
    drawTailRows();
  }

  body("live").append(
    h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); loadTail().catch((err) => setError("live", err)); } },
      FILTERS.map((f) => h("label", {}, f, " ", h("input", { id: "filter-" + f, placeholder: f === "status" ? "ok, error, 429" : "any" }))),
      h("button", { type: "submit" }, "filter"), h("span", { id: "stream-state", class: "badge" }, "connecting")),
    h("table", { class: "tail" }, h("thead", {}, h("tr", {}, ["time", "request", "model", "backend", "variant", "status", "engine", "artifact",
      "warmth", "queue", "ttft/ttfb", "decode tok/s", "total", "tokens in/out"].map((c) => h("th", {}, c)))), h("tbody", { id: "tail-rows" })));

  // The event stream, read with fetch so that it can carry the token (EventSource cannot).
  async function stream() {
    const state = document.getElementById("stream-state");
    for (;;) {
      try {
        const r = await fetch("/admin/events", { headers: auth.headers(), cache: "no-store" });
        if (r.status === 401) { auth.signOut(); return; }
        state.textContent = "live"; state.className = "badge ready";
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            const kind = (block.match(/^event: (.*)$/m) || [])[1];
            const data = (block.match(/^data: (.*)$/m) || [])[1];
            if (kind && data) onEvent(kind, JSON.parse(data));
          }
        }
      } catch (err) {
        // Reconnects below; the badge says the tail is not live meanwhile.
      }
      state.textContent = "reconnecting"; state.className = "badge down";
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  }

  function onEvent(kind, data) {
    if (kind === "request") {
      tail.unshift(data);
      if (tail.length > TAIL_MAX * 5) tail.length = TAIL_MAX * 5;
      if (current() === "live") drawTailRows();
    } else if (kind === "backend" && current() === "engines") {
      refresh();
    } else if (kind === "release" && current() === "releases") {
      refresh();
    } else if (kind === "lagged") {
      setError("live", `the stream fell behind and missed ${data.missed} events; the table may have gaps`);
    }
  }

  // --- refresh ---------------------------------------------------------------------------------

  const DRAW = { engines: drawEngines, time: drawTime, shadow: drawShadow, releases: drawReleases, live: loadTail };
  let drawing = null;

  function refresh() {
    const view = current();
    if (view === "releases" && document.getElementById("reason-dialog").open) return drawing;
    drawing = DRAW[view]().then(() => {
      setError(view, null);
      document.getElementById("view-" + view).dataset.loaded = String(Date.now());
    }, (err) => setError(view, err));
    return drawing;
  }

  setInterval(() => { if (current() !== "live") refresh(); }, REFRESH_MS);
  show();
  stream();
})();
