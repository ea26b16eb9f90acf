// gpuhop dashboard: one sweep. A table of its runs (their parameters, state, duration and
// metrics; sorted by any column), one chart per metric with every run's curve on it and one
// legend for them all, the best run by a chosen metric marked in both, and a button that
// cancels every run that has not ended.

import { LineChart } from "/ui/static/chart.js";
import {
  ApiError, FINISHED, api, badge, h, isMetric, jobDuration, jobHref, number, own, poll, replace,
  seconds, sweepName, sweepParams, topbar,
} from "/ui/static/common.js";

const COLOURS = 8; // as chart.js: a run's colour on every chart and in the legend

const ref = decodeURIComponent(window.location.pathname.split("/").pop());
const main = document.getElementById("main");
const title = h("h1", {}, `Sweep ${ref}`);
const cancel = h("button", { class: "danger", type: "button", id: "cancel-sweep", hidden: true, on: { click: onCancel } }, "Cancel sweep");
const table = h("div", { class: "table-wrap", id: "runs" });
const charts = h("div", { class: "charts", id: "charts" });
const chartNote = h("p", { class: "note", id: "chart-note" });
const legend = h("div", { class: "legend sweep-legend", id: "legend" });
const axis = h("select", { id: "x-axis", "aria-label": "x axis", on: { change: drawCharts } });
const rankBy = h("select", { id: "rank-by", "aria-label": "best run by", on: { change: () => { drawRuns(); drawCharts(); } } });

replace(main,
  h("div", { class: "toolbar" }, h("a", { href: "/ui/" }, "← Jobs")),
  h("div", { class: "job-head" }, title, h("span", { class: "spacer" }), cancel),
  h("section", { class: "panel" },
    h("div", { class: "log-head" }, h("h2", {}, "Runs"), h("span", { class: "spacer" }), h("label", {}, "best by ", rankBy)),
    table),
  h("section", { class: "panel" },
    h("div", { class: "log-head" }, h("h2", {}, "Metrics"), h("span", { class: "spacer" }), axis),
    legend, chartNote, charts));

let runs = [];
let now = 0;
// Which way a metric gets better: the agent's rule (gpuhop/api/metrics.py), asked once.
let rule = null;
let sort = { column: null, descending: false };
// Per run: its metrics records so far and the offset to read on from.
const metrics = new Map();
const chartsByName = new Map();

async function refresh() {
  if (rule === null) {
    const { lower, higher } = await api("/ui/api/metric-rule");
    rule = { lower: new RegExp(lower, "i"), higher: new RegExp(higher, "i") };
  }
  try {
    const found = await api(`/ui/api/jobs?sweep=${encodeURIComponent(ref)}&limit=2000`);
    now = found.now;
    runs = found.jobs.sort((a, b) => (a.created_at < b.created_at ? -1 : 1));
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) {
      replace(main, h("div", { class: "panel empty" }, `No sweep matches ${ref}. `, h("a", { href: "/ui/" }, "All jobs")));
      return false;
    }
    throw e;
  }
  for (const run of runs) await readMetrics(run);
  drawRuns();
  drawCharts();
  return !runs.every((r) => FINISHED.has(r.state));
}

async function readMetrics(run) {
  const got = metrics.get(run.id) || { records: [], offset: 0, done: false };
  metrics.set(run.id, got);
  if (got.done || run.state === "queued") return;
  const finished = FINISHED.has(run.state);
  for (;;) {
    const { records, next_offset: next } = await api(`/ui/api/jobs/${encodeURIComponent(run.id)}/metrics?offset=${got.offset}`);
    got.records.push(...records);
    const more = next !== got.offset && records.length >= 1000;
    got.offset = next;
    if (!more) break;
  }
  got.done = finished;
}

function recordsOf(run) {
  return (metrics.get(run.id) || { records: [] }).records;
}

function metricNames() {
  const names = [];
  for (const run of runs) {
    for (const r of recordsOf(run)) for (const [k, v] of Object.entries(r)) if (isMetric(k, v) && !names.includes(k)) names.push(k);
  }
  return names;
}

// The parameters that differ between runs: what tells one run from another.
function varying() {
  const params = runs.map((r) => sweepParams(r.name));
  const keys = [...new Set(params.flatMap((p) => [...p.keys()]))];
  const differ = keys.filter((k) => new Set(params.map((p) => p.get(k))).size > 1);
  return differ.length ? differ : keys;
}

function label(run, keys) {
  const p = sweepParams(run.name);
  const text = keys.filter((k) => p.has(k)).map((k) => `${k}=${p.get(k)}`).join(" ");
  return text || run.name || run.id;
}

// Whether more of a metric is better: not for a loss or an error, nor for a name the rule
// does not know.
function higherIsBetter(name) {
  return !rule.lower.test(name) && rule.higher.test(name);
}

// The metric runs are ranked by: the one picked, else val_loss, loss, or the first one.
function rankMetric(names) {
  const options = names.map((n) => `${n}`);
  if (options.join("\n") !== [...rankBy.options].map((o) => o.value).join("\n")) {
    const was = rankBy.value;
    replace(rankBy, options.map((n) => h("option", { value: n }, `${n} (${higherIsBetter(n) ? "highest" : "lowest"})`)));
    rankBy.value = names.includes(was) ? was : ["val_loss", "loss"].find((n) => names.includes(n)) || names[0] || "";
  }
  return rankBy.value || null;
}

// Each run's best value of `name` over its records (its lowest, or highest where more is
// better), and the run with the best of them.
function best(name) {
  const higher = higherIsBetter(name);
  const values = new Map();
  let top = null;
  for (const run of runs) {
    let value = null;
    for (const r of recordsOf(run)) {
      const v = own(r, name);
      if (typeof v === "number" && Number.isFinite(v) && (value === null || (higher ? v > value : v < value))) value = v;
    }
    values.set(run.id, value);
    if (value !== null && (top === null || (higher ? value > values.get(top) : value < values.get(top)))) top = run.id;
  }
  return { values, top };
}

function drawRuns() {
  document.title = `Sweep ${ref} · gpuhop`;
  replace(title, `Sweep ${sweepName(ref, runs)}`);
  cancel.hidden = runs.every((r) => FINISHED.has(r.state));
  const names = metricNames();
  const ranked = rankMetric(names);
  const { values, top } = ranked ? best(ranked) : { values: new Map(), top: null };
  const keys = varying();
  const params = new Map(runs.map((r) => [r.id, sweepParams(r.name)]));
  const latest = (run, name) => own(run.latest_metrics, name);
  // Each column: its heading, and a run's value in it (what it sorts by) and cell.
  const columns = [
    ["Run", (r) => runs.indexOf(r), (r, i) => h("span", { class: `run-key key${i % COLOURS}` },
      h("a", { href: jobHref(r.id) }, r.name || r.id), r.id === top ? h("span", { class: "best-mark", title: `best ${ranked}` }, " ★ best") : null)],
    ["Job", (r) => r.id, (r) => h("a", { class: "mono", href: jobHref(r.id) }, r.id)],
    ...keys.map((k) => [k, (r) => sortable(params.get(r.id).get(k)), (r) => params.get(r.id).get(k) ?? ""]),
    ["State", (r) => r.state, (r) => badge(r.state)],
    ["Duration", (r) => (r.started_at ? (seconds(r.ended_at) ?? now) - seconds(r.started_at) : null), (r) => jobDuration(r, now)],
    ranked ? [`best ${ranked}`, (r) => values.get(r.id), (r) => (values.get(r.id) === null ? "" : number(values.get(r.id)))] : null,
    ...names.filter((n) => n !== ranked).slice(0, 6).map((n) => [n, (r) => latest(r, n), (r) => (typeof latest(r, n) === "number" ? number(latest(r, n)) : "")]),
  ].filter(Boolean);
  const order = runs.map((r, i) => [r, i]);
  const by = columns.find(([name]) => name === sort.column);
  if (by) {
    order.sort(([a], [b]) => {
      const [x, y] = [by[1](a), by[1](b)];
      if (x === y) return 0;
      if (x === null || x === undefined) return 1; // no value: last, either way
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * (sort.descending ? -1 : 1);
    });
  }
  replace(table, h("table", { class: "sortable" },
    h("thead", {}, h("tr", {}, columns.map(([name]) => h("th", {
      "aria-sort": sort.column === name ? (sort.descending ? "descending" : "ascending") : null,
    }, h("button", {
      type: "button", class: "link sort", "data-column": name,
      on: { click: () => { sort = { column: name, descending: sort.column === name && !sort.descending }; drawRuns(); } },
    }, name, sort.column === name ? (sort.descending ? " ↓" : " ↑") : ""))))),
    h("tbody", {}, order.map(([run, i]) => h("tr", { "data-job": run.id, class: run.id === top ? "best" : null },
      columns.map(([name, , cell]) => h("td", { "data-label": name }, cell(run, i))))))));
}

// A parameter's value as it sorts: a number where it reads as one.
function sortable(value) {
  return value !== undefined && value !== "" && Number.isFinite(Number(value)) ? Number(value) : value;
}

function drawCharts() {
  const names = metricNames();
  chartNote.textContent = names.length ? ""
    : runs.length && runs.every((r) => FINISHED.has(r.state)) ? "These runs logged no metrics." : "No metrics yet.";
  // The x axis: the epoch where the runs log one (what a sweep's runs are compared by), else
  // the step, else each record's place in its file.
  const all = runs.flatMap(recordsOf);
  const axes = ["epoch", "step"].filter((k) => all.some((r) => typeof r[k] === "number"));
  axes.push("record");
  if (!axes.includes(axis.value) || axis.options.length !== axes.length) {
    const was = axis.value;
    replace(axis, axes.map((k) => h("option", { value: k }, `x: ${k}`)));
    axis.value = axes.includes(was) ? was : axes[0];
  }
  axis.hidden = !names.length;
  const keys = varying();
  const ranked = rankMetric(names);
  const top = ranked ? best(ranked).top : null;
  const topIndex = runs.findIndex((r) => r.id === top);
  replace(legend, runs.map((run, i) => h("span", { class: `key${i % COLOURS}`, "data-job": run.id },
    label(run, keys), run.id === top ? " ★" : "")));
  legend.hidden = !names.length;
  for (const name of names) {
    let chart = chartsByName.get(name);
    if (!chart) {
      chart = new LineChart({ title: name, name, legend: false });
      chartsByName.set(name, chart);
      charts.append(chart.el);
    }
    Object.assign(chart.o, { labels: runs.map((r) => label(r, keys)), xLabel: axis.value, best: topIndex });
    chart.setData(runs.map((run) => curve(recordsOf(run), name, axis.value)));
  }
}

// One run's points of a metric against `key` ("record": the record's place in its file). A
// record that has the metric but not the key is left out: its x is unknown.
function curve(records, name, key) {
  const points = [];
  records.forEach((r, i) => {
    if (!Object.hasOwn(r, name)) return;
    const x = key === "record" ? i : r[key];
    if (typeof x === "number") points.push([x, r[name]]);
  });
  return points;
}

async function onCancel() {
  const open = runs.filter((r) => !FINISHED.has(r.state)).length;
  if (!window.confirm(`Cancel sweep ${ref}? Its ${open} run${open === 1 ? "" : "s"} that have not ended get SIGTERM, and SIGKILL after 10 s.`)) return;
  cancel.disabled = true;
  try {
    ({ now, jobs: runs } = await api(`/ui/api/sweeps/${encodeURIComponent(ref)}/cancel`, { method: "POST" }));
    runs.sort((a, b) => (a.created_at < b.created_at ? -1 : 1));
    drawRuns();
  } catch (e) {
    window.alert(`Could not cancel: ${e.message}`);
  } finally {
    cancel.disabled = false;
  }
}

topbar("jobs");
poll(refresh, 3000);
