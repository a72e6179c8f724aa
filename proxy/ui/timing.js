// Where the time goes (each group's mean total split into parts that add up to it, and the
// distributions of first token and token rates), and the live tail of requests.
(() => {
  "use strict";

  const { h, api, ms, num, engineName, time, badge, windowParam, view, body, fill, setError, onEvent } = window.switchyardUI;

  const PART_COLORS = { queue: "#8c6bb1", load: "#e08214", prefill: "#5aae61", decode: "#d6604d", rest: "#9aa3b5" };
  const PART_NOTES = {
    queue: "waiting for a slot",
    load: "starting or waking a managed engine",
    prefill: "the engine reading the prompt",
    decode: "the engine generating",
    rest: "forwarding, the engine's own overhead and writing the answer: the part of the total no phase accounts for",
  };

  // --- where the time goes ---------------------------------------------------------------------

  const charts = [];

  function histogram(title, dist, unit) {
    const box = h("figure", { class: "dist" }, h("figcaption", {}, title));
    if (!dist) { box.append(h("p", { class: "none" }, "none in this window")); return box; }
    box.append(h("p", { class: "quantiles" }, `n=${dist.n} · p50 ${num(dist.p50)} · p90 ${num(dist.p90)} · p99 ${num(dist.p99)} ${unit}`));
    const target = h("div", { class: "plot" });
    box.append(target);
    if (window.uPlot) {
      const plot = new uPlot({
        width: 300, height: 120, legend: { show: false }, cursor: { show: false },
        scales: { x: { time: false } },
        axes: [{ size: 30 }, { size: 35 }],
        series: [{}, { label: "count", stroke: "#4393c3", fill: "rgba(67,147,195,.4)", paths: uPlot.paths.bars({ size: [0.9, 40] }) }],
      }, [dist.bins.map((b) => (b.from + b.to) / 2), dist.bins.map((b) => b.count)], target);
      charts.push(plot);
    }
    return box;
  }

  function bar(g, parts, max) {
    const total = g.total.mean_ms;
    const label = `${g.model} · ${g.backend} · ${g.variant} · ${g.warmth}`;
    const present = parts.filter((p) => g.phases[p]);
    return h("div", { class: "bar-row", "data-group": label, "data-total-ms": total.toFixed(3) },
      h("span", { class: "bar-label" }, label, h("small", {}, ` ${g.requests} req, ${g.errors} err`)),
      h("span", { class: "bar", style: `width:${(100 * total / max).toFixed(3)}%` }, present.map((p) => {
        const part = g.phases[p].mean_ms;
        const share = total > 0 ? part / total : 0;
        return h("i", {
          class: "seg " + p, "data-phase": p, "data-ms": part.toFixed(3),
          title: `${p}: ${ms(part)} of ${ms(total)} (${(100 * share).toFixed(1)}%; ${g.phases[p].n} of ${g.total.n} requests had it) — ${PART_NOTES[p]}`,
          style: `width:${(100 * share).toFixed(3)}%;background:${PART_COLORS[p]}`,
        }, share > 0.12 ? ms(part) : "");
      })),
      h("span", { class: "bar-total" }, ms(total), g.ttfb ? h("small", {}, ` · ttfb ${ms(g.ttfb.mean_ms)}`) : null,
        g.clipped ? h("small", { class: "note", title: "the engine's reported phases were longer than Switchyard's own clock saw; scaled down to fit" }, ` · ${g.clipped} clipped`) : null));
  }

  async function drawTime() {
    const stats = await api("/admin/stats/phases?window=" + windowParam());
    while (charts.length) charts.pop().destroy();
    const groups = stats.groups.filter((g) => g.total);
    const max = Math.max(1, ...groups.map((g) => g.total.mean_ms));
    const legend = h("p", { class: "legend" }, stats.phases.map((p) => h("span", { title: PART_NOTES[p] }, h("i", { style: `background:${PART_COLORS[p]}` }), p)),
      " — the mean answered request's total, split into parts that add up to it; a part no request had is left out. ttfb (request forwarded → first byte) overlaps prefill and is shown beside the bar, not in it.");
    const dists = groups.map((g) => h("article", { class: "group" },
      h("h3", {}, `${g.model} · ${g.backend} · ${g.variant} · `, badge(g.warmth)),
      h("div", { class: "dists" },
        histogram("ttft (ms)", g.ttft_ms, "ms"),
        histogram("decode tok/s — engine-reported", g.decode_tok_s.engine, "tok/s"),
        histogram("decode tok/s — measured by Switchyard", g.decode_tok_s.measured, "tok/s"),
        histogram("prefill tok/s — engine-reported", g.prefill_tok_s.engine, "tok/s"),
        histogram("prefill tok/s — measured by Switchyard", g.prefill_tok_s.measured, "tok/s"))));
    fill("time", 
      h("h2", {}, "Phases per model and backend, cold and warm apart"), legend,
      groups.length ? h("div", { class: "bars" }, groups.map((g) => bar(g, stats.phases, max))) : h("p", {}, "no answered requests in this window"),
      h("h2", {}, "Distributions"), ...dists);
  }

  // --- live tail -------------------------------------------------------------------------------

  const TAIL_MAX = 200;
  const tail = [];
  const FILTERS = ["model", "backend", "variant", "status"];
  const filterOf = () => Object.fromEntries(FILTERS.map((f) => [f, document.getElementById("filter-" + f).value.trim()]));
  const failed = (r) => !(r.status >= 200 && r.status < 300) || r.error_class || r.error;
  const passes = (r, f) => (!f.model || r.model === f.model) && (!f.backend || r.backend === f.backend) && (!f.variant || r.variant === f.variant)
    && (!f.status || (f.status === "ok" ? !failed(r) : f.status === "error" ? failed(r) : String(r.status) === f.status));

  function cache(r) {
    if (r.cached_tokens == null) return "–";
    return r.prompt_tokens ? `${r.cached_tokens}/${r.prompt_tokens}` : String(r.cached_tokens);
  }

  function tailRow(r) {
    const error = r.error || "";
    return h("tr", { class: failed(r) ? "failed" : "", "data-request": r.request_id },
      h("td", {}, time(r.ts_ms)),
      h("td", {}, h("code", {}, r.request_id), r.instance ? h("small", { class: "instance", title: "the Switchyard that served it" }, " " + r.instance) : null),
      h("td", {}, r.model ?? "–"),
      h("td", { class: "backend", title: r.pool ? `a member of pool ${r.pool}, placed by ${r.placement}` : "" }, r.backend ?? "–",
        r.pool ? h("span", { class: "pool" }, ` · ${r.pool} (${r.placement})`) : ""),
      h("td", {}, r.variant), h("td", { class: "status" }, r.status, r.error_class ? " " + r.error_class : ""),
      h("td", { class: "error-message", title: error }, error.length > 80 ? error.slice(0, 80) + "…" : error),
      h("td", { title: (r.engine || "") + "\n" + (r.artifact || "") }, engineName(r.engine)),
      h("td", {}, r.warm === null ? "–" : r.warm ? "warm" : "cold"),
      h("td", {}, ms(r.queue_ms)), h("td", { class: "load" }, ms(r.load_ms)), h("td", {}, ms(r.ttft_ms ?? r.ttfb_ms)),
      h("td", {}, r.decode_ms && r.decode_tokens ? `${num(r.decode_tokens * 1000 / r.decode_ms)} (${r.decode_source})` : "–"),
      h("td", {}, ms(r.total_ms)), h("td", {}, `${r.prompt_tokens ?? "–"}/${r.completion_tokens ?? "–"}`),
      h("td", { class: "cache", title: "prompt tokens the engine reported as cached" }, cache(r)));
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

  view("time", "Where the time goes", drawTime);
  view("live", "Live tail", loadTail, { live: true });
  body("live").append(
    h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); loadTail().catch((err) => setError("live", err)); } },
      FILTERS.map((f) => h("label", {}, f, " ", h("input", { id: "filter-" + f, placeholder: f === "status" ? "ok, error, 429" : "any" }))),
      h("button", { type: "submit" }, "filter"), h("span", { id: "stream-state", class: "badge" }, "connecting")),
    h("table", { class: "tail" }, h("thead", {}, h("tr", {}, ["time", "request", "model", "backend", "variant", "status", "error", "engine",
      "warmth", "queue", "load", "ttft/ttfb", "decode tok/s", "total", "tokens in/out", "cached"].map((c) => h("th", {}, c)))), h("tbody", { id: "tail-rows" })));

  onEvent((kind, data, current) => {
    if (kind === "request") {
      tail.unshift(data);
      if (tail.length > TAIL_MAX * 5) tail.length = TAIL_MAX * 5;
      if (current === "live") drawTailRows();
    } else if (kind === "lagged") {
      setError("live", `the stream fell behind and missed ${data.missed} events; the table may have gaps`);
    }
  });
})();
