// The evidence views: shadow comparisons (rolled up per model and candidate first, then each
// group of pairs) and canary releases (their transitions, and their evaluations on request).
(() => {
  "use strict";

  const { h, api, num, short, time, when, badge, windowParam, view, fill, refresh, ask, onEvent } = window.switchyardUI;

  // --- shadow ----------------------------------------------------------------------------------

  const VERDICTS = ["match", "equivalent", "mismatch", "candidate_error", "incomparable"];

  // One line per model and candidate: every group's pairs added up. Pairs whose candidate never
  // ran (skipped copies, `-`) count with the model's candidate when it has exactly one.
  function rollUp(groups) {
    const candidates = new Map();
    for (const g of groups) {
      if (g.candidate.backend === "-") continue;
      candidates.set(g.model, new Set([...(candidates.get(g.model) || []), g.candidate.backend]));
    }
    const candidateOf = (g) => {
      const known = candidates.get(g.model);
      if (g.candidate.backend !== "-" || !known || known.size !== 1) return g.candidate.backend === "-" ? "(did not run)" : g.candidate.backend;
      return [...known][0];
    };
    const byPair = new Map();
    for (const g of groups) {
      const candidate = candidateOf(g);
      const key = `${g.model}\u0000${candidate}`;
      const sum = byPair.get(key) || { model: g.model, primary: g.primary.backend, candidate, groups: 0, counts: {} };
      sum.groups += 1;
      for (const [k, v] of Object.entries(g.counts)) if (typeof v === "number") sum.counts[k] = (sum.counts[k] || 0) + v;
      byPair.set(key, sum);
    }
    return [...byPair.values()];
  }

  function summary(s) {
    const c = s.counts;
    const judged = (c.match || 0) + (c.equivalent || 0) + (c.mismatch || 0);
    const differ = c.mismatch || 0;
    const verdict = !judged ? "nothing comparable yet" : differ ? `${differ} of ${judged} differ` : `all ${judged} agree`;
    return h("tr", { class: "rollup" + (differ ? " bad" : ""), "data-model": s.model, "data-candidate": s.candidate, "data-pairs": c.pairs || 0 },
      h("th", { scope: "row" }, `${s.model}: ${s.primary} → ${s.candidate}`),
      h("td", { class: "verdict-line" }, verdict),
      ...VERDICTS.map((k) => h("td", { class: "num", "data-verdict": k }, c[k] || 0)),
      h("td", { class: "num" }, c.pairs || 0), h("td", { class: "num" }, s.groups));
  }

  // A pair judged token by token whose answers parted: the text both sides wrote, then each
  // side's choice there, its margin over the other's choice, and its likeliest tokens with
  // their logprobs; the whole answers when they were kept (pairs that differ).
  function parted(d) {
    const v = d.divergence;
    const shared = d.prefix.length > 240 ? "…" + d.prefix.slice(-240) : d.prefix;
    const quoted = (t) => JSON.stringify(t.text);
    const side = (name, choice, margin, top, text) => h("div", { class: "output", "data-side": name },
      h("h4", {}, `${name} chose `, h("code", {}, choice ? quoted(choice) : "nothing more (stopped)"),
        ` · margin ${margin == null ? "unknown" : num(margin, 2)}`),
      h("table", { class: "grid top" }, h("tbody", {}, top.slice(0, 5).map(([t, lp]) =>
        h("tr", { class: choice && t.text === choice.text ? "chosen" : "" }, h("td", {}, h("code", {}, quoted(t))), h("td", { class: "num" }, num(lp, 2)))))),
      text == null ? null : h("pre", {}, text));
    return h("article", { class: "divergence", "data-verdict": d.verdict, "data-request": d.request_id || "" },
      h("h3", {}, badge(d.verdict), ` ${d.model} · request ${d.request_id || "?"} · parted at token ${v.at}`,
        v.near_tie ? " · near tie" : "", ` · mean KL ${num(d.mean_kl, 4)}`),
      d.reason ? h("p", { class: "detail" }, d.reason) : null,
      h("p", {}, "both wrote: ", h("q", { class: "prefix" }, shared || "(nothing: they parted at the first token)")),
      h("div", { class: "side-by-side" },
        side("primary", v.primary, v.primary_margin, v.primary_top, d.primary_text),
        side("candidate", v.candidate, v.candidate_margin, v.candidate_top, d.candidate_text)));
  }

  const plural = (n, what) => `${n} ${what}${n === 1 ? "" : "s"}`;

  function partedList(divergences) {
    if (!divergences || !divergences.length) return null;
    const differ = divergences.filter((d) => d.verdict === "mismatch").length;
    return h("section", { class: "divergences" },
      h("h2", {}, "Where answers parted ", h("small", {}, `${plural(divergences.length, "pair")} judged token by token, ${differ} judged different`)),
      ...divergences.map(parted));
  }

  async function drawShadow() {
    const data = await api("/admin/comparisons?window=" + windowParam());
    const cards = data.groups.map((g) => {
      const verdicts = VERDICTS.filter((k) => g.counts[k] > 0)
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
    const sums = rollUp(data.groups);
    fill("shadow",
      h("h2", {}, `Per model and candidate, ${windowParam()}`),
      sums.length ? h("table", { class: "grid rollups" },
        h("thead", {}, h("tr", {}, ["pair", "verdict", ...VERDICTS.map((k) => k.replace("_", "-")), "pairs", "workloads"].map((c) => h("th", {}, c)))),
        h("tbody", {}, sums.map(summary))) : h("p", {}, "no comparisons in this window"),
      partedList(data.divergences),
      cards.length ? h("h2", {}, `Per workload (a group needs ${data.min_repetitions} repetitions for speed ratios)`) : null,
      ...cards);
  }

  // --- releases --------------------------------------------------------------------------------

  // A release under an equivalence rule: the rule, its pairs judged token by token together,
  // and where they parted.
  function tokenEvidence(t) {
    if (!t || !t.rule) return null;
    const a = t.aggregate;
    return h("div", { class: "token-evidence" },
      h("p", {}, "equivalence rule: near tie below ", h("b", {}, t.rule.near_tie_logprob), " logprob · same top at least ",
        h("b", {}, t.rule.min_same_top), " · mean KL at most ", h("b", {}, t.rule.max_mean_kl)),
      a ? h("p", { class: "aggregate", "data-pairs": a.pairs },
        `${plural(a.pairs, "pair")} judged token by token: ${a.identical} identical, ${a.equivalent} equivalent, ${a.different} different · `,
        `same top ${num(a.same_top_share, 3)} of ${a.positions} positions · mean KL ${num(a.mean_kl, 4)} (95 % CI ${num(a.mean_kl_ci[0], 4)}–${num(a.mean_kl_ci[1], 4)})`)
        : h("p", { class: "aggregate" }, "no pair judged token by token yet"),
      t.divergences.length ? h("details", { class: "parted" }, h("summary", {}, `${plural(t.divergences.length, "pair")} parted`), ...t.divergences.map(parted)) : null);
  }

  const ACTIONS = ["promote", "pause", "resume", "abort", "undo"];
  const shown = { evaluations: false };

  async function drawReleases() {
    let list;
    try {
      list = await api("/admin/releases");
    } catch (err) {
      fill("releases", h("p", {}, err.message));
      return;
    }
    const details = await Promise.all(list.releases.map((r) => api("/admin/releases/" + encodeURIComponent(r.id))));
    const cards = details.map(({ release: r, events, evaluations, token_evidence: tokens }) => {
      const steps = (r.steps || []).map((s, i) => h("li", { class: i === r.step ? "current" : i < r.step ? "done" : "" }, s));
      const log = [
        ...events.map((e) => ({ ts: e.ts_ms, el: h("li", { class: "event" }, time(e.ts_ms), " ", h("b", {}, e.actor), `: ${e.from_state || "–"} → ${e.to_state}`,
          e.from_step !== e.to_step ? ` (step ${e.from_step ?? "–"} → ${e.to_step})` : "", " — ", h("q", { class: "reason" }, e.reason)) })),
        ...(shown.evaluations ? evaluations : []).map((e) => ({ ts: e.ts_ms, el: h("li", { class: "evaluation" }, time(e.ts_ms), " evaluation of step ", e.step, ": ", badge(e.decision),
          e.reason ? " — " + e.reason : "", h("details", {}, h("summary", {}, "evidence"), h("pre", {}, JSON.stringify(e.evidence, null, 2)))) })),
      ].sort((a, b) => b.ts - a.ts).map((x) => x.el);
      const act = (a) => () => ask(`${a} release ${r.id} (${r.model}: ${r.primary} → ${r.candidate})`, `/admin/releases/${encodeURIComponent(r.id)}/${a}`);
      return h("article", { class: "release", "data-release": r.id, "data-state": r.state },
        h("h3", {}, r.model, ": ", r.primary, " → ", r.candidate, " ", badge(r.state), h("small", {}, ` ${r.id} · plan ${r.plan} · started ${when(r.created_ms)}`)),
        h("p", {}, "weight ", h("b", { class: "weight" }, r.weight + "%"), " · step ", r.step, r.step_label ? ` (${r.step_label})` : "",
          r.waiting_for ? h("span", { class: "waiting" }, " · ", r.waiting_for) : null),
        r.override_correctness ? h("p", { class: "override" }, "correctness overridden: " + r.override_correctness) : null,
        h("ol", { class: "steps" }, steps),
        tokenEvidence(tokens),
        h("div", { class: "actions" }, ACTIONS.map((a) => h("button", { "data-action": a, onclick: act(a) }, a))),
        h("h4", {}, "decision log ", h("small", {}, `${events.length} transitions` + (shown.evaluations ? `, ${evaluations.length} evaluations` : `; ${evaluations.length} evaluations hidden`))),
        h("ul", { class: "log" }, log));
    });
    // In a fleet on a shared ledger, one Switchyard evaluates every release: say which.
    const ev = list.evaluator || {};
    const evaluator = ev.shared ? h("p", { class: "evaluator", "data-instance": ev.instance || "" },
      ev.instance ? `releases evaluated by ${ev.instance}${ev.this ? " (this one)" : ""}, for the whole fleet` : "the evaluator's lease could not be read: no release is evaluated here") : null;
    fill("releases",
      evaluator,
      h("label", { class: "toggle" }, h("input", {
        type: "checkbox", id: "show-evaluations", checked: shown.evaluations,
        onchange: (e) => { shown.evaluations = e.target.checked; refresh(); },
      }), " show every evaluation (each re-evaluation, holds included)"),
      ...(cards.length ? cards : [h("p", {}, "no releases")]));
  }

  view("shadow", "Shadow", drawShadow);
  view("releases", "Releases", drawReleases);
  onEvent((kind, _data, current) => { if (kind === "release" && current === "releases") refresh(); });
})();
