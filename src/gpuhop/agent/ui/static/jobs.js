// gpuhop dashboard: the jobs page. A table of the jobs this user may see, newest first,
// filtered by state, refreshed every two seconds.

import {
  api, badge, gpuText, h, jobDuration, jobHref, metricsInline, poll, replace, topbar, when,
} from "/ui/static/common.js";

const FILTERS = [
  ["all", "All", null],
  ["active", "Active", ["queued", "starting", "running"]],
  ["queued", "Queued", ["queued"]],
  ["running", "Running", ["running"]],
  ["succeeded", "Succeeded", ["succeeded"]],
  ["failed", "Failed", ["failed", "lost"]],
  ["cancelled", "Cancelled", ["cancelled"]],
];

let filter = new URLSearchParams(window.location.search).get("state") || "all";
if (!FILTERS.some(([key]) => key === filter)) filter = "all";

const main = document.getElementById("main");
const buttons = h("div", { class: "segmented", role: "group", "aria-label": "Filter by state" });
const counts = h("span", { class: "muted" });
const body = h("div", { class: "panel table-wrap", id: "jobs" });
replace(main, h("div", { class: "toolbar" }, h("h1", {}, "Jobs"), buttons, h("span", { class: "spacer" }), counts), body);

function drawFilters() {
  replace(buttons, FILTERS.map(([key, label]) => h("button", {
    type: "button",
    "data-filter": key,
    "aria-pressed": key === filter ? "true" : "false",
    on: {
      click: () => {
        filter = key;
        const url = new URL(window.location.href);
        if (key === "all") url.searchParams.delete("state"); else url.searchParams.set("state", key);
        window.history.replaceState(null, "", url);
        drawFilters();
        refresh();
      },
    },
  }, label)));
}

async function refresh() {
  const states = FILTERS.find(([key]) => key === filter)[2];
  const query = new URLSearchParams();
  for (const s of states || []) query.append("state", s);
  const shown = filter;
  const { now, jobs } = await api(`/ui/api/jobs?${query}`);
  if (shown !== filter) return; // the filter changed while this was on its way
  counts.textContent = `${jobs.length} job${jobs.length === 1 ? "" : "s"}`;
  if (!jobs.length) {
    replace(body, h("div", { class: "empty" },
      filter === "all" ? ["No jobs yet. Start one with ", h("code", {}, "gpuhop run train.py"), "."]
        : "No jobs in this state."));
    return;
  }
  const rows = jobs.map((job) => h("tr", { class: "job-row", "data-job": job.id },
    h("td", {},
      h("a", { href: jobHref(job.id) },
        job.name ? h("div", { class: "jobname" }, job.name) : null,
        h("div", { class: "jobid" }, job.id))),
    h("td", {}, badge(job.state)),
    h("td", {}, job.owner || ""),
    h("td", { class: "num" }, gpuText(job)),
    h("td", { class: "num" }, when(job.started_at) || h("span", { class: "muted" }, "not yet")),
    h("td", { class: "num" }, jobDuration(job, now)),
    h("td", {}, metricsInline(job.latest_metrics)),
  ));
  replace(body, h("table", {},
    h("thead", {}, h("tr", {}, ["Job", "State", "User", "GPUs", "Started", "Duration", "Latest metrics"].map((c) => h("th", {}, c)))),
    h("tbody", {}, rows)));
}

drawFilters();
topbar("jobs");
poll(refresh, 2000);
