// The Switchyard dashboard's frame: helpers, the header and its views, the refresh loop, the
// reason dialog every operator action goes through, and the admin event stream. It holds no
// data of its own: every view is drawn from the admin API's JSON (the same answers scripts
// read). Each view file registers itself with `ui.view(name, title, draw)`.
(() => {
  "use strict";

  const auth = window.switchyardAuth;
  const REFRESH_MS = 5000;

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
  // An engine's kind and build, shortened: `llama.cpp/b6100-abc1234` stays, a build that is a
  // digest is cut.
  const engineName = (engine) => {
    if (!engine) return "–";
    const [kind, build] = engine.split(/\/(.*)/s);
    if (!build) return short(kind);
    return kind + "/" + (build.length > 18 ? short(build).slice(0, 18) + "…" : build);
  };
  const time = (tsMs) => new Date(tsMs).toLocaleTimeString();
  const when = (tsMs) => new Date(tsMs).toLocaleString();
  const badge = (text, kind) => h("span", { class: "badge " + (kind || text) }, text);
  const windowParam = () => document.getElementById("window").value;

  // --- layout ----------------------------------------------------------------------------------

  const views = [];
  const app = document.getElementById("app");
  app.hidden = false;
  const nav = h("nav", {});
  const main = h("main", {});
  app.append(
    h("header", {},
      h("h1", {}, "Switchyard"), nav,
      h("label", { class: "window" }, "window ",
        h("select", { id: "window", onchange: () => refresh() },
          ["15m", "1h", "6h", "24h", "7d"].map((w) => h("option", { value: w, selected: w === "1h" }, w)))),
      h("button", { class: "signout", onclick: () => auth.signOut() }, "Sign out")),
    main);

  function view(name, title, draw, options) {
    views.push({ name, draw, live: !!(options && options.live) });
    nav.append(h("a", { href: "#" + name, id: "tab-" + name, "data-view": name }, title));
    main.append(h("section", { id: "view-" + name, class: "view", hidden: true },
      h("p", { class: "error", role: "alert" }), h("div", { class: "body" })));
  }

  const body = (name) => document.querySelector(`#view-${name} .body`);
  // Replaces a view's content; parts left out (null, false) are skipped, not written as text.
  const fill = (name, ...parts) => body(name).replaceChildren(...parts.flat().filter((p) => p !== null && p !== undefined && p !== false));

  function setError(name, err) {
    const box = document.querySelector(`#view-${name} .error`);
    if (box) box.textContent = err ? String(err.message || err) : "";
  }

  function current() {
    const v = location.hash.slice(1);
    return views.some((x) => x.name === v) ? v : views[0].name;
  }

  function show() {
    const name = current();
    for (const v of views) {
      document.getElementById("view-" + v.name).hidden = v.name !== name;
      document.getElementById("tab-" + v.name).classList.toggle("active", v.name === name);
    }
    refresh();
  }

  let drawing = null;

  function refresh() {
    const name = current();
    // Nothing is redrawn under an open dialog: the operator is typing a reason.
    if (document.getElementById("reason-dialog").open) return drawing;
    const v = views.find((x) => x.name === name);
    drawing = v.draw().then(() => {
      setError(name, null);
      document.getElementById("view-" + name).dataset.loaded = String(Date.now());
    }, (err) => setError(name, err));
    return drawing;
  }

  // --- the reason dialog -----------------------------------------------------------------------

  let pending = null;
  document.body.append(h("dialog", { id: "reason-dialog" },
    h("form", { method: "dialog", onsubmit: confirm },
      h("p", { class: "what" }), h("label", {}, "reason", h("textarea", { rows: 3 })),
      h("p", { class: "error" }),
      h("menu", {}, h("button", { value: "cancel", type: "button", onclick: () => document.getElementById("reason-dialog").close() }, "cancel"),
        h("button", { type: "submit", class: "confirm" }, "confirm")))));

  // Asks for a reason, then POSTs `{reason}` to `path`; the view is redrawn after.
  function ask(what, path) {
    const dialog = document.getElementById("reason-dialog");
    dialog.querySelector(".what").textContent = what;
    dialog.querySelector("textarea").value = "";
    dialog.querySelector(".error").textContent = "";
    pending = path;
    dialog.showModal();
  }

  async function confirm(event) {
    event.preventDefault();
    const dialog = document.getElementById("reason-dialog");
    const reason = dialog.querySelector("textarea").value.trim();
    if (!reason) { dialog.querySelector(".error").textContent = "every action needs a reason"; return; }
    try {
      await api(pending, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ reason }) });
      dialog.close();
      refresh();
    } catch (err) {
      dialog.querySelector(".error").textContent = err.message;
    }
  }

  // --- the event stream ------------------------------------------------------------------------

  const listeners = [];

  // Read with fetch so that it can carry the token (EventSource cannot).
  async function stream() {
    for (;;) {
      const state = document.getElementById("stream-state");
      try {
        const r = await fetch("/admin/events", { headers: auth.headers(), cache: "no-store" });
        if (r.status === 401) { auth.signOut(); return; }
        if (state) { state.textContent = "live"; state.className = "badge ready"; }
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
            if (kind && data) for (const f of listeners) f(kind, JSON.parse(data), current());
          }
        }
      } catch (err) {
        // Reconnects below; the badge says the tail is not live meanwhile.
      }
      const badgeNow = document.getElementById("stream-state");
      if (badgeNow) { badgeNow.textContent = "reconnecting"; badgeNow.className = "badge down"; }
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  }

  window.switchyardUI = {
    h, api, ms, num, short, engineName, time, when, badge, windowParam, view, body, fill, setError, current, refresh, ask,
    onEvent: (f) => listeners.push(f),
    start() {
      window.addEventListener("hashchange", show);
      setInterval(() => {
        const v = views.find((x) => x.name === current());
        if (!v.live) refresh();
      }, REFRESH_MS);
      show();
      stream();
    },
  };
})();
