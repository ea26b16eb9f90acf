// gpuhop dashboard: one sweep. Every run with its state and latest metrics, and one chart
// per metric with every run's curve on it (a line per run, the legend naming the runs).

import { LineChart } from "/ui/static/chart.js";
import {
  ApiError, FINISHED, api, badge, h, isMetric, jobDuration, jobHref, metricsInline, poll,
  replace, topbar,
} from "/ui/static/common.js";

const ref = decodeURIComponent(window.location.pathname.split("/").pop());
const main = document.getElementById("main");
const title = h("h1", {}, `Sweep ${ref}`);
const table = h("div", { class: "table-wrap", id: "runs" });
const charts = h("div", { class: "charts", id: "charts" });
const chartNote = h("p", { class: "note" });

replace(main,
  h("div", { class: "toolbar" }, h("a", { href: "/ui/" }, "← Jobs")),
  h("div", { class: "job-head" }, title),
  h("section", { class: "panel" }, h("h2", {}, "Runs"), table),
  h("section", { class: "panel" }, h("h2", {}, "Metrics"), chartNote, charts));

let runs = [];
let now = 0;
// Per run: its metrics records so far and the offset to read on from.
const metrics = new Map();
const chartsByName = new Map();

async function refresh() {
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
  drawRuns();
  for (const run of runs) await readMetrics(run);
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

function drawRuns() {
  document.title = `Sweep ${ref} · gpuhop`;
  replace(table, h("table", {},
    h("thead", {}, h("tr", {}, ["Run", "Job", "State", "Duration", "Latest metrics"].map((c) => h("th", {}, c)))),
    h("tbody", {}, runs.map((run) => h("tr", { "data-job": run.id },
      h("td", {}, h("a", { href: jobHref(run.id) }, run.name || run.id)),
      h("td", { class: "mono" }, run.id),
      h("td", {}, badge(run.state)),
      h("td", {}, jobDuration(run, now)),
      h("td", {}, metricsInline(run.latest_metrics)))))));
}

function drawCharts() {
  const names = [];
  for (const got of metrics.values()) {
    for (const r of got.records) for (const [k, v] of Object.entries(r)) if (isMetric(k, v) && !names.includes(k)) names.push(k);
  }
  chartNote.textContent = names.length ? "" : "No metrics yet.";
  const labels = runs.map((r) => r.name || r.id);
  for (const name of names) {
    let chart = chartsByName.get(name);
    if (!chart) {
      chart = new LineChart({ title: name, name, labels });
      chartsByName.set(name, chart);
      charts.append(chart.el);
    }
    chart.o.labels = labels;
    chart.setData(runs.map((run) => curve((metrics.get(run.id) || { records: [] }).records, name)));
  }
}

// One run's points of a metric: x is the step where it logs one, else the epoch, else the
// record's place in its file.
function curve(records, name) {
  const key = records.some((r) => typeof r.step === "number") ? "step"
    : records.some((r) => typeof r.epoch === "number") ? "epoch" : null;
  const points = [];
  records.forEach((r, i) => {
    if (!(name in r)) return;
    const x = key ? r[key] : i;
    if (typeof x === "number") points.push([x, r[name]]);
  });
  return points;
}

topbar("jobs");
poll(refresh, 3000);
