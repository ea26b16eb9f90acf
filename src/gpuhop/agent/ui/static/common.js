// gpuhop dashboard: what every page shares. Everything shown is built with DOM calls and
// text nodes (no HTML parsing of strings): job names, logs and env values are user input.

export const FINISHED = new Set(["succeeded", "failed", "cancelled", "lost"]);

// h("a", {href: "/ui/gpus", class: "x"}, "text", child) -> an element. Strings become text.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "on") for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
    else if (key === "href") el.setAttribute("href", safeHref(value));
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

// Links only ever lead within the dashboard.
function safeHref(value) {
  const text = String(value);
  return text.startsWith("/ui/") ? text : "#";
}

export function jobHref(id) {
  return `/ui/jobs/${encodeURIComponent(id)}`;
}

// The dashboard's own header on every request: the agent refuses a change without it,
// and another site cannot add it to a request without a CORS preflight (never approved).
const HEADERS = { "X-Gpuhop-UI": "1" };

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// -- contact with the agent ------------------------------------------------------------------
// A request that gets no answer from the agent (it stopped; `gpuhop ui`, its SSH tunnel or
// the network is down) marks the page: a banner says since when, and what the page shows is
// greyed as of then. The polls go on, and the first answer after takes both away: the page
// carries on from where it was (logs and metrics by offset).

// A poll's request that is still unanswered after this long has lost the agent: a dropped
// network may leave it waiting for minutes, and the page must not wait as long to say so.
const REQUEST_TIMEOUT_MS = 20_000;
// The statuses a proxy on the way (`gpuhop ui`'s own, or any other) answers in its own
// words when it cannot reach the agent; the agent's own answers are JSON.
const GATEWAY = new Set([502, 503, 504]);

export class ContactLost extends Error {}

let lostSince = null;
let banner = null;

function clockTime(date) {
  return [date.getHours(), date.getMinutes(), date.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}

function lost(why) {
  if (lostSince === null) lostSince = new Date();
  if (banner === null) {
    banner = h("div", { class: "contact-lost", id: "contact-lost", role: "alert" });
    document.body.insertBefore(banner, document.getElementById("main"));
  }
  replace(banner,
    h("b", {}, `Lost contact with the agent since ${clockTime(lostSince)}; retrying.`),
    " What the page shows is as of then.",
    why ? h("span", { class: "why", id: "contact-why" }, why) : null);
  document.body.classList.add("stale");
}

function regained() {
  if (lostSince === null) return;
  lostSince = null;
  banner.remove();
  banner = null;
  document.body.classList.remove("stale");
}

// fetch() with the dashboard's header; `timeout` (ms, 0 for none) bounds the wait for an
// answer. No answer throws ContactLost (and marks the page); 401 reloads the page (which then
// says how to log in); any other failure throws ApiError with the agent's message.
export async function request(path, options = {}) {
  const { timeout = REQUEST_TIMEOUT_MS, ...rest } = options;
  const abort = new AbortController();
  const timer = timeout ? setTimeout(() => abort.abort(), timeout) : null;
  let response;
  try {
    response = await fetch(path, {
      credentials: "same-origin",
      cache: "no-store",
      ...rest,
      headers: { ...HEADERS, ...(rest.headers || {}) },
      signal: abort.signal,
    });
  } catch (e) {
    const why = abort.signal.aborted ? `No answer within ${timeout / 1000} s.` : "";
    lost(why);
    throw new ContactLost(`lost contact with the agent${why ? `: ${why}` : ""}`);
  } finally {
    clearTimeout(timer);
  }
  if (GATEWAY.has(response.status) && !(response.headers.get("content-type") || "").startsWith("application/json")) {
    // The proxy's words: `gpuhop ui` says why it cannot reach the agent.
    const why = (await response.text().catch(() => "")).trim().slice(0, 500);
    lost(why);
    throw new ContactLost(`lost contact with the agent${why ? `: ${why}` : ""}`);
  }
  regained();
  if (response.status === 401) {
    // The session ended (expired, logged out, agent restarted): the page says how to log in.
    window.location.reload();
    throw new ApiError(401, "not logged in");
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body && body.message) message = body.message;
    } catch (e) {
      // not JSON: keep the status line
    }
    throw new ApiError(response.status, message);
  }
  return response;
}

export async function api(path, options) {
  return (await request(path, options)).json();
}

// Run `fn` now and then every `ms` while it returns true; slower while the tab is hidden.
// Through a lost contact it goes on (the banner says so), to carry on once the agent answers.
export function poll(fn, ms) {
  let stopped = false;
  const tick = async () => {
    let again = true;
    try {
      again = (await fn()) !== false;
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) return;
      if (!(e instanceof ContactLost)) console.error(e);
    }
    if (again && !stopped) setTimeout(tick, document.hidden ? ms * 5 : ms);
  };
  tick();
  return () => { stopped = true; };
}

export function badge(state) {
  return h("span", { class: `badge state-${state}`, "data-state": state }, state);
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const hrs = Math.floor(m / 60);
  if (hrs < 48) return `${hrs}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(hrs / 24)}d ${hrs % 24}h`;
}

export function seconds(iso) {
  return iso ? Date.parse(iso) / 1000 : null;
}

// How long a job ran, or has run so far, by the agent's clock (`now`).
export function jobDuration(job, now) {
  const start = seconds(job.started_at);
  if (start === null) return "";
  const end = seconds(job.ended_at) ?? now;
  return duration(end - start);
}

export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const today = new Date();
  const sameDay = d.toDateString() === today.toDateString();
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return sameDay ? time : `${d.toLocaleDateString([], { month: "short", day: "numeric" })} ${time}`;
}

// How long before the agent's `now` (seconds) a moment was: "just now", "5 min ago",
// "3 h ago", "2 d ago"; its full date and time goes in a title, shown on hover.
export function ago(iso, now) {
  const then = seconds(iso);
  if (then === null) return "";
  const s = Math.max(0, now - then);
  if (s < 45) return "just now";
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 48 * 3600) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

export function fullDate(iso) {
  return iso ? new Date(iso).toLocaleString([], { dateStyle: "medium", timeStyle: "medium" }) : "";
}

// A date as "5 min ago", the full date on hover.
export function dateCell(iso, now) {
  return iso ? h("time", { datetime: iso, title: fullDate(iso) }, ago(iso, now)) : null;
}

// A command as a shell would take it back (Python's shlex.join).
export function shellJoin(args) {
  return args.map((arg) => (arg !== "" && /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, "'\"'\"'")}'`)).join(" ");
}

// A sweep's run is named NAME[k=v,k2=v2] (gpuhop/client/sweeps.py): its values, in order,
// in a Map (a parameter's name is the user's: "constructor" is one a plain object has).
export function sweepParams(name) {
  const found = /\[([^\]]*)\]$/.exec(name || "");
  if (!found) return new Map();
  return new Map(found[1].split(",").map((kv) => kv.split("=", 2)).filter((kv) => kv.length === 2));
}

// The sweep's name: its runs' names before the brackets, else its id.
export function sweepName(sweep, runs) {
  const named = runs.map((r) => /^(.*)\[[^\]]*\]$/.exec(r.name || "")).find(Boolean);
  return named ? named[1] : sweep;
}

export function number(value) {
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) return value.toExponential(3);
  return String(Number(value.toPrecision(4)));
}

export function bytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

export function mb(n) {
  return n >= 1024 ? `${(n / 1024).toFixed(1)} GiB` : `${n} MiB`;
}

// The GPUs column: which GPUs a job holds, or what it waits for.
export function gpuText(job) {
  if (job.gpu_ids && job.gpu_ids.length) {
    const ids = `GPU${job.gpu_ids.length > 1 ? "s" : ""} ${job.gpu_ids.join(", ")}`;
    return job.gpu_memory_mb ? `${ids} (${mb(job.gpu_memory_mb)})` : ids;
  }
  if (job.gpu_memory_mb) return `${mb(job.gpu_memory_mb)} share`;
  return job.gpus ? `${job.gpus} GPU${job.gpus > 1 ? "s" : ""} (asked)` : "CPU";
}

// "source" names a record's phase: "fit:MODEL" (a Keras fit), "summary:LOGDIR" (tf.summary).
// A record's keys that describe it (a fit's progress records, runtime/callbacks.py, too).
const META = new Set(["time", "step", "epoch", "epochs", "source", "progress", "epoch_step", "epoch_steps", "eta"]);

// A job's latest metrics, inline: "epoch 3  step 120  loss 0.2311  accuracy 0.91  (fit:model)".
export function metricsInline(latest, max = 5) {
  if (!latest) return "";
  const parts = [];
  for (const key of ["epoch", "step"]) if (key in latest) parts.push([key, latest[key]]);
  for (const [key, value] of Object.entries(latest)) {
    if (!META.has(key) && parts.length < max + 2) parts.push([key, value]);
  }
  const source = typeof latest.source === "string" ? `  (from ${latest.source})` : "";
  return h("span", { class: "metrics-inline" },
    parts.map(([k, v], i) => [i ? "  " : "", `${k} `, h("b", {}, number(v))]), source);
}

// A record's value of `key`, a name the job chose: its own, never one every object inherits
// (a metric named "constructor" or "toString" that this record lacks is not in it).
export function own(record, key) {
  return record && Object.hasOwn(record, key) ? record[key] : undefined;
}

export function isMetric(key, value) {
  return !META.has(key) && (typeof value === "number" || value === null);
}

// The top bar: brand, pages, who is logged in, log out.
export async function topbar(active) {
  const who = h("div", { class: "who" });
  const link = (href, label, name) =>
    h("a", { href, class: active === name ? "active" : null, "aria-current": active === name ? "page" : null }, label);
  const bar = h("div", { class: "topbar" },
    h("a", { class: "brand", href: "/ui/" }, "gpuhop", h("span", { class: "dot" }, " ·"), " dashboard"),
    h("nav", {}, link("/ui/", "Jobs", "jobs"), link("/ui/gpus", "GPUs", "gpus")),
    who);
  replace(document.getElementById("top"), bar);
  const me = await api("/ui/api/me");
  const logout = h("button", {
    class: "link",
    on: {
      click: async () => {
        await request("/ui/api/logout", { method: "POST" }).catch(() => {});
        window.location.reload();
      },
    },
  }, "Log out");
  replace(who,
    h("span", { class: "hide-narrow" }, `gpuhop ${me.version}`),
    h("span", { "data-user": me.user }, me.user),
    me.admin ? h("span", { class: "admin-badge" }, "admin") : null,
    logout);
  return me;
}
