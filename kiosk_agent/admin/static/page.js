// The status page's script: log in, read /api/page, follow /api/events, press buttons.
// No framework and no build step. Every value from the agent goes into the page as text
// (textContent), never as HTML. Actions send the session's CSRF token in a header.
"use strict";

const state = {
  role: null,
  csrf: null,
  page: null, // the last /api/page answer, kept fresh by the event stream
  terminals: {}, // device_id -> the service's terminal record (capabilities), when known
  results: {}, // key -> {text, ok}: the answer of the last action, shown by its button
  busy: {}, // key -> true while an action is under way
  stream: null,
  lost: false, // the stream dropped; the browser opens it again with the last step's id
  fetched: 0, // steps missed while it was lost, fetched from the journal on its return
  shownSteps: new Set(), // sale steps on the live list: one fetched again shows once
  streamHealth: null, // the newest health and doctor the stream brought
  streamDoctor: null,
  reload: null,
};

const $ = (id) => document.getElementById(id);

const MAX_TEXT = 1000; // longer texts are cut: a name or a reason, not a page

function plain(value) {
  // Text as people should read it: a control or an invisible direction mark from outside (a
  // terminal escape, a right-to-left override) shows as \uFFFD instead of reordering the line.
  // (the zero-width joiner and non-joiner are writing: Persian, Indic scripts, emoji)
  let text = String(value).replace(/[\t\n\r]/g, " ")
    .replace(/[\p{Cc}\p{Cf}]/gu, (c) => (c === "\u200c" || c === "\u200d" ? c : "\uFFFD"));
  if (text.length > MAX_TEXT) text = `${text.slice(0, MAX_TEXT)}… (${text.length} characters)`;
  return text;
}

function setText(node, value) {
  node.textContent = plain(value);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") setText(node, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(plain(child)));
  }
  return node;
}

function fill(node, ...children) {
  // like replaceChildren, with el()'s rules for nested lists and empty values
  node.replaceChildren(...el("div", {}, ...children).childNodes);
}

// Every time on the page is UTC, written as the command line writes it (10:15:30Z, or
// 2026-11-22 10:15:30Z on another day): a tech comparing the page with `kiosk-agent sales` on
// the unit reads the same figures, whatever zone the browser is in.
function utc(moment) {
  // Unix seconds (the page's own stream) or ISO 8601 UTC (the admin API's JSON)
  let d;
  if (typeof moment === "string" && /^\d{4}-\d{2}-\d{2}T/.test(moment)) d = new Date(moment);
  else if (typeof moment === "number" && Number.isFinite(moment)) d = new Date(moment * 1000);
  else return null;
  return Number.isNaN(d.getTime()) ? null : d.toISOString();
}

function clock(unix) {
  const iso = utc(unix);
  return iso === null ? "-" : `${iso.slice(11, 19)}Z`;
}

function when(unix) {
  const iso = utc(unix);
  if (iso === null) return "-";
  const today = iso.slice(0, 10) === new Date().toISOString().slice(0, 10);
  return today ? clock(unix) : `${iso.slice(0, 10)} ${iso.slice(11, 19)}Z`;
}

function duration(seconds) {
  seconds = Math.floor(seconds);
  if (seconds < 0) return "expired";
  const d = Math.floor(seconds / 86400), h = Math.floor((seconds % 86400) / 3600);
  const m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  return `${m}m ${s}s`;
}

// -- talking to the agent -----------------------------------------------------------------

async function call(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = state.csrf || "";
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
    cache: "no-store",
  });
  let data = null;
  const text = await response.text();
  try {
    data = text ? JSON.parse(text) : null;
  } catch (err) {
    data = { error: "not_json", detail: text.slice(0, 200) };
  }
  if (response.status === 401 && path !== "/session") showLogin("Your session ended; log in again.");
  return { ok: response.ok, status: response.status, data };
}

// The service's refusals in words for the person at the machine (the raw code stays out).
const REFUSALS = {
  terminal_offline: "the reader is offline: check its power and network, then Ping it",
  terminal_busy: "the reader is busy with a customer's card: try again when the sale is over",
  capability_unsupported: "this reader cannot do that",
  nothing_to_print: "no completed sale to print yet",
  unknown_terminal: "the payment service does not list this reader",
};

function problemText(answer) {
  const data = answer.data || {};
  if (REFUSALS[data.error]) return REFUSALS[data.error];
  if (answer.status === 504) return "the payment service did not answer in time";
  // "payment service: HTTP 409 [x]: detail" -> the detail only
  const detail = String(data.detail || "").replace(/^payment service: (HTTP \d+ \[[^\]]*\]:? ?)?/, "");
  return detail || data.error || `the agent answered ${answer.status}`;
}

// -- log in and out -----------------------------------------------------------------------

function showLogin(message) {
  if (state.stream) state.stream.close();
  state.stream = null;
  $("board").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  setText($("login-error"), message || "");
  // before a login there is nothing to be live or offline about: no status, no stream badge
  $("live").hidden = true;
  $("live").classList.remove("on");
  $("status").hidden = true;
  $("token").focus();
}

async function login(event) {
  event.preventDefault();
  const token = $("token").value;
  $("login-error").textContent = "";
  const answer = await call("POST", "/session", { token });
  $("token").value = "";
  if (!answer.ok) {
    setText($("login-error"), problemText(answer));
    return;
  }
  begin(answer.data);
}

async function logout() {
  await call("DELETE", "/session");
  state.role = state.csrf = null;
  showLogin("Logged out.");
}

function begin(session) {
  state.role = session.role;
  state.csrf = session.csrf;
  document.body.classList.toggle("admin", session.role === "admin");
  $("login").hidden = true;
  $("board").hidden = false;
  $("logout").hidden = false;
  $("live").hidden = false;
  $("live").textContent = "connecting";
  load();
  follow();
  loadTerminals();
}

// -- reading ------------------------------------------------------------------------------

async function load() {
  const answer = await call("GET", "/api/page");
  if (!answer.ok) return;
  const fresh = answer.data;
  // the event stream may have told us something newer while this answer was on its way
  const streamed = state.streamHealth;
  if (streamed && streamed.health.at > fresh.health.at) Object.assign(fresh, streamed);
  if (state.streamDoctor) fresh.doctor = state.streamDoctor;
  state.page = fresh;
  render();
}

function reloadSoon() {
  // sale steps come in bursts: one reload of the lists after the burst
  clearTimeout(state.reload);
  state.reload = setTimeout(load, 250);
}

async function loadTerminals() {
  const answer = await call("GET", "/api/terminals");
  if (!answer.ok) return; // capabilities stay "unknown"; the health still shows each terminal
  state.terminals = {};
  for (const terminal of answer.data.terminals) state.terminals[terminal.device_id] = terminal;
  if (state.page) renderTerminals();
}

function follow() {
  if (state.stream) state.stream.close();
  const stream = new EventSource("/api/events");
  state.stream = stream;
  stream.addEventListener("open", () => {
    $("live").textContent = "live";
    $("live").classList.add("on");
    if (state.lost) load(); // the lists come from the journal: whole again
  });
  stream.addEventListener("replayed", (event) => {
    const replayed = JSON.parse(event.data);
    if (state.lost) addEvent(replayed.at, `reconnected; ${state.fetched} event(s) missed were fetched`);
    state.lost = false;
    state.fetched = 0;
  });
  stream.addEventListener("error", async () => {
    state.lost = true;
    $("live").textContent = "reconnecting";
    $("live").classList.remove("on");
    if (stream.readyState === EventSource.CLOSED) {
      // refused (session gone?) rather than cut: ask once, then try again
      const answer = await call("GET", "/session");
      if (answer.ok && answer.data.role) setTimeout(follow, 2000);
      else showLogin("Your session ended; log in again.");
    }
  });
  // health, availability and the platforms' readers arrive together, whenever any changes:
  // every card is drawn from this one state, never from a list reloaded after a sale step
  stream.addEventListener("health", (event) => {
    const view = JSON.parse(event.data);
    state.streamHealth = view;
    if (!state.page) return;
    // a new day (midnight, a clock stepped): the lines read with the lists go with it
    const newDay = view.health.sales.day_started_at !== state.page.health.sales.day_started_at;
    // a problem come or gone may be a note on a sale (a late vend: no sale step, no list
    // reload otherwise): the lists are read again so the sale's line says it
    const problems = (health) => JSON.stringify(health.problems);
    const newProblems = problems(view.health) !== problems(state.page.health);
    Object.assign(state.page, view);
    renderHealth();
    if (newDay || newProblems) reloadSoon();
  });
  stream.addEventListener("note", (event) => {
    const note = JSON.parse(event.data);
    addEvent(note.at, note.text, /^problem/.test(note.text) ? "bad" : "");
  });
  stream.addEventListener("gap", (event) => {
    // this page fell behind the agent: say where its list of events has a hole
    const gap = JSON.parse(event.data);
    addEvent(gap.at, gap.text, "bad", { sale: "", step: "gap" });
    reloadSoon();  // the sales lists come from the journal: whole again
  });
  stream.addEventListener("sale", (event) => {
    const sale = JSON.parse(event.data);
    const key = [sale.sale_id, sale.step, sale.state, sale.at].join("|");
    if (state.shownSteps.has(key)) return; // shown before the stream was lost
    state.shownSteps.add(key);
    if (state.shownSteps.size > 1000) state.shownSteps.delete(state.shownSteps.values().next().value);
    if (sale.replayed) state.fetched += 1;
    // the step names what happened: three lines of one sale read as three different steps
    const what = [
      sale.terminal || sale.source, `sale ${sale.sale_id.slice(0, 8)}`, sale.step || sale.state,
      `→ ${sale.state}`, `· ${sale.money}`,
    ].join(" ");
    const said = sale.kind === "no_selection"  // not a sale, on every face (sales.kinds)
      ? `${what} · card session ended with no selection: not a sale` : what;
    addEvent(sale.at, sale.message ? `${said} · ${sale.message}` : said,
      sale.state === "attention" ? "bad" : "", { sale: sale.sale_id, step: sale.step });
    reloadSoon();
  });
  stream.addEventListener("doctor", (event) => {
    state.streamDoctor = JSON.parse(event.data);
    if (!state.page) return;
    state.page.doctor = state.streamDoctor;
    renderDoctor();
  });
}

function addEvent(at, text, css, data) {
  const list = $("events");
  const attrs = { class: css };
  if (data) Object.assign(attrs, { "data-sale": data.sale, "data-step": data.step });
  list.prepend(el("li", attrs, `${clock(at)} ${text}`));
  while (list.children.length > 100) list.lastChild.remove();
}

// -- drawing ------------------------------------------------------------------------------

function render() {
  renderHealth();
  renderSales(true);
  renderDoctor();
}

function renderHealth() {
  const page = state.page;
  const health = page.health;
  const pill = $("status");
  setText(pill, health.status);
  pill.className = `pill ${health.status}`; // one of ok, degraded, down: the agent's own word
  pill.hidden = false;

  // "1 of 2 readers can take cards": green only when every reader can, amber when some
  // cannot, red when none can; each one that cannot is named with why
  const available = page.availability;
  setText($("available"), available.summary);
  $("available").className = `big ${{ ok: "good", degraded: "warn", down: "bad" }[available.level]}`;
  $("available").dataset.level = available.level;
  $("unavailable").replaceChildren(...available.cannot.map((c) =>
    el("li", { class: available.level === "down" ? "bad" : "warn", "data-device": c.device_id },
      `${c.name ? `${c.name} (${c.device_id})` : c.device_id} cannot: ${c.reason}`,
      c.since ? el("span", { class: "muted" }, ` since ${when(c.since)}`) : null)));

  $("problems").replaceChildren(
    ...(health.problems.length
      ? health.problems.map((p) => el("li", { class: "bad" }, p))
      : [el("li", { class: "good" }, "none")]),
  );
  renderTerminals();
  renderUnit();
  renderService();
  renderAudit();
  const sales = health.sales;
  // completed sales, as `sales --since today --state completed` lists them (the demo's word)
  setText($("today"), `${sales.today_count} completed, ${page.today_amount}` +
    (page.today_given_back ? ` (${page.today_given_back})` : ""));
  setText($("footer"),
    `kiosk-agent ${health.version} · up ${duration(health.uptime_s)} · as of ${clock(health.at)}` +
    " · times are UTC (Z), as the command line prints them");
}

// the unit's id and the machine its journal was made on; while it is not confirmed here, a
// banner above everything: it takes no customer until a person runs the command shown
function renderUnit() {
  const unit = state.page.unit;
  if (!unit) return;
  $("unit-banner").hidden = unit.confirmed;
  setText($("unit-refusal"), unit.banner);
  $("unit-adopt").hidden = !unit.command;
  setText($("unit-command"), unit.command);
  fill($("unit"),
    el("dt", {}, "id"), el("dd", { "data-unit": "id" }, unit.id || "not known yet"),
    el("dt", {}, "journal made on"), el("dd", { "data-unit": "machine" }, unit.machine || "-"),
    unit.made_at ? [el("dt", {}, "since"), el("dd", {}, when(unit.made_at))] : null,
    el("dt", {}, "confirmed here"),
    el("dd", { class: unit.confirmed ? "good" : "bad", "data-unit": "confirmed" },
      unit.confirmed ? "yes" : "NO: takes no customer"));
}

function copyCommand() {
  const command = $("unit-command").textContent;
  const done = () => setText($("unit-copy"), "Copied");
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(command).then(done, () => selectCommand());
  } else {
    selectCommand(); // plain HTTP: no clipboard API; the command is selected to copy by hand
  }
}

function selectCommand() {
  const range = document.createRange();
  range.selectNodeContents($("unit-command"));
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
  setText($("unit-copy"), "Selected: copy it");
}

// the machine's own books (a dex: section): its last read, columns low or sold out, mismatches
function renderAudit() {
  const audit = state.page.health.audit;
  $("audit-card").hidden = !audit;
  if (!audit) return;
  const list = (names) => (names.length ? names.join(", ") : "none");
  const read = audit.last_read_at ? when(audit.last_read_at) : "none yet";
  fill($("audit"),
    el("dt", {}, "machine"), el("dd", {}, audit.machine),
    el("dt", {}, "last read"), el("dd", { "data-audit": "last-read" }, read),
    audit.failures ? [el("dt", {}, "reading"),
      el("dd", { class: "bad" }, `failing (${audit.failures} in a row): ${audit.detail}`)] : null,
    el("dt", {}, "sold out"), el("dd", { class: audit.sold_out.length ? "bad" : "", "data-audit": "sold-out" }, list(audit.sold_out)),
    el("dt", {}, "low"), el("dd", { class: audit.low.length ? "warn" : "", "data-audit": "low" }, list(audit.low)),
    el("dt", {}, "journal"),
    // a comparison not made checked nothing: never "no mismatch" in green beside it; nor after
    // the machine's books were reset (no mismatch, a new baseline, the interval not checked)
    el("dd", { class: audit.mismatches.length ? "bad" : audit.not_compared || audit.books_reset ? "warn" : "good", "data-audit": "mismatch" },
      audit.mismatches.length ? audit.mismatches.join("; ")
        : audit.not_compared ? "not checked: the latest read was not compared (below)"
        : audit.books_reset ? "no mismatch; not checked since the machine's books were reset (below)"
        : "no mismatch"),
    audit.not_compared ? [el("dt", {}, "compared"),
      el("dd", { class: "bad", "data-audit": "not-compared" }, audit.not_compared)] : null,
    // the machine's own books went back: no mismatch, a new baseline, said as the store holds it
    audit.books_reset ? [el("dt", {}, "books reset"),
      el("dd", { class: "warn", "data-audit": "books-reset" }, audit.books_reset)] : null);
}

function result(key) {
  const r = state.results[key];
  if (!r) return null;
  return el("p", { class: `result ${r.ok ? "good" : "bad"}`, role: "status", "data-result": key },
    `${clock(r.at)} ${r.text}`);
}

function actionButton(key, label, run, disabledReason, resultKey) {
  return el("button", {
    type: "button",
    class: "admin",
    "data-action": key,
    disabled: Boolean(state.busy[key] || disabledReason),
    title: disabledReason || null,
    onclick: () => act(key, run, resultKey),
  }, state.busy[key] ? `${label}…` : label);
}

async function act(key, run, resultKey) {
  // one current result per reader (or form): the newest answer replaces the last one
  const shownAt = resultKey || key;
  state.busy[key] = true;
  renderHealth();
  try {
    state.results[shownAt] = { ...(await run()), at: Date.now() / 1000 };
  } catch (err) {
    state.results[shownAt] = { ok: false, text: `failed: ${err}`, at: Date.now() / 1000 };
  } finally {
    delete state.busy[key];
    renderHealth();
    renderSales(true);
  }
}

function terminalAction(deviceId, action) {
  return async () => {
    const answer = await call("POST", `/api/terminals/${encodeURIComponent(deviceId)}/${action}`, {});
    if (!answer.ok) return { ok: false, text: `${deviceId}: ${problemText(answer)}` };
    const data = answer.data;
    if (action === "ping") {
      return data.online
        ? { ok: true, text: `${deviceId} answered` + (data.latency_ms === null ? "" : ` in ${Math.round(data.latency_ms)} ms`) }
        : { ok: false, text: `${deviceId} does not answer: check its power and network` };
    }
    if (action === "connect") {
      return { ok: Boolean(data.connected), text: `${deviceId}: session ${data.connected ? "open" : "not open"}` };
    }
    return { ok: true, text: `${deviceId} printed transaction ${data.trans_id}` };
  };
}

function renderTerminals() {
  const health = state.page.health;
  const nodes = health.terminals.map((t) => {
    const listed = state.terminals[t.device_id];
    const caps = listed ? listed.capabilities || {} : null;
    const online = t.online === null ? ["unchecked", "warn"] : t.online ? ["online", "ok"] : ["OFFLINE", "bad"];
    const capText = caps === null
      ? "capabilities unknown"
      : Object.entries(caps).filter(([, v]) => v).map(([k]) => k.replace(/_/g, " ")).join(", ") || "card payments only";
    const ping = t.last_ping_at
      ? `${clock(t.last_ping_at)}${t.latency_ms !== null ? ` (${Math.round(t.latency_ms)} ms)` : ""}`
      : "never";
    // what cannot work is disabled, and says why in words beside the buttons
    const offline = t.online === false ? "the reader is offline: Ping it once it has power and network" : null;
    const noPrinter = caps && !caps.receipt_printing ? "this terminal has no printer" : null;
    const key = (action) => `${t.device_id}:${action}`;
    const shown = `${t.device_id}:result`;
    return el("div", { class: "terminal", "data-device": t.device_id },
      el("h3", {}, t.name ? `${t.name} ` : "", el("span", { class: "muted" }, t.device_id),
        el("span", { class: `badge ${online[1]}`, "data-field": "online" }, online[0])),
      el("dl", { class: "facts" },
        el("dt", {}, "session"), el("dd", {}, t.connected ? "connected" : "not connected"),
        el("dt", {}, "last ping"), el("dd", {}, ping),
        el("dt", {}, "can"), el("dd", {}, capText),
        listed && listed.model ? [el("dt", {}, "model"), el("dd", {}, `${listed.vendor || ""} ${listed.model}`)] : null,
        t.detail ? [el("dt", {}, "detail"), el("dd", { class: "bad" }, t.detail)] : null),
      el("div", { class: "actions" },
        actionButton(key("ping"), "Ping", terminalAction(t.device_id, "ping"), null, shown),
        actionButton(key("connect"), "Connect", terminalAction(t.device_id, "connect"), offline, shown),
        actionButton(key("test-print"), "Test print", terminalAction(t.device_id, "test-print"),
          offline || noPrinter, shown)),
      offline ? el("p", { class: "muted", "data-field": "why-disabled" }, `Connect and Test print: ${offline}`) : null,
      result(shown));
  });
  $("terminals").replaceChildren(...(nodes.length ? nodes : [el("p", {}, "no terminal configured")]));
}

function renderService() {
  const health = state.page.health;
  const service = health.service;
  const reachable = service.reachable === null ? "not checked yet" : service.reachable ? "reachable" : "UNREACHABLE";
  let key = "unknown (or never expires)";
  if (service.key_expires_at) {
    key = `${when(service.key_expires_at)} (in ${duration(service.key_expires_at - Date.now() / 1000)})`;
  }
  fill($("service"),
    el("dt", {}, "service"), el("dd", { class: service.reachable === false ? "bad" : "" }, reachable),
    service.detail ? [el("dt", {}, "detail"), el("dd", {}, service.detail)] : null,
    el("dt", {}, "checked"), el("dd", {}, when(service.checked_at)),
    el("dt", {}, "API key expires"), el("dd", {}, key));
  const links = health.links.map((link) =>
    el("li", { class: link.healthy ? "" : "bad" }, `${link.name}: ${link.state}`,
      link.detail ? ` (${link.detail})` : "", el("span", { class: "muted" }, ` since ${when(link.since)}`)));
  // a platform the tech opened stays open when the list is redrawn (each health change)
  const opened = new Set([...$("links").querySelectorAll("li[data-platform] details[open]")]
    .map((d) => d.parentElement.dataset.platform));
  const platforms = (state.page.platforms || []).map((p) => {
    const status = p.status || {};
    const link = status.link && typeof status.link === "object" ? status.link.state : status.link;
    const headline = [
      status.cannot_start ? `NOT RUNNING: cannot start: ${status.cannot_start}` : null,
      status.available === false && !status.cannot_start
        ? `out of service: ${status.unavailable_reason || "no card payments"}` : null,
      status.reader ? `reader ${status.reader}` : null,
      status.controller ? `machine ${status.controller}` : null,
      link ? `link ${link}` : null,
      status.error ? `status unreadable: ${status.error}` : null,
    ].filter(Boolean).join(" · ") || "running";
    const facts = Object.entries(status)
      .filter(([k, v]) => !(k === "unavailable_reason" && !v))
      .flatMap(([k, v]) => [el("dt", {}, words(k)), el("dd", {}, factText(v, k))]);
    const css = status.cannot_start ? "bad" : status.available === false ? "warn" : "";
    return el("li", { "data-platform": p.name, class: css },
      el("details", { open: opened.has(p.name) }, el("summary", {}, `${p.name}: ${headline}`),
        el("dl", { class: "facts" }, facts)));
  });
  const all = [...links, ...platforms];
  $("links").replaceChildren(...(all.length ? all : [el("li", {}, "no serial link or platform")]));
}

function words(key) {
  return String(key).replace(/_/g, " ");
}

function factText(value, key) {
  // a platform's status value as words: no null, true, {} or Unix seconds in front of a tech
  if (value === null || value === undefined || value === "") return "none";
  if (value === true) return "yes";
  if (value === false) return "no";
  if (typeof value === "number" && /^since$|_at$/.test(key || "")) return when(value);
  if (Array.isArray(value)) return value.length ? value.map((v) => factText(v)).join(", ") : "none";
  if (typeof value === "object") {
    const entries = Object.entries(value);
    return entries.length ? entries.map(([k, v]) => `${words(k)}: ${factText(v, k)}`).join(", ") : "none";
  }
  return String(value);
}

function saleLine(sale) {
  // what was charged for a finished sale, what is held while it runs: never the price asked
  return `${when(sale.created_at)} · ${sale.terminal} · ${sale.money} · ${sale.state}` +
    (sale.product ? ` · ${sale.product}` : "");
}

function resolveForm(sale) {
  const key = `${sale.sale_id}:resolve`;
  const name = `as-${sale.sale_id}`;
  const form = el("form", { class: "resolve admin", "data-sale": sale.sale_id },
    el("fieldset", {},
      el("legend", { class: "muted" }, "What really happened to the money?"),
      el("label", { class: "choice" }, el("input", { type: "radio", name, value: "captured", required: true }), "Captured (paid)"),
      el("label", { class: "choice" }, el("input", { type: "radio", name, value: "reversed" }), "Reversed (given back)")),
    el("label", { for: `why-${sale.sale_id}` }, "Why"),
    el("input", { type: "text", id: `why-${sale.sale_id}`, name: "why", required: true, maxlength: 500 }),
    el("button", { type: "submit", disabled: Boolean(state.busy[key]) }, "Resolve"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const as = form.querySelector(`input[name="${CSS.escape(name)}"]:checked`).value;
    const why = form.querySelector("input[name=why]").value.trim();
    act(key, async () => {
      const answer = await call("POST", `/api/sales/${encodeURIComponent(sale.sale_id)}/resolve`, { as, why });
      if (!answer.ok) return { ok: false, text: `${sale.sale_id}: ${problemText(answer)}` };
      reloadSoon();
      return { ok: true, text: `${sale.sale_id} resolved as ${as}` };
    });
  });
  return [form, result(key)];
}

function editing(box) {
  // a tech typing a reason keeps the form: lists are redrawn around them only when forced
  return box.contains(document.activeElement) ||
    [...box.querySelectorAll("input[type=text]")].some((input) => input.value);
}

function renderSales(force) {
  if (force || !editing($("attention"))) renderAttention();
  renderOpenAndRecent();
}

function renderAttention() {
  const page = state.page;
  $("attention").replaceChildren(...(page.attention.length
    ? page.attention.map((s) => el("div", { class: "sale", "data-sale": s.sale_id },
      el("p", { class: "bad" }, saleLine(s)),
      s.why ? el("p", { class: "bad", "data-why": "not-this-units" }, s.why) : null,
      el("p", { class: "muted" }, `sale ${s.sale_id}`, s.trans_id ? ` · transaction ${s.trans_id}` : "", s.message ? ` · ${s.message}` : ""),
      resolveForm(s)))
    : [el("p", { class: "good" }, "none")]));
}

function renderOpenAndRecent() {
  const page = state.page;
  // a card-first machine's sessions no one chose in: not sales, counted apart (as `sales` says)
  setText($("sessions-apart"), page.no_selection_today || "");
  $("sessions-apart").hidden = !page.no_selection_today;
  // a sale whose steps the tech opened stays open when the list is redrawn
  const opened = new Set([...$("recent").querySelectorAll("details[open]")].map((d) => d.dataset.sale));
  $("open").replaceChildren(...(page.open.length
    ? page.open.map((s) => el("p", { class: "sale" }, saleLine(s)))
    : [el("p", { class: "muted" }, "none")]));
  $("recent").replaceChildren(...(page.recent.length
    ? page.recent.map((s) => el("details", { class: "sale", "data-sale": s.sale_id, open: opened.has(s.sale_id) },
      // a late vend's sale reads "reversed": the line says the product went out unpaid
      el("summary", { class: s.state === "attention" || s.late_vend ? "bad" : "" }, saleLine(s),
        s.late_vend ? el("span", { "data-late-vend": "" }, ` · ${s.late_vend}`) : null),
      el("p", { class: "muted" }, `sale ${s.sale_id}`, s.trans_id ? ` · transaction ${s.trans_id}` : "",
        s.card ? ` · ${s.card}` : "", s.message ? ` · ${s.message}` : ""),
      el("ol", { class: "steps" }, s.steps.map((step) =>
        el("li", {}, `${clock(step.at)} ${step.step} → ${step.state}`, stepDetail(step.detail))))))
    : [el("p", { class: "muted" }, "no sale yet")]));
}

function stepDetail(detail) {
  if (!detail || !Object.keys(detail).length) return null;
  // a detail is whatever a flow or platform wrote: its message may be no string at all
  const shown = (v) => (typeof v === "object" && v !== null ? JSON.stringify(v) : String(v));
  const text = typeof detail.message === "string" && detail.message
    ? detail.message
    : Object.entries(detail).map(([k, v]) => `${k}=${shown(v)}`).join(" ");
  return el("span", { class: "muted" }, ` ${text.slice(0, 160)}`);
}

function renderDoctor() {
  const doctor = state.page.doctor;
  const box = $("doctor");
  const button = $("run-doctor");
  button.disabled = Boolean(doctor.running || state.busy.doctor);
  button.textContent = button.disabled ? "Checking…" : "Run doctor checks";
  if (!doctor.finished_at) {
    box.replaceChildren(el("p", { class: "muted" }, doctor.running ? "checking…" : "not run yet"));
    return;
  }
  const failing = doctor.checks.filter((c) => c.verdict === "FAIL" || c.verdict === "WARN");
  const rest = doctor.checks.filter((c) => !failing.includes(c));
  const line = (c) => el("div", { class: "check", "data-check": c.name },
    el("span", { class: `badge ${{ PASS: "ok", FAIL: "bad", WARN: "warn" }[c.verdict] || ""}` }, c.verdict),
    ` ${c.name}`, c.detail ? `: ${c.detail}` : "",
    c.fix ? el("p", { class: "fix" }, `Fix: ${c.fix}`) : null,
    c.notes.length ? el("ul", {}, c.notes.map((n) => el("li", {}, n))) : null);
  // the agent runs them again when the health's problems change: the last run stays shown
  // until then, saying it is being checked again
  box.replaceChildren(
    el("p", { class: failing.length ? "bad" : "good", "data-field": "doctor-summary" },
      `${when(doctor.finished_at)}: ${doctor.failed} failed, ${doctor.checks.length} checked`,
      doctor.running ? el("span", { class: "muted" }, " · checking again…") : null),
    ...failing.map(line),
    rest.length ? el("details", {}, el("summary", {}, `${rest.length} passed or skipped`), rest.map(line)) : null,
  );
}

async function runDoctor() {
  state.busy.doctor = true;
  renderDoctor();
  try {
    // answered at once (202, the run under way): the stream brings its end, perhaps already
    const answer = await call("POST", "/api/doctor", {});
    const streamed = state.streamDoctor;
    const run = answer.ok ? answer.data.run : null;
    const ended = run && streamed && !streamed.running && streamed.started_at >= run.started_at;
    if (answer.ok && !ended) state.page.doctor = state.streamDoctor = answer.data;
  } finally {
    delete state.busy.doctor;
    renderDoctor();
  }
}

// -- start --------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", async () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  $("run-doctor").addEventListener("click", runDoctor);
  $("unit-copy").addEventListener("click", copyCommand);
  const answer = await call("GET", "/session");
  if (answer.ok && answer.data.role) begin(answer.data);
  else showLogin("");
});
