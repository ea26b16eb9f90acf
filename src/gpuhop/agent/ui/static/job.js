// gpuhop dashboard: one job. Its spec and attempts, the load and memory of the GPUs it holds,
// live charts of every metric in its metrics file (a metric and its val_ twin on one chart,
// with smoothing and a log scale), its log followed by byte offset, its artifacts (a
// directory of them, a SavedModel, as one zip), a cancel button, and a stacks button (every
// Python thread's stack in the running job's processes: py-spy dump).

import { LineChart } from "/ui/static/chart.js";
import {
  ApiError, FINISHED, api, badge, bytes, duration, gpuText, h, isMetric, jobDuration, mb,
  number, poll, replace, request, seconds, shellJoin, topbar, when,
} from "/ui/static/common.js";
import { GpuCard } from "/ui/static/gpucard.js";
import { renderTerminal } from "/ui/static/termtext.js";

const ref = decodeURIComponent(window.location.pathname.split("/").pop());
const base = `/ui/api/jobs/${encodeURIComponent(ref)}`;
const LOG_KEEP = 400_000; // characters of log kept on the page
const LOG_READ_MAX = 256 * 1024; // the agent's largest answer: a full one means more waits
const SECRET = /(secret|token|passw|api_?key|credential|private)/i;

let job = null;
let now = 0;
let tbRuns = []; // the dirs of TensorBoard event files the job wrote, as TensorBoard names its runs

const main = document.getElementById("main");
const title = h("h1", {});
const state = h("span", {});
const cancel = h("button", { class: "danger", type: "button", id: "cancel", hidden: true, on: { click: onCancel } }, "Cancel job");
const stacksButton = h("button", { type: "button", id: "stacks-button", hidden: true, on: { click: onStacks } }, "Stacks");
const stacksPanel = h("section", { class: "panel", hidden: true },
  h("h2", {}, "Stacks"), h("pre", { class: "log stacks", id: "stacks" }));
const sub = h("div", { class: "job-sub" });
// Where a running fit is: "epoch 3/5 · 12/45 · ETA 0:04" over a thin bar, as `run` says it.
const progressText = h("span", { id: "job-progress-text", class: "mono" });
const progressBar = h("div", { class: "bar" });
const progress = h("div", { class: "job-progress", id: "job-progress", hidden: true },
  progressText, h("div", { class: "track", role: "progressbar", "aria-label": "progress" }, progressBar));
const reason = h("div", { class: "reason", hidden: true });
const spec = h("div", { class: "panel" });
const side = h("div", { class: "panel" });
const axis = h("select", { id: "x-axis", "aria-label": "x axis", hidden: true, on: { change: drawCharts } });
// The chart settings a user picks stay for their next job page (W&B and TensorBoard keep them).
const saved = JSON.parse(window.localStorage.getItem("gpuhop.charts") || "{}");
const smoothing = h("input", {
  type: "range", id: "smoothing", min: 0, max: 0.99, step: 0.01, value: saved.smoothing || 0,
  "aria-label": "smoothing", on: { input: chartSettings },
});
const smoothingValue = h("span", { class: "mono" });
const logScale = h("input", { type: "checkbox", id: "log-scale", checked: Boolean(saved.log), on: { change: chartSettings } });
const chartControls = h("div", { class: "chart-controls", hidden: true },
  h("label", {}, "smoothing ", smoothing, " ", smoothingValue),
  h("label", {}, logScale, " log scale"),
  axis);
const gpuPanel = h("section", { class: "panel", id: "job-gpus", hidden: true });
const charts = h("div", { class: "charts", id: "charts" });
const chartNote = h("p", { class: "note", id: "chart-note" });
const worker = h("select", { "aria-label": "which log", hidden: true, on: { change: restartLog } });
const follow = h("input", { type: "checkbox", checked: true });
const logNote = h("span", { class: "note" });
const log = h("pre", { class: "log", id: "log", tabindex: 0 });
const artifacts = h("div", { class: "table-wrap", id: "artifacts" });

replace(main,
  h("div", { class: "toolbar" }, h("a", { href: "/ui/" }, "← Jobs")),
  h("div", { class: "job-head" }, title, state, h("span", { class: "spacer" }), stacksButton, cancel),
  sub, progress, reason, stacksPanel,
  h("div", { class: "grid two" }, spec, side),
  gpuPanel,
  h("section", { class: "panel" },
    h("div", { class: "log-head" }, h("h2", {}, "Metrics"), h("span", { class: "spacer" }), chartControls), chartNote, charts),
  h("section", { class: "panel" },
    h("div", { class: "log-head" }, h("h2", {}, "Log"), worker,
      h("label", {}, follow, " follow"), logNote),
    log),
  h("section", { class: "panel" }, h("h2", {}, "Artifacts"), artifacts));

// -- the job itself ---------------------------------------------------------------------------

async function refreshJob() {
  try {
    ({ now, job } = await api(base));
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) {
      replace(main, h("div", { class: "panel empty" }, `No job matches ${ref}. `, h("a", { href: "/ui/" }, "All jobs")));
      return false;
    }
    throw e;
  }
  drawJob();
  return !FINISHED.has(job.state);
}

function drawJob() {
  document.title = `${job.name || job.id} · gpuhop`;
  replace(title, job.name || job.id);
  replace(state, badge(job.state));
  cancel.hidden = FINISHED.has(job.state);
  stacksButton.hidden = job.state !== "running";
  replace(sub, h("span", { class: "mono" }, job.id), job.owner ? ` · ${job.owner}` : "",
    ` · created ${when(job.created_at)}`, job.started_at ? ` · ran ${jobDuration(job, now)}` : "");
  // How it ended; else why it waits, in the agent's words (as `run` and `show` say it).
  const ended = outcome(job) || (FINISHED.has(job.state) ? "" : job.waiting || "");
  reason.hidden = !ended;
  reason.className = `reason ${job.state}`;
  if (ended) replace(reason, ended);
  drawSpec();
  drawSide();
  drawProgress();
  if (worker.hidden && job.workers > 1) {
    replace(worker, h("option", { value: "" }, "all workers"),
      Array.from({ length: job.workers }, (_, i) => h("option", { value: String(i) }, `worker ${i}`)));
    worker.hidden = false;
  }
}

function outcome(j) {
  const parts = [];
  if (j.end_class) parts.push(j.end_class);
  if (j.reason) parts.push(j.reason);
  else if (j.exit_code !== null && j.exit_code !== undefined) parts.push(`exited with code ${j.exit_code}`);
  if (j.signal) parts.push(`signal ${j.signal}`);
  if (j.pruned_at) parts.push(`its files were removed by retention on ${when(j.pruned_at)}`);
  return parts.join("; ");
}

// The most GPU memory the job's framework had in use, by its own count (as `gpuhop show`).
function memoryText(job) {
  if (job.memory_peak_mb === null || job.memory_peak_mb === undefined) return null;
  const peak = mb(Math.round(job.memory_peak_mb));
  return job.gpu_memory_mb ? `peak ${peak} of a ${mb(job.gpu_memory_mb)} share` : `peak ${peak}`;
}

// The GPU energy and GPU time it used (as `gpuhop show` says them); never 0 where unknown.
function energyText(job) {
  const e = job.energy;
  if (!e) return null;
  const time = e.gpu_seconds === null || e.gpu_seconds === undefined ? null : `GPU time ${e.gpu_seconds.toFixed(1)} GPU-s`;
  if (!e.measured) return [`not measured (${e.why})`, time].filter(Boolean).join("; ");
  const kj = e.joules >= 1000 ? `${(e.joules / 1000).toFixed(1)} kJ` : `${e.joules.toFixed(1)} J`;
  const read = Object.keys(e.measured_by || {}).map(k => k === "energy counter" ? "NVML's energy counter" : k).join(" and ");
  const split = e.split_by || {};
  const [byLoad, equally] = [split.utilisation || 0, split.equal || 0];
  const how = byLoad || equally ? (byLoad >= equally ? ", split by utilisation" : ", split equally") : "";
  const parts = [`${kj} (${e.wh.toFixed(3)} Wh)`, time, read + how];
  if (e.attempts && e.attempts.length > 1) parts.push(`all ${e.attempts.length} attempts`);
  return parts.filter(Boolean).join("; ");
}

function fact(label, value) {
  return value === null || value === undefined || value === "" ? null : [h("dt", {}, label), h("dd", {}, value)];
}

function drawSpec() {
  replace(spec,
    h("h2", {}, "Spec"),
    h("pre", { class: "command", id: "command" }, shellJoin(job.command)),
    h("dl", { class: "facts" },
      fact("GPUs", gpuText(job)),
      fact("GPU share", job.gpu_memory_mb ? mb(job.gpu_memory_mb) : null),
      fact("GPU memory", memoryText(job)),
      fact("GPU energy", energyText(job)),
      fact("Workers", job.workers > 1 ? String(job.workers) : "1"),
      fact("Attempt", `${job.attempt} of ${job.retries + 1}`),
      fact("Priority", String(job.priority)),
      fact("After", job.after && job.after.length
        ? `${job.after.join(", ")} (${job.after_any ? "however they end" : "if all succeed"})` : null),
      fact("Waits for", job.waiting_for && job.waiting_for.length ? job.waiting_for.join(", ") : null),
      fact("Time limit", job.timeout ? `${job.timeout} s` : null),
      fact("Class", job.end_class),
      fact("Sweep", job.sweep ? h("a", { href: `/ui/sweeps/${encodeURIComponent(job.sweep)}` }, job.sweep) : null),
      fact("Data", job.data && job.data.length ? job.data.join(", ") : null),
      fact("Python env", job.python_env),
      fact("Python", job.python),
      fact("Network", job.private_network ? "private namespace" : null),
      fact("TensorBoard", tbRuns.length ? tensorboardText() : null),
      fact("Created", when(job.created_at)),
      fact("Started", when(job.started_at)),
      fact("Ended", when(job.ended_at)),
      fact("Duration", jobDuration(job, now)),
      fact("Exit", job.exit_code !== null && job.exit_code !== undefined ? `code ${job.exit_code}` : null)));
}

function tensorboardText() {
  const shown = tbRuns.slice(0, 3).join(", ") + (tbRuns.length > 3 ? ", …" : "");
  return [h("code", { id: "tensorboard" }, `gpuhop tensorboard ${job.id}`), ` shows ${shown}`];
}

function envValue(key, value) {
  if (!SECRET.test(key)) return value;
  const shown = h("span", { class: "secret" }, "••••••");
  const toggle = h("button", {
    class: "link", type: "button",
    on: { click: () => { replace(shown, value); shown.className = ""; toggle.remove(); } },
  }, "show");
  return [shown, " ", toggle];
}

function drawSide() {
  const env = Object.entries(job.env || {});
  const attempts = [...(job.attempts || []), {
    attempt: job.attempt, state: job.state, started_at: job.started_at, ended_at: job.ended_at,
    exit_code: job.exit_code, signal: job.signal, reason: job.reason, end_class: job.end_class,
  }];
  replace(side,
    h("h2", {}, "Environment"),
    env.length
      ? h("div", { class: "table-wrap" }, h("table", { id: "env" }, h("tbody", {},
        env.map(([k, v]) => h("tr", {}, h("td", { class: "mono" }, k), h("td", { class: "mono" }, envValue(k, v)))))))
      : h("p", { class: "note" }, "No variables set with -e."),
    h("h2", { class: "spaced" }, "Attempts"),
    h("div", { class: "table-wrap" }, h("table", { id: "attempts" },
      h("thead", {}, h("tr", {}, ["#", "State", "Started", "Ran", "Outcome"].map((c) => h("th", {}, c)))),
      h("tbody", {}, attempts.map((a) => h("tr", {},
        h("td", {}, String(a.attempt)), h("td", {}, badge(a.state)), h("td", { class: "num" }, when(a.started_at)),
        h("td", { class: "num" }, a.started_at ? duration((seconds(a.ended_at) ?? now) - seconds(a.started_at)) : ""),
        h("td", {}, outcome(a))))))));
}

async function onCancel() {
  const label = job.name ? `${job.name} (${job.id})` : job.id;
  if (!window.confirm(`Cancel job ${label}? Its processes get SIGTERM, and SIGKILL after 10 s.`)) return;
  cancel.disabled = true;
  try {
    ({ now, job } = await api(`${base}/cancel`, { method: "POST" }));
    drawJob();
  } catch (e) {
    window.alert(`Could not cancel: ${e.message}`);
  } finally {
    cancel.disabled = false;
  }
}

async function onStacks() {
  stacksButton.disabled = true;
  const out = stacksPanel.querySelector("pre");
  try {
    // py-spy reads each process for up to 20 s (host/pyspy.py): more than a poll's wait.
    const { processes } = await api(`${base}/stacks`, { timeout: 120_000 });
    out.textContent = processes.map((p) => (p.worker === null ? "" : `worker ${p.worker}\n`)
      + (p.stacks ?? `process ${p.pid}: ${p.command}: ${p.error}\n`)).join("\n")
      || "No processes left to show (the job may be ending).";
  } catch (e) {
    out.textContent = `Could not get the stacks: ${e.message}`;
  } finally {
    stacksPanel.hidden = false;
    stacksButton.disabled = false;
  }
}

// Where the fit is, from the metrics records as `gpuhop run`'s status line reads them
// (cli/progress.py): the epoch of the latest record (of the latest source) and the planned
// number; a progress record ({"progress": 1, "epoch_step", "epoch_steps", "eta"}: runtime/
// callbacks.py) says where the epoch is, until a record of that epoch's end follows it.
function fitProgress() {
  let source, epoch = null, epochs = null, within = null;
  for (const r of records) {
    if (typeof r.source === "string" && r.source !== source) {
      source = r.source;
      epoch = epochs = within = null;
    }
    if (Number.isInteger(r.epoch)) epoch = r.epoch;
    if (Number.isInteger(r.epochs)) epochs = r.epochs;
    if ("progress" in r) within = r;
    else if (within !== null && epoch === within.epoch) within = null;
  }
  return { epoch, epochs, within };
}

function clock(s) {
  s = Math.max(0, Math.round(s));
  const two = (n) => String(n).padStart(2, "0");
  return s < 3600 ? `${Math.floor(s / 60)}:${two(s % 60)}` : `${Math.floor(s / 3600)}:${two(Math.floor(s / 60) % 60)}:${two(s % 60)}`;
}

function drawProgress() {
  const { epoch, epochs, within } = fitProgress();
  progress.hidden = job === null || job.state !== "running" || epoch === null;
  if (progress.hidden) return;
  const parts = [`epoch ${epoch}${epochs ? `/${epochs}` : ""}`];
  const steps = within !== null && Number.isInteger(within.epoch_steps) && within.epoch_steps > 0 ? within.epoch_steps : null;
  if (steps !== null) {
    parts.push(`${within.epoch_step}/${steps}`);
    if (typeof within.eta === "number" && typeof within.time === "number") parts.push(`ETA ${clock(within.eta - (now - within.time))}`);
  }
  progressText.textContent = parts.join(" · ");
  // The share of the fit done: whole epochs before this one, and this one's steps.
  const inEpoch = steps !== null ? Math.min(1, within.epoch_step / steps) : 1;
  const done = epochs ? Math.min(1, Math.max(0, (epoch - 1 + inEpoch) / epochs)) : null;
  progressBar.parentElement.hidden = done === null;
  progressBar.style.width = `${((done ?? 0) * 100).toFixed(1)}%`;
  progressBar.parentElement.setAttribute("aria-valuenow", String(Math.round((done ?? 0) * 100)));
}

// -- metrics ----------------------------------------------------------------------------------

const records = [];
const chartsByName = new Map();
let metricsOffset = 0;

async function refreshMetrics() {
  const finishedBefore = job !== null && FINISHED.has(job.state);
  let got = 0;
  for (;;) {
    const { records: fresh, next_offset: next } = await api(`${base}/metrics?offset=${metricsOffset}`);
    records.push(...fresh);
    got += fresh.length;
    const more = next !== metricsOffset && fresh.length > 0;
    metricsOffset = next;
    if (!more || fresh.length < 1000) break;
  }
  if (got || !chartsByName.size) drawCharts();
  if (job !== null) drawProgress();
  // Once the job had ended before a read that found nothing new, the file is complete.
  return !(finishedBefore && got === 0);
}

function chartSettings() {
  window.localStorage.setItem("gpuhop.charts", JSON.stringify({ smoothing: Number(smoothing.value), log: logScale.checked }));
  drawCharts();
}

// The charts to draw: one per metric of each source (a fit's loss and a custom loop's loss
// are two), with a metric's val_ twin of the same source on its chart, as Keras logs them.
// title -> { name, source, keys: [the metric, its val_ twin if any] }
function chartList() {
  const found = new Map();
  for (const r of records) {
    for (const [k, v] of Object.entries(r)) {
      if (!isMetric(k, v)) continue;
      const id = JSON.stringify([k, r.source]);
      if (!found.has(id)) found.set(id, [k, r.source]);
    }
  }
  const out = new Map();
  for (const [k, source] of found.values()) {
    const train = k.startsWith("val_") ? k.slice(4) : null;
    const base = train !== null && found.has(JSON.stringify([train, source])) ? train : k;
    const title = typeof source === "string" ? `${base} (${source})` : base;
    if (!out.has(title)) out.set(title, { name: base, source, keys: [] });
    if (!out.get(title).keys.includes(k)) out.get(title).keys.push(k);
  }
  for (const chart of out.values()) chart.keys.sort((a, b) => a.startsWith("val_") - b.startsWith("val_"));
  return out;
}

function drawCharts() {
  const axes = ["step", "epoch"].filter((k) => records.some((r) => typeof r[k] === "number"));
  axes.push("time");
  if (!axes.includes(axis.value)) {
    replace(axis, axes.map((k) => h("option", { value: k }, `x: ${k}`)));
    axis.value = axes[0];
  }
  chartControls.hidden = records.length === 0;
  smoothingValue.textContent = Number(smoothing.value).toFixed(2);
  const xKey = axis.value || axes[0];
  const t0 = records.length ? records[0].time : 0;
  const list = chartList();
  if (list.size) chartNote.textContent = "";
  else if (job !== null && FINISHED.has(job.state)) chartNote.textContent = "This job logged no metrics.";
  else chartNote.textContent = "No metrics yet. Log them with gpuhop.runtime.log_metrics(step=..., loss=...) or the Keras callback in gpuhop.tf.";
  const unplaced = [];
  for (const [title, { name, source, keys }] of list) {
    let chart = chartsByName.get(title);
    if (!chart) {
      chart = new LineChart({ title, name, xLabel: xKey });
      chartsByName.set(title, chart);
      charts.append(chart.el);
    }
    Object.assign(chart.o, {
      xLabel: xKey, xFormat: xKey === "time" ? duration : number, labels: keys,
      smoothing: Number(smoothing.value), yLog: logScale.checked,
    });
    const series = keys.map((key) => {
      const points = [];
      for (const r of records) {
        if (!Object.hasOwn(r, key) || r.source !== source) continue;
        const x = xKey === "time" ? r.time - t0 : r[xKey];
        if (typeof x === "number") points.push([x, r[key]]);
      }
      return points;
    });
    chart.setData(series);
    // A metric logged with no step or epoch (the hook's memory readings) has no place on
    // those axes: named below the charts rather than drawn empty.
    chart.el.hidden = series.every((points) => !points.length);
    if (chart.el.hidden) unplaced.push(title);
  }
  if (unplaced.length) chartNote.textContent = `Logged without a ${xKey}: ${unplaced.join(", ")} (x: time shows them).`;
}

// -- the GPUs it holds ------------------------------------------------------------------------

const gpuCards = new Map();

// While it runs, the load and memory of the job's own GPUs (what `gpuhop gpus` reads), and
// how much of each its processes use.
async function refreshGpus() {
  if (job === null) return true;
  const held = new Set(job.gpu_ids || []);
  if (FINISHED.has(job.state) || !held.size) {
    gpuPanel.hidden = true;
    return !FINISHED.has(job.state);
  }
  const { now: at, gpus, history } = await api("/ui/api/gpus");
  const mine = gpus.filter((g) => held.has(g.index));
  if (!gpuPanel.childNodes.length) {
    replace(gpuPanel, h("h2", {}, mine.length > 1 ? "Its GPUs" : "Its GPU"), h("div", { class: "gpus" }));
  }
  for (const gpu of mine) {
    let c = gpuCards.get(gpu.index);
    if (!c) {
      c = new GpuCard(gpu, job.id);
      gpuCards.set(gpu.index, c);
      gpuPanel.lastChild.append(c.el);
    }
    c.draw(gpu, at, history);
  }
  gpuPanel.hidden = !mine.length;
  return true;
}

// -- the log ----------------------------------------------------------------------------------

let logOffset = null;
let decoder = new TextDecoder();
let logText = "";
let logGeneration = 0;

function restartLog() {
  logOffset = null;
  decoder = new TextDecoder();
  logText = "";
  log.textContent = "";
  logGeneration += 1;
  followLog(logGeneration);
}

async function readLog() {
  const params = new URLSearchParams();
  if (logOffset !== null) params.set("offset", String(logOffset));
  if (worker.value) params.set("worker", worker.value);
  const response = await request(`${base}/log?${params}`);
  const start = Number(response.headers.get("X-Log-Start"));
  const data = await response.arrayBuffer();
  if (logOffset === null) {
    logNote.textContent = start > 0 ? `showing the end; ${bytes(start)} before it not shown` : "";
  }
  logOffset = Number(response.headers.get("X-Log-Next"));
  if (data.byteLength) {
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
    logText += decoder.decode(data, { stream: true });
    if (logText.length > LOG_KEEP) {
      logText = logText.slice(logText.length - LOG_KEEP);
      logNote.textContent = "showing the end of the log";
    }
    log.textContent = renderTerminal(logText); // a progress bar's last frame, no escapes
    if (follow.checked && atBottom) log.scrollTop = log.scrollHeight;
  }
  return data.byteLength;
}

function followLog(generation) {
  poll(async () => {
    if (generation !== logGeneration) return false;
    const finishedBefore = job !== null && FINISHED.has(job.state);
    let got;
    try {
      do got = await readLog(); while (got >= LOG_READ_MAX);
    } catch (e) {
      if (e instanceof ApiError && e.status !== 401) {
        logNote.textContent = e.message;
        return false;
      }
      throw e;
    }
    if (!logText && finishedBefore) log.textContent = "(no output)";
    // Once the job had ended before a read that found nothing more, the log is complete.
    return !(finishedBefore && got === 0);
  }, 1000);
}

// -- artifacts --------------------------------------------------------------------------------

async function refreshArtifacts() {
  const finishedBefore = job !== null && FINISHED.has(job.state);
  let list;
  try {
    list = await api(`${base}/artifacts`);
  } catch (e) {
    if (e instanceof ApiError && e.status === 410) {
      replace(artifacts, h("p", { class: "note" }, e.message));
      return false;
    }
    throw e;
  }
  const runs = (await api(`${base}/tensorboard`)).runs;
  if (runs.join("\n") !== tbRuns.join("\n")) {
    tbRuns = runs;
    if (job !== null) drawSpec();
  }
  if (!list.length) {
    replace(artifacts, h("p", { class: "note" }, "Nothing yet. Files the job writes to $GPUHOP_ARTIFACTS_DIR show up here."));
  } else {
    const modified = (mtime) => when(new Date(mtime * 1000).toISOString());
    replace(artifacts,
      h("p", {}, h("a", { href: `${base}/archive`, download: true, id: "artifacts-zip" }, "Download all as .zip")),
      h("table", {},
      h("thead", {}, h("tr", {}, ["File", "Size", "Modified"].map((c) => h("th", {}, c)))),
      h("tbody", {}, archiveDirs(list).map((d) => h("tr", { "data-dir": d.path },
        h("td", {},
          h("a", { href: `${base}/archive/${d.path.split("/").map(encodeURIComponent).join("/")}`, download: true }, `${d.path}/ (.zip)`),
          " ", h("span", { class: "muted" }, d.savedModel ? "SavedModel · " : "", `${d.files} file${d.files === 1 ? "" : "s"}`)),
        h("td", { class: "num" }, bytes(d.size)),
        h("td", { class: "num" }, modified(d.mtime)))),
      list.map((a) => h("tr", {},
        h("td", {}, h("a", {
          // A name that is not UTF-8 comes percent-encoded as `raw` (see ArtifactEntry).
          href: `${base}/artifacts/${a.raw ?? a.path.split("/").map(encodeURIComponent).join("/")}`,
          download: a.path.split("/").pop(),
        }, a.path)),
        h("td", { class: "num" }, bytes(a.size)),
        h("td", { class: "num" }, modified(a.mtime)))))));
  }
  return !finishedBefore;
}

// The directories offered as one zip: each at the top of the artifacts, and each SavedModel
// (a directory holding saved_model.pb) wherever it is. Names that are not UTF-8 (`raw`) are
// left to their files' own links.
function archiveDirs(list) {
  const files = list.filter((f) => !f.raw);
  const models = new Set(files.filter((f) => f.path.endsWith("/saved_model.pb")).map((f) => f.path.slice(0, -"/saved_model.pb".length)));
  const dirs = new Map();
  for (const a of files) {
    const parts = a.path.split("/");
    for (let i = 1; i < parts.length; i += 1) {
      const path = parts.slice(0, i).join("/");
      if (i > 1 && !models.has(path)) continue;
      const d = dirs.get(path) || { path, files: 0, size: 0, mtime: 0, savedModel: models.has(path) };
      d.files += 1;
      d.size += a.size;
      d.mtime = Math.max(d.mtime, a.mtime);
      dirs.set(path, d);
    }
  }
  return [...dirs.values()].sort((x, y) => (x.path < y.path ? -1 : 1));
}

topbar("jobs");
poll(refreshJob, 2000);
poll(refreshMetrics, 2000);
poll(refreshArtifacts, 5000);
poll(refreshGpus, 3000);
restartLog();
