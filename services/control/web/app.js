// The Nisse control room: plain DOM, no framework. Everything it shows
// comes from the control service's JSON API; what changes arrives as
// server-sent events (/api/events), so nothing polls. Text from the
// agents is only ever set as text, never parsed as markup.
"use strict";

const main = document.getElementById("main");
const live = document.getElementById("live");
let me = null;          // { operator, agents }
let events = null;      // the EventSource
const feed = [];        // the newest stream messages, newest first
const FEED_MAX = 500;
let refresh = null;     // what to do when an item changes on this page

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== false && v !== null && v !== undefined) node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

async function api(path, options = {}) {
  const r = await fetch(path, { credentials: "same-origin", ...options });
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  if (r.status === 401) { showLogin(body && body.error); throw new Error("not logged in"); }
  if (!r.ok) throw new Error((body && body.error) || `${r.status} ${r.statusText}`);
  return body;
}

function show(...nodes) {
  main.replaceChildren(...nodes);
}

function showLogin(why) {
  if (events) { events.close(); events = null; }
  me = null;
  document.getElementById("nav").hidden = true;
  document.getElementById("who").hidden = true;
  document.getElementById("logout").hidden = true;
  live.textContent = "";
  const input = el("input", { id: "token", type: "password", autocomplete: "current-password", required: true });
  const error = el("p", { class: "error", role: "alert", text: why || "" });
  const form = el("form", { class: "login", onsubmit: async (e) => {
    e.preventDefault();
    try {
      const r = await fetch("/api/login", {
        method: "POST", credentials: "same-origin",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ token: input.value }),
      });
      const body = await r.json();
      if (!r.ok) { error.textContent = body.error; return; }
      input.value = "";
      start(body);
    } catch (err) { error.textContent = String(err); }
  } },
    el("h2", { text: "Log in" }),
    el("label", { for: "token", text: "Your control token (nisse control token <you>)" }),
    input,
    el("button", { type: "submit", id: "login", text: "Log in" }),
    error);
  show(form);
  input.focus();
}

function start(who) {
  me = who;
  document.getElementById("nav").hidden = false;
  const w = document.getElementById("who");
  w.hidden = false;
  w.textContent = `${who.operator} · ${who.agents.join(", ")}`;
  document.getElementById("logout").hidden = false;
  listen();
  route();
}

// Live events: one stream for the whole page.
function listen() {
  if (events) events.close();
  events = new EventSource("/api/events");
  events.addEventListener("open", () => { live.textContent = "live"; });
  events.addEventListener("error", () => { live.textContent = "reconnecting…"; });
  events.addEventListener("end", (e) => {
    // The watch ended (fell behind, or the token no longer holds): read
    // the state again and watch anew.
    live.textContent = e.data;
    events.close();
    setTimeout(() => { if (me) { listen(); route(); } }, 1000);
  });
  events.addEventListener("event", (e) => {
    const ev = JSON.parse(e.data);
    if (ev.message) {
      feed.unshift(ev);
      if (feed.length > FEED_MAX) feed.length = FEED_MAX;
      if (location.hash === "#/activity") renderFeedItem(ev, true);
    }
    if (ev.item && refresh) refresh(ev);
  });
}

// A change seen on a page re-reads it, at most every 200 ms.
function debounced(f) {
  let timer = null;
  return () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; f(); }, 200);
  };
}

function itemLink(agent, item) {
  return el("a", { href: `#/item/${encodeURIComponent(agent)}/${item.number}`, "data-item": item.id, text: `#${item.number} ${item.title}` });
}

function itemRow(agent, item, extra) {
  return el("li", { "data-item": item.id },
    el("span", { class: `state ${item.state}`, text: item.state }), " ",
    itemLink(agent, item), extra ? el("span", { class: "muted", text: ` — ${extra}` }) : null);
}

async function overview() {
  const r = await api("/api/overview");
  const nodes = [el("h2", { text: "Overview" })];
  for (const a of r.view.agents) {
    const section = el("section", { "aria-labelledby": `agent-${a.agent}` },
      el("h2", { id: `agent-${a.agent}`, text: `${a.agent}: ${a.active.length} active, ${a.ready.length} ready, ${a.waiting.length} waiting, ${a.blocked.length} blocked, ${a.closed} closed` }));
    const list = (title, items) => {
      if (!items.length) return;
      section.append(el("h3", { text: title }));
      section.append(el("ul", { class: "items" }, ...items.map((i) => itemRow(a.agent, i))));
    };
    list("Being worked", a.active);
    list("Waiting", a.waiting);
    list("Blocked", a.blocked);
    list("Ready, in order", a.ready);
    nodes.push(section);
  }
  const link = el("p", {}, el("a", { href: "#/items", text: "Every item, closed ones too" }));
  nodes.push(link);
  show(...nodes);
  refresh = debounced(() => { if (location.hash === "" || location.hash === "#/") overview(); });
}

async function allItems() {
  const nodes = [el("h2", { text: "Every item" })];
  for (const agent of me.agents) {
    const r = await api(`/api/items?agent=${encodeURIComponent(agent)}`);
    nodes.push(el("h3", { text: agent }),
      el("ul", { class: "items" }, ...r.view.items.map((i) => itemRow(agent, i))));
  }
  show(...nodes);
  refresh = debounced(() => { if (location.hash === "#/items") allItems(); });
}

async function itemPage(agent, key) {
  const r = await api(`/api/item?agent=${encodeURIComponent(agent)}&item=${encodeURIComponent(key)}`);
  const v = r.view;
  const item = v.item;
  const plans = v.plans || [];
  const shown = plans.find((p) => p.revision === v.shown_revision);
  const nodes = [
    el("h2", { text: `#${item.number} ${item.title}` }),
    el("p", {}, el("span", { class: `state ${item.state}`, text: item.state }), " ",
      el("span", { class: "muted", text: `${agent} · ${item.scope} · from ${item.source}` })),
  ];
  if (shown) {
    const tag = `rev-${shown.revision}`;
    nodes.push(el("h3", { text: `Plan ${tag}: ${shown.status}` }));
    nodes.push(el("pre", { id: "plan", text: v.plan_text }));
    if (shown.status === "up") {
      // A live update of the same revision keeps the decision box as it
      // is: what the operator typed (the confirmation, a reason) stays.
      const kept = document.getElementById("decide");
      const same = kept && kept.dataset.item === item.id && kept.dataset.revision === String(shown.revision);
      nodes.push(same ? kept : decide(agent, item, shown, v.confirm));
    }
  } else {
    nodes.push(el("p", { class: "muted", text: "No plan." }));
  }
  nodes.push(el("h3", { text: "Log" }), el("pre", { id: "log", text: v.log_text }));
  const kept = nodes.find((n) => n.isConnected);
  if (kept) {
    // Everything around it anew, the kept box never leaving the page (so
    // it keeps the focus, too).
    for (const n of [...main.childNodes]) if (n !== kept) n.remove();
    const at = nodes.indexOf(kept);
    kept.before(...nodes.slice(0, at));
    kept.after(...nodes.slice(at + 1));
  } else {
    show(...nodes);
  }
  const again = debounced(() => itemPage(agent, key));
  refresh = (ev) => { if (ev.item.id === item.id) again(); };
}

// Approve or deny exactly the revision shown; a destructive one needs its
// steps named back first.
function decide(agent, item, plan, phrase) {
  const tag = `rev-${plan.revision}`;
  const answer = el("p", { id: "answer", role: "status" });
  const approve = el("button", { type: "button", class: "approve", id: "approve", text: `Approve ${tag}` });
  const deny = el("button", { type: "button", id: "deny", text: `Deny ${tag}` });
  const reason = el("input", { id: "reason", type: "text", "aria-label": "Why (for a denial)", placeholder: "why (for a denial)" });
  const box = el("div", { class: "decide" + (phrase ? " destructive" : "") });
  let confirm = null;
  if (phrase) {
    confirm = el("input", { id: "confirm", type: "text", autocomplete: "off", spellcheck: "false" });
    approve.disabled = true;
    confirm.addEventListener("input", () => { approve.disabled = confirm.value.trim() !== phrase; });
    box.append(el("label", { for: "confirm" },
      el("span", {}, "This revision has destructive steps. Type ", el("code", { text: phrase }), " to approve them:"),
      confirm));
  }
  const send = async (action) => {
    answer.className = "";
    answer.textContent = "sending…";
    try {
      const r = await api("/api/command", {
        method: "POST",
        headers: { "content-type": "application/json", "x-nisse-control": "1" },
        body: JSON.stringify({
          agent, item: String(item.number), action, revision: plan.revision,
          text: reason.value, confirm: confirm ? confirm.value.trim() : "",
        }),
      });
      answer.className = "answer";
      answer.textContent = r.lines.length ? r.lines.join("\n") : "applied";
    } catch (err) {
      answer.className = "error";
      answer.textContent = String(err.message || err);
    }
  };
  approve.addEventListener("click", () => send("approve"));
  deny.addEventListener("click", () => send("deny"));
  box.append(approve, reason, deny);
  return el("section", { id: "decide", "aria-label": "Decide", "data-item": item.id, "data-revision": String(plan.revision) }, box, answer);
}

function feedRow(ev) {
  const m = ev.message;
  return el("li", {}, el("span", { class: "muted", text: `${ev.agent} #${ev.sequence} ` }),
    el("span", { text: m.type || m.subject }),
    m.work_item ? el("span", { class: "muted", text: ` · ${m.work_item}` }) : null);
}

function renderFeedItem(ev, prepend) {
  const list = document.getElementById("feed");
  if (!list) return;
  if (prepend) list.prepend(feedRow(ev)); else list.append(feedRow(ev));
  while (list.children.length > FEED_MAX) list.lastChild.remove();
}

function activity() {
  show(el("h2", { text: "Activity" }),
    el("p", { class: "muted", text: "Every message the agents' streams take, as it arrives." }),
    el("ul", { id: "feed", class: "feed items" }, ...feed.map(feedRow)));
  refresh = null;
}

async function streams() {
  const r = await api("/api/streams");
  show(el("h2", { text: "Streams, dead letters, circuits and spend" }), el("pre", { id: "streams", text: r.text }),
    el("button", { type: "button", onclick: () => streams(), text: "Read again" }));
  refresh = null;
}

async function route() {
  if (!me) return;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  try {
    if (parts[0] === "item" && parts.length >= 3) await itemPage(parts[1], parts[2]);
    else if (parts[0] === "items") await allItems();
    else if (parts[0] === "activity") activity();
    else if (parts[0] === "streams") await streams();
    else await overview();
  } catch (err) {
    if (me) show(el("p", { class: "error", role: "alert", text: String(err.message || err) }));
  }
  main.focus({ preventScroll: true });
}

document.getElementById("logout").addEventListener("click", async () => {
  await fetch("/api/logout", { method: "POST", credentials: "same-origin" });
  showLogin("");
});
window.addEventListener("hashchange", route);

(async () => {
  try {
    const r = await fetch("/api/whoami", { credentials: "same-origin" });
    if (r.ok) start(await r.json()); else showLogin("");
  } catch (err) { showLogin(String(err)); }
})();
