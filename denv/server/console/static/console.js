// The denv console: one page, no library. The server pushes the key's envs and versions
// (/ui/api/events, Server-Sent Events): a "view" with every node, then "change" events with
// the nodes that are new or changed and the ids that are gone; and "usage" events with what
// the envs use (memory, CPU), sampled by the server while the page is open. Every table and
// tree is drawn from those maps, at most once per animation frame.
"use strict";

const $ = (id) => document.getElementById(id);
const nodes = new Map(); // id -> node ({id, kind: "env"|"version", parent, status, ...})
const usage = new Map(); // env id -> [memory MiB, CPU % of one core] (null: not known)
const closed = new Set(); // tree nodes folded by the user
let tab = "envs";
let treeRoot = null; // the root of the tree on show
let wanted = null; // an id asked for in the URL (#tree/env_...)
let wantedShown = false; // scrolled to it once
let source = null;
let drawPending = false;
let detailId = null;
let logSource = null;

const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ESC[c]);

function age(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

// Bytes as a person reads them, as `denv versions` writes them: 812 B, 4.0 KiB, 1.2 GiB.
function sizeText(n) {
  let value = n, unit = "B";
  for (const bigger of ["KiB", "MiB", "GiB", "TiB"]) {
    if (value < 1024) break;
    value /= 1024;
    unit = bigger;
  }
  return unit === "B" ? `${n} B` : `${value.toFixed(1)} ${unit}`;
}

function notice(text, error = false) {
  const el = $("notice");
  el.textContent = text;
  el.className = error ? "error" : "";
  el.hidden = false;
}

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: { "X-Denv-Console": "1", "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  if (res.status === 401) {
    showSignIn();
    throw new Error("signed out");
  }
  const data = res.status === 204 ? null : await res.json();
  if (!res.ok) throw new Error(data && data.message ? data.message : `HTTP ${res.status}`);
  return data;
}

// -- sign-in

function showSignIn() {
  if (source) source.close();
  source = null;
  nodes.clear();
  usage.clear();
  for (const id of ["tabs", "sign-out", "envs", "versions", "trees", "detail"]) $(id).hidden = true;
  $("sign-in").hidden = false;
  $("live").className = "";
  $("key").focus();
}

async function signIn(event) {
  event.preventDefault();
  const key = $("key").value.trim();
  $("key").value = "";
  try {
    await api("POST", "/ui/session", { key });
    $("sign-in-error").textContent = "";
    start();
  } catch (err) {
    $("sign-in-error").textContent = err.message === "signed out" ? "API key not known to this server" : err.message;
  }
}

async function signOut() {
  await api("DELETE", "/ui/session").catch(() => {});
  showSignIn();
}

// -- the stream

function showView(list, now = false) {
  performance.mark("denv:view"); // for bench/bench_console.py
  nodes.clear();
  for (const n of list) nodes.set(n.id, n);
  $("tabs").hidden = false;
  $("sign-out").hidden = false;
  if (now) drawNow(); else draw();
}

function showUsage(d) {
  const before = d.whole ? JSON.stringify([...usage]) : null;
  if (d.whole) usage.clear();
  for (const [id, v] of Object.entries(d.set)) usage.set(id, v);
  for (const id of d.remove) usage.delete(id);
  if (before === null || before !== JSON.stringify([...usage])) draw(); // the page had it
}

function start() {
  $("sign-in").hidden = true;
  route();
  // The page of a signed-in key comes with its view: drawn now, then only changes follow.
  const inline = $("denv-view");
  let since = "";
  if (inline) {
    const view = JSON.parse(inline.textContent);
    inline.remove(); // a later sign-in (another key) must not start from it
    showUsage({ set: view.usage || {}, remove: [], whole: true });
    // Drawn before the page's first layout: one layout and one paint show the list.
    showView(view.nodes, true);
    since = `?since=${view.gen}`;
  }
  openStream(since);
}

function openStream(since) {
  if (source) source.close();
  const stream = new EventSource(`/ui/api/events${since}`);
  source = stream;
  stream.addEventListener("view", (e) => showView(JSON.parse(e.data).nodes));
  stream.addEventListener("usage", (e) => showUsage(JSON.parse(e.data)));
  stream.addEventListener("ready", () => { $("live").className = "on"; });
  stream.addEventListener("change", (e) => {
    const d = JSON.parse(e.data);
    for (const n of d.upsert) nodes.set(n.id, n);
    for (const id of d.remove) nodes.delete(id);
    draw();
  });
  stream.onerror = () => {
    // Closed here, not retried by the browser with a stale "since": a session that ended
    // shows the sign-in, anything else reopens for the whole view.
    stream.close();
    if (source !== stream) return;
    $("live").className = "";
    fetch("/ui/api/whoami")
      .then((r) => {
        // 401: no session; 403: none can be had here (plain HTTP from another machine).
        if (r.status === 401 || r.status === 403) showSignIn();
        else setTimeout(() => { if (source === stream) openStream(""); }, 1000);
      })
      .catch(() => setTimeout(() => { if (source === stream) openStream(""); }, 1000));
  };
}

function draw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => { if (drawPending) drawNow(); });
}

function drawNow() {
  drawPending = false;
  const envs = [...nodes.values()].filter((n) => n.kind === "env" && n.status !== "deleted");
  $("count-envs").textContent = envs.length;
  $("count-versions").textContent = [...nodes.values()].filter((n) => n.kind === "version" && n.status !== "deleted").length;
  if (tab === "envs") drawEnvs(envs);
  else if (tab === "versions") drawVersions();
  else drawTrees();
  if (nodes.size && !performance.getEntriesByName("denv:drawn").length) {
    // For bench/bench_console.py: drawn, then (the next frame's task) on screen.
    performance.mark("denv:drawn");
    requestAnimationFrame(() => setTimeout(() => performance.mark("denv:painted")));
  }
}

// -- lists: only the rows on screen are in the page (rows have one height), so a list of
// 1,000 costs what a screenful does, to draw and to scroll.

const ROW_PX = 26;
const OVERSCAN = 15;

class VList {
  constructor(el) {
    this.el = el;
    this.rows = [];
    this.inner = document.createElement("div");
    el.append(this.inner);
    el.addEventListener("scroll", () => {
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.render(); });
    });
  }
  // rows: the items; row(item): its HTML, made only for the rows on screen.
  set(rows, row) { this.rows = rows; this.row = row; this.render(); }
  show(index) { this.el.scrollTop = Math.max(0, index * ROW_PX - 3 * ROW_PX); this.render(); }
  render() {
    // Before the page's first layout its scroll and height are not asked for (asking, even
    // the window's height, would lay the page out one more time): at the top, and the
    // screen's height at most.
    // The rows past the screen wait for the first scroll.
    const top = this.laidOut ? this.el.scrollTop : 0;
    const height = this.laidOut ? this.el.clientHeight || window.innerHeight : screen.height || 1200;
    const overscan = this.laidOut ? OVERSCAN : 0;
    this.laidOut = true;
    const first = Math.max(0, Math.floor(top / ROW_PX) - overscan);
    const last = Math.min(this.rows.length, Math.ceil((top + height) / ROW_PX) + overscan);
    this.inner.style.height = `${this.rows.length * ROW_PX}px`;
    this.inner.style.paddingTop = `${first * ROW_PX}px`;
    this.inner.innerHTML = this.rows.slice(first, last).map(this.row).join("");
  }
}

const lists = {};
const list = (id) => (lists[id] ||= new VList($(id)));

// -- envs

function links(n) {
  let out = n.url ? `<a href="${esc(n.url)}" target="_blank" rel="noopener" title="ingress (for clients)">ingress</a>` : "";
  if (n.web) out += ` <a class="web" href="${esc(n.web)}" target="_blank" rel="noopener">web</a>`;
  return out;
}

function actions(n) {
  if (n.kind !== "env" || n.status === "deleted") return "";
  return `<button data-act="logs" data-id="${n.id}">logs</button>` +
    `<button data-act="fork" data-id="${n.id}">fork…</button>` +
    `<button data-act="snapshot" data-id="${n.id}">snapshot</button>` +
    `<button data-act="delete" data-id="${n.id}">delete</button>`;
}

// What an env uses, as two cells: CPU (% of one core) and memory; "–" while not known.
function used(id) {
  const [mem, cpu] = usage.get(id) || [null, null];
  return `<span class="num cpu">${cpu == null ? "–" : `${cpu}%`}</span>` +
    `<span class="num mem">${mem == null ? "–" : `${mem} MiB`}</span>`;
}

function drawEnvs(envs) {
  envs.sort((a, b) => (a.id < b.id ? 1 : -1));
  list("env-rows").set(envs, (n) =>
    `<div class="grid envs row" data-id="${n.id}"><span class="id"><a href="#tree/${n.id}">${n.id}</a></span>` +
    `<span class="status-${esc(n.status)}">${esc(n.status)}</span>` +
    `<span>${esc(n.live ? "live" : n.start)}</span><span>${esc(n.node || "")}</span>` +
    `<span title="${esc(n.image)}">${esc(n.image)}</span><span>${age(n.created_at)}</span>${used(n.id)}<span>${links(n)}</span>` +
    `<span>${actions(n)}</span></div>`);
  $("envs-empty").hidden = envs.length > 0;
}

// -- versions

function drawVersions() {
  const envCount = new Map();
  for (const n of nodes.values()) {
    if (n.kind === "env" && n.status !== "deleted") envCount.set(n.parent, (envCount.get(n.parent) || 0) + 1);
  }
  const versions = [...nodes.values()].filter((n) => n.kind === "version" && n.status !== "deleted");
  versions.sort((a, b) => (a.id < b.id ? 1 : -1));
  list("version-rows").set(versions, (v) =>
    `<div class="grid versions row" data-id="${v.id}"><span class="id"><a href="#tree/${v.id}">${v.id}</a></span>` +
    `<span>${esc(v.project || v.image)}</span><span class="id">${esc(v.parent || "")}</span>` +
    `<span>${v.layers}</span><span class="num size">${sizeText(v.size || 0)}</span>` +
    `<span>${envCount.get(v.id) || 0}</span><span>${age(v.created_at)}</span></div>`);
}

// -- trees

function childrenMap() {
  const kids = new Map();
  for (const n of nodes.values()) {
    if (n.parent && nodes.has(n.parent)) {
      if (!kids.has(n.parent)) kids.set(n.parent, []);
      kids.get(n.parent).push(n);
    }
  }
  for (const list of kids.values()) list.sort((a, b) => (a.id < b.id ? -1 : 1));
  return kids;
}

function rootOf(id) {
  let n = nodes.get(id);
  for (let i = 0; n && n.parent && nodes.has(n.parent) && i < 100000; i++) n = nodes.get(n.parent);
  return n ? n.id : null;
}

function counts(id, kids, memo) {
  // [envs, versions] under id, itself included (deleted envs not counted).
  if (memo.has(id)) return memo.get(id);
  const stack = [id];
  let envs = 0, versions = 0;
  while (stack.length) {
    const at = nodes.get(stack.pop());
    if (at.kind === "env") { if (at.status !== "deleted") envs++; } else versions++;
    for (const c of kids.get(at.id) || []) stack.push(c.id);
  }
  memo.set(id, [envs, versions]);
  return [envs, versions];
}

// Indents as classes made on demand: the page's policy allows no inline styles, and the
// CSSOM is not inline.
const indents = new CSSStyleSheet();
document.adoptedStyleSheets = [...document.adoptedStyleSheets, indents];
let deepest = -1;
function indent(depth) {
  while (deepest < depth) {
    deepest++;
    indents.insertRule(`.tree .d${deepest} { padding-left: ${deepest * 1.2}em; }`, indents.cssRules.length);
  }
  return depth;
}

function drawTrees() {
  const kids = childrenMap();
  const memo = new Map();
  const roots = [...nodes.values()].filter((n) => !n.parent || !nodes.has(n.parent));
  roots.sort((a, b) => (a.id < b.id ? 1 : -1));
  if (wanted && nodes.has(wanted)) { treeRoot = rootOf(wanted); }
  if (!treeRoot || !nodes.has(treeRoot)) treeRoot = roots.length ? roots[0].id : null;
  list("roots").set(roots, (r) => {
    const [e, v] = counts(r.id, kids, memo);
    return `<div data-root="${r.id}" class="root${r.id === treeRoot ? " on" : ""}"><span class="id">${r.id}</span> ` +
      `<span class="dim">${e} envs · ${v} versions</span></div>`;
  });
  if (!treeRoot) { list("tree").set([], String); $("tree-counts").textContent = "No envs."; return; }
  const [e, v] = counts(treeRoot, kids, memo);
  const el = $("tree-counts");
  el.dataset.envs = e;
  el.dataset.versions = v;
  el.textContent = `${e} envs · ${v} versions in the tree of ${treeRoot}`;
  // One flat row per node, indented by depth (each row skipped by layout while off screen);
  // iterative, so a chain of 1,000 forks needs no deep recursion.
  // The tree's rows in order (node, depth), folded nodes' children left out; iterative, so
  // a chain of 1,000 forks needs no deep recursion. HTML only for the rows on screen.
  const rows = [];
  const stack = [[nodes.get(treeRoot), 0]];
  while (stack.length) {
    const [n, depth] = stack.pop();
    rows.push([n, depth]);
    const children = kids.get(n.id) || [];
    if (!closed.has(n.id)) for (let i = children.length - 1; i >= 0; i--) stack.push([children[i], depth + 1]);
  }
  $("tree").dataset.rows = rows.length;
  list("tree").set(rows, ([n, depth]) => {
    const children = kids.get(n.id) || [];
    const fold = children.length ? `<span class="toggle" data-fold="${n.id}">${closed.has(n.id) ? "▸" : "▾"}</span>` : `<span class="toggle"></span>`;
    const label = n.kind === "env"
      ? `<span class="status-${esc(n.status)}">${esc(n.status)}</span> <span class="dim">${esc(n.live ? "live" : n.start)}</span>`
      : `<span class="dim">version · ${n.layers} layers</span>`;
    return `<div data-id="${n.id}" class="node kind-${n.kind} d${indent(depth)}">` +
      `${fold}<span class="id">${n.id}</span>${label}` +
      (children.length ? `<span class="count">${counts(n.id, kids, memo)[0]} envs below</span>` : "") +
      `${links(n)}${actions(n)}${n.kind === "env" && children.length ? `<button data-act="delete-subtree" data-id="${n.id}">delete subtree</button>` : ""}</div>`;
  });
  if (wanted && !wantedShown) {
    const at = rows.findIndex(([n]) => n.id === wanted);
    if (at >= 0) { wantedShown = true; list("tree").show(at); }
  }
}

// -- actions: each asks first and says what it did

async function act(kind, id) {
  try {
    if (kind === "logs") return openDetail(id);
    if (kind === "fork") {
      const n = parseInt(prompt(`Fork ${id}: how many children?`, "1") || "", 10);
      if (!(n >= 1)) return;
      if (!confirm(`Fork ${id} into ${n}?`)) return;
      notice(`forking ${id} into ${n}…`);
      const r = await api("POST", `/ui/api/envs/${id}/fork`, { count: n });
      notice(`forked ${id} into ${r.envs.length} (version ${r.version}): ${r.envs.join(", ")}`);
    } else if (kind === "snapshot") {
      if (!confirm(`Snapshot ${id}?`)) return;
      const r = await api("POST", `/ui/api/envs/${id}/snapshot`);
      notice(`snapshot of ${id}: version ${r.version}`);
    } else if (kind === "delete") {
      if (!confirm(`Delete ${id}?`)) return;
      const r = await api("DELETE", `/ui/api/envs/${id}`);
      notice(`deleted ${r.deleted.join(", ")}`);
    } else if (kind === "delete-subtree") {
      if (!confirm(`Delete ${id} and every env that grew from it?`)) return;
      const r = await api("POST", `/ui/api/envs/${id}/delete-subtree`);
      notice(`deleted ${r.deleted.length} envs: ${r.deleted.join(", ")}`);
    }
  } catch (err) {
    notice(`${kind} ${id} failed: ${err.message}`, true);
  }
}

// -- an env's detail and logs

async function openDetail(id) {
  detailId = id;
  $("detail").hidden = false;
  $("detail-title").textContent = id;
  $("logs").textContent = "";
  try {
    const env = await api("GET", `/ui/api/envs/${id}`);
    const mem = env.memory_bytes == null ? "–" : `${(env.memory_bytes / 1048576).toFixed(1)} MiB`;
    const cpu = env.cpu_s == null ? "–" : `${env.cpu_s.toFixed(1)} s`;
    const facts = { status: env.status, start: env.live ? "live" : env.start, node: env.node,
      version: env.version_id, parent: env.parent_id, egress: env.egress, memory: mem,
      "CPU time": cpu, created: env.created_at, expires: env.expires_at };
    $("detail-facts").innerHTML = Object.entries(facts)
      .map(([k, v]) => `<dt>${k}</dt><dd>${esc(v ?? "–")}</dd>`).join("");
  } catch (err) {
    $("detail-facts").textContent = err.message;
  }
  tailLogs(id);
}

// The log, pushed by the server as it is written (Server-Sent Events): its last lines, then
// each new batch. At most MAX_LOG_LINES are kept on the page.
const MAX_LOG_LINES = 2000;

function tailLogs(id) {
  if (logSource) logSource.close();
  const el = $("logs");
  let lines = [];
  const stream = new EventSource(`/ui/api/envs/${id}/logs/events?tail=200`);
  logSource = stream;
  stream.addEventListener("lines", (e) => {
    const atEnd = el.scrollTop + el.clientHeight >= el.scrollHeight - 4;
    lines = lines.concat(JSON.parse(e.data).lines).slice(-MAX_LOG_LINES);
    el.textContent = lines.join("\n");
    if (atEnd) el.scrollTop = el.scrollHeight;
    $("logs-state").textContent = "(tailing)";
  });
  stream.addEventListener("end", () => {
    stream.close();
    $("logs-state").textContent = lines.length ? "(ended)" : "(no log)";
  });
  stream.onerror = () => {
    // Reopened by the browser unless the server refused (closed): say so then.
    if (stream.readyState === EventSource.CLOSED && logSource === stream) $("logs-state").textContent = "(not tailing)";
  };
}

function closeDetail() {
  detailId = null;
  if (logSource) logSource.close();
  logSource = null;
  $("detail").hidden = true;
}

// -- navigation

function route() {
  const hash = location.hash.slice(1);
  const [name, id] = hash.split("/");
  tab = ["envs", "versions", "trees", "tree"].includes(name) ? (name === "tree" ? "trees" : name) : "envs";
  wanted = name === "tree" ? id : null;
  wantedShown = false;
  if (wanted) treeRoot = null;
  for (const t of ["envs", "versions", "trees"]) $(t).hidden = t !== tab;
  for (const a of document.querySelectorAll("#tabs a")) a.className = a.dataset.tab === tab ? "on" : "";
  draw();
}

// The script is the page's last element: everything it needs is parsed, so it starts now
// rather than at DOMContentLoaded.
{
  $("sign-in").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  $("detail-close").addEventListener("click", closeDetail);
  window.addEventListener("hashchange", route);
  document.body.addEventListener("click", (e) => {
    const t = e.target;
    if (t.dataset.act) act(t.dataset.act, t.dataset.id);
    else if (t.dataset.fold) {
      if (closed.has(t.dataset.fold)) closed.delete(t.dataset.fold); else closed.add(t.dataset.fold);
      draw();
    } else {
      const li = t.closest("#roots [data-root]");
      if (li) { treeRoot = li.dataset.root; wanted = null; history.replaceState(null, "", `#tree/${treeRoot}`); draw(); }
    }
  });
  // Straight to the stream: a page without a session learns so from its error (onerror).
  start();
}
