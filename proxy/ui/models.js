// The dashboard's first two views: the models, each with the engines that serve it and how it
// fared in the window; and the engines, compact, with their load, their process and the
// operator's load, unload and restart.
(() => {
  "use strict";

  const { h, api, ms, short, engineName, time, badge, windowParam, view, fill, refresh, ask, onEvent } = window.switchyardUI;

  // --- models ----------------------------------------------------------------------------------

  const ROLE_ORDER = ["primary", "fallback", "candidate", "shadow"];

  function roleCell(b) {
    const share = b.role === "shadow" && b.share != null ? ` ${Math.round(b.share * 100)}% copied` : "";
    const weight = b.weight != null && (b.role === "candidate" || b.weight < 100) ? ` ${b.weight}%` : "";
    return h("li", { class: "role", "data-backend": b.backend, "data-role": b.role, "data-state": b.state || "" },
      h("span", { class: "role-name" }, b.role), " ",
      h("a", { href: "#engines", class: "backend-link" }, b.backend), weight || share ? h("small", {}, weight || share) : null, " ",
      badge(b.state || "unknown"), " ",
      h("small", { class: "engine", title: (b.engine || "") + "\n" + (b.artifact || "") }, engineName(b.engine)));
  }

  // The fleet on the shared ledger: how many Switchyards run, and which run a configuration
  // other than this one's. Nothing without a shared ledger; its error when it cannot be read.
  function fleetNote(fleet) {
    if (fleet instanceof Error) return h("p", { class: "fleet bad" }, "fleet: " + fleet.message);
    if (!fleet.shared_ledger) return null;
    const running = fleet.instances.filter((i) => i.running);
    const drift = fleet.instances.filter((i) => i.running && !i.same_config);
    return h("div", { class: "fleet", "data-running": running.length, "data-drift": drift.length },
      h("p", {}, `fleet: ${running.length} Switchyard${running.length === 1 ? "" : "s"} running on the shared ledger — `,
        running.map((i) => h("span", { class: "instance", "data-instance": i.instance, title: i.config_digest },
          i.instance, i.this ? " (this one)" : "", " ")),
        h("small", {}, fleet.shared_ledger)),
      drift.length ? h("p", { class: "drift bad" },
        `configuration differs from this one's (${short(fleet.this.config_digest)}): `,
        drift.map((i) => h("span", { class: "instance", "data-instance": i.instance }, `${i.instance} (${short(i.config_digest)}) `))) : null);
  }

  async function drawModels() {
    const [data, fleet] = await Promise.all([
      api("/admin/overview?window=" + windowParam()),
      api("/admin/instances").catch((e) => e),
    ]);
    const rows = data.models.map((m) => {
      const backends = m.backends.slice().sort((a, b) => ROLE_ORDER.indexOf(a.role) - ROLE_ORDER.indexOf(b.role));
      const primary = backends.find((b) => b.role === "primary");
      const s = m.stats;
      const errors = s ? s.errors : null;
      return h("tr", { class: "model", "data-model": m.model },
        h("th", { scope: "row" }, m.model, m.aliases && m.aliases.length ? h("small", { class: "aliases" }, " also " + m.aliases.join(", ")) : null,
          m.patterns && m.patterns.length ? h("small", { class: "patterns" }, " and names like " + m.patterns.join(", ")) : null),
        h("td", {}, badge(primary ? primary.state : "unknown")),
        h("td", {}, h("ul", { class: "roles" }, backends.map(roleCell))),
        h("td", {}, m.release ? [h("a", { href: "#releases" }, m.release.candidate), " ", h("b", {}, m.release.weight + "%"), " ", badge(m.release.state),
          m.release.waiting_for ? h("small", {}, " " + m.release.waiting_for) : null] : "–"),
        h("td", { class: "num requests" }, s ? s.requests : "–"),
        h("td", { class: "num errors" + (errors ? " bad" : "") }, s ? errors : "–"),
        h("td", { class: "num" }, s ? ms(s.p50_total_ms) : "–"),
        h("td", { class: "num", title: s && s.ttft_n ? `${s.ttft_n} streamed answers` : "no streamed answer in the window" }, s ? ms(s.p50_ttft_ms) : "–"));
    });
    const groups = Object.entries(data.swap_groups || {});
    fill("models",
      fleetNote(fleet),
      h("table", { class: "grid overview" },
        h("thead", {}, h("tr", {}, ["model", "state", "engines by role", "release", `requests (${windowParam()})`, "errors", "p50 total", "p50 first token"]
          .map((c) => h("th", {}, c)))),
        h("tbody", {}, rows)),
      data.models.length ? null : h("p", {}, "no models configured"),
      data.figures_from === "fleet" ? h("p", { class: "note figures-from" }, "requests, errors and times: every Switchyard of the fleet, from the shared ledger") : null,
      data.unrouted ? h("p", { class: "note" }, `${data.unrouted.requests} requests in the window named no configured model (see the live tail).`) : null,
      groups.length ? h("p", { class: "swap-groups" }, "swap groups: ", groups.map(([name, g]) =>
        h("span", { class: "group", "data-group": name }, h("b", {}, name), " held by ", g.holder || "nobody", ` (${g.swaps} swaps) `))) : null,
      data.models.some((m) => m.stats === null) ? h("p", { class: "note" }, "no request figures: no ledger is configured, or it could not be read (see Switchyard's log)") : null);
  }

  // --- engines ---------------------------------------------------------------------------------

  const ACTIONS = ["load", "unload", "restart"];

  function engineCard(name, b, past, actions) {
    const m = b.managed;
    const running = !["stopped", "failed", "quarantined"].includes(b.state);
    const groups = (b.swap_groups || []).map((g) => `${g.name} (held by ${g.holder || "nobody"})`).join(", ");
    return h("article", { class: "engine", "data-backend": name, "data-state": b.state },
      h("h2", {}, name, " ", badge(b.state), h("small", { class: "kind" }, " ", b.engine_kind || "")),
      b.reason ? h("p", { class: "reason", title: b.reason }, b.reason) : null,
      h("dl", {},
        h("dt", {}, "engine"), h("dd", { class: "engine-build", title: b.engine }, engineName(b.engine), b.build_note ? h("span", { class: "note" }, " " + b.build_note) : null),
        h("dt", {}, "artifact"), h("dd", { class: "artifact", title: b.artifact }, short(b.artifact), " ", badge(b.identity),
          b.identity_note ? h("span", { class: "note", title: b.identity_note }, " ?") : null),
        h("dt", {}, running ? "load" : "last run"), h("dd", { class: "load" },
          running
            ? [h("span", { class: "in-flight" }, b.in_flight), " in flight · ", h("span", { class: "queued" }, b.waiting), " queued · ",
              b.free_slots == null ? "–" : b.free_slots, " free of ", b.max_concurrency ?? b.slots ?? "–"]
            : [b.slots ? `${b.slots} slots, ` : "", b.n_ctx ? `context ${b.n_ctx}` : "–"]),
        m ? [
          h("dt", {}, "process"), h("dd", { class: "managed" }, "pid ", m.pid ?? "–", " · starts ", m.starts, " · crashes ", m.crashes,
            " · last load ", m.last_load_ms == null ? "–" : ms(m.last_load_ms)),
          groups ? [h("dt", {}, "swap group"), h("dd", { class: "swap" }, groups)] : null,
        ] : [h("dt", {}, "url"), h("dd", {}, b.url)],
        b.pool ? [h("dt", {}, "pool"), h("dd", { class: "pool", "data-pool-state": b.pool.member.state },
          b.pool.name, " · ", b.pool.member.state, " · ", b.pool.member.outstanding, " outstanding",
          b.pool.member.state === "ejected" ? ` · back in ${ms(b.pool.member.ejected_for_ms)}` : "")] : null,
        (b.degraded || []).flatMap((d) => [h("dt", {}, "degraded"), h("dd", { class: "degraded", "data-detector": d.detector, title: d.rule },
          `${d.detector}: ${d.summary} · since `, time(d.since_ms), ` (${d.mode})`)]),
        baseline(b.baseline)),
      m ? h("div", { class: "actions" }, ACTIONS.map((a) => h("button", {
        "data-action": a, onclick: () => ask(`${a} ${name} (now ${b.state})`, `/admin/backends/${encodeURIComponent(name)}/${a}`),
      }, a))) : null,
      h("details", { class: "history" }, h("summary", {}, `history (${past.length + actions.length} in ${windowParam()})`),
        actions.length ? h("ul", { class: "engine-actions" }, actions.map((a) =>
          h("li", {}, time(a.ts_ms), " ", h("b", {}, a.actor), ` ${a.action} (was ${a.state_before}): ${a.outcome} — `, h("q", {}, a.reason)))) : null,
        past.length ? h("ul", {}, past.map((s) =>
          h("li", {}, time(s.ts_ms), " ", badge(s.health), " ", badge(s.verification), s.note ? " " + s.note : ""))) : null,
        past.length || actions.length ? null : h("p", {}, "nothing recorded in this window")));
  }

  // The warm baseline the detectors judge the engine against: each band's median rates (and
  // time to first token, shown only), the cached share of a continuing prompt, the queue's share.
  function baseline(base) {
    const bands = (base && base.bands || []).filter((band) => band.decode_tokens_per_s != null || band.prefill_tokens_per_s != null);
    const share = (v) => `${Math.round(v * 100)} %`;
    const shares = [
      base && base.cache && base.cache.cached_share != null ? `prompt cached ${share(base.cache.cached_share)} ` : null,
      base && base.queue && base.queue.queued_share != null ? `queued ${share(base.queue.queued_share)} of the time` : null,
    ].filter(Boolean);
    if (!bands.length && !shares.length) return null;
    const rate = (v) => v == null ? "–" : `${Math.round(v)} tok/s`;
    return [h("dt", {}, "baseline"), h("dd", { class: "baseline", title: `the median of the first ${base.size} warm answers per prompt-size band` },
      bands.map((band) => h("span", { class: "band" }, `${band.band} tokens: decode ${rate(band.decode_tokens_per_s)}, prefill ${rate(band.prefill_tokens_per_s)}`,
        band.ttft_ms == null ? " " : `, first token ${ms(band.ttft_ms)} `)),
      shares.length ? h("span", { class: "shares" }, shares) : null)];
  }

  async function drawEngines() {
    const [backends, history, actions] = await Promise.all([
      api("/admin/backends"),
      api("/admin/identities?limit=10&window=" + windowParam()).catch(() => ({ backends: {} })),
      api("/admin/engine-actions?limit=10&window=" + windowParam()).catch(() => ({ backends: {} })),
    ]);
    const cards = Object.entries(backends.backends).map(([name, b]) =>
      engineCard(name, b, history.backends[name] || [], actions.backends[name] || []));
    fill("engines", h("p", { class: "digest" }, "configuration ", short(backends.config_digest)),
      h("div", { class: "engines" }, cards));
  }

  view("models", "Models", drawModels);
  view("engines", "Engines", drawEngines);
  onEvent((kind, _data, current) => {
    if ((kind === "backend" || kind === "engine_action" || kind === "degraded") && (current === "engines" || current === "models")) refresh();
  });
})();
