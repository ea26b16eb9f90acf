// gpuhop dashboard: the jobs page. A table of the jobs this user may see, newest first,
// filtered by state, refreshed every two seconds; a sweep's runs folded under one line for
// the sweep. It lists the newest 200 and says so where there are more, with a button for
// more (up to the agent's 2000). On a phone each job is a card of its cells (style.css).

import {
  api, badge, dateCell, gpuText, h, jobDuration, jobHref, metricsInline, poll, replace, shellJoin,
  sweepName, topbar,
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

// How many of the newest jobs are listed at first, each "Show more" adds, and at most (the
// agent's limit for /ui/api/jobs).
const PAGE = 200;
const MOST = 2000;
let limit = PAGE;

let filter = new URLSearchParams(window.location.search).get("state") || "all";
if (!FILTERS.some(([key]) => key === filter)) filter = "all";

const main = document.getElementById("main");
const buttons = h("div", { class: "segmented", role: "group", "aria-label": "Filter by state" });
const counts = h("span", { class: "muted" });
const body = h("div", { class: "panel table-wrap", id: "jobs" });
const older = h("p", { class: "note older", id: "older", hidden: true });
replace(main, h("div", { class: "toolbar" }, h("h1", {}, "Jobs"), buttons, h("span", { class: "spacer" }), counts), body, older);

function drawFilters() {
  replace(buttons, FILTERS.map(([key, label]) => h("button", {
    type: "button",
    "data-filter": key,
    "aria-pressed": key === filter ? "true" : "false",
    on: {
      click: () => {
        filter = key;
        limit = PAGE;
        const url = new URL(window.location.href);
        if (key === "all") url.searchParams.delete("state"); else url.searchParams.set("state", key);
        window.history.replaceState(null, "", url);
        drawFilters();
        refresh();
      },
    },
  }, label)));
}

// Sweeps whose runs are shown (a sweep's runs are folded under it until opened).
const opened = new Set();

async function refresh() {
  const states = FILTERS.find(([key]) => key === filter)[2];
  const query = new URLSearchParams();
  for (const s of states || []) query.append("state", s);
  query.set("limit", String(limit));
  const shown = [filter, limit].join();
  const [{ now, jobs, more }, me] = await Promise.all([api(`/ui/api/jobs?${query}`), mePromise]);
  if (shown !== [filter, limit].join()) return; // the filter changed while this was on its way
  counts.textContent = more ? `the newest ${jobs.length} jobs` : `${jobs.length} job${jobs.length === 1 ? "" : "s"}`;
  drawOlder(more, jobs.length);
  if (!jobs.length) {
    replace(body, h("div", { class: "empty" },
      filter === "all" ? ["No jobs yet. Start one with ", h("code", {}, "gpuhop run train.py"), "."]
        : "No jobs in this state."));
    return;
  }
  // Whose jobs they are matters only where they are not all the viewer's own.
  const users = new Set(jobs.map((j) => j.owner)).size > 1 || jobs.some((j) => j.owner && j.owner !== me.user);
  const columns = ["Job", "State", users ? "User" : null, "Command", "GPUs", "Created", "Duration", "Latest metrics"]
    .filter(Boolean);
  const rows = [];
  const sweeps = new Map();
  for (const job of jobs) {
    if (!job.sweep) rows.push(job);
    else if (!sweeps.has(job.sweep)) { sweeps.set(job.sweep, [job]); rows.push({ sweepOf: job.sweep }); }
    else sweeps.get(job.sweep).push(job);
  }
  const cells = (job) => [
    td("Job", {},
      job.name ? h("a", { class: "jobname", href: jobHref(job.id) }, job.name) : null,
      h("a", { class: "jobid", href: jobHref(job.id), "data-id": job.id }, job.id)),
    td("State", {}, badge(job.state)),
    users ? td("User", {}, job.owner || "") : null,
    td("Command", { class: "command-cell" }, h("code", { title: shellJoin(job.command) }, shellJoin(job.command))),
    td("GPUs", { class: "num" }, gpuText(job)),
    td("Created", { class: "num" }, dateCell(job.created_at, now)),
    // A queued job's wait in the agent's words (its place, or its data's fetch: objects, bytes, rate, ETA).
    td("Duration", { class: "num" }, jobDuration(job, now) || h("span", { class: "muted" }, job.waiting || "not started")),
    td("Latest metrics", {}, metricsInline(job.latest_metrics)),
  ];
  const out = [];
  for (const row of rows) {
    if (!row.sweepOf) {
      out.push(h("tr", { class: "job-row", "data-job": row.id }, cells(row)));
      continue;
    }
    const runs = sweeps.get(row.sweepOf);
    const open = opened.has(row.sweepOf);
    out.push(sweepRow(row.sweepOf, runs, open, columns.length, now));
    if (open) for (const run of runs) out.push(h("tr", { class: "job-row in-sweep", "data-job": run.id, "data-in-sweep": run.sweep }, cells(run)));
  }
  replace(body, h("table", { class: "jobs" },
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))),
    h("tbody", {}, out)));
}

// Under a list cut short, that it is, and how to see older jobs.
function drawOlder(more, shown) {
  older.hidden = !more;
  if (!more) return;
  const step = Math.min(PAGE, MOST - limit);
  replace(older,
    `Showing the newest ${shown} jobs; there are older ones. `,
    step > 0 ? [h("button", {
      type: "button", class: "link", id: "show-more",
      on: { click: () => { limit += step; refresh(); } },
    }, `Show ${step} more`), ". "] : "",
    "To find an older one, pick a state above, or list them in a terminal: ",
    h("code", {}, `gpuhop ps --limit ${step > 0 ? MOST : MOST * 5}`), ".");
}

// A cell that names its column, for the narrow layout where each row is a card.
function td(label, attrs, ...children) {
  return h("td", { "data-label": label, ...attrs }, h("div", { class: "cell" }, children));
}

// A sweep's line in the list: its name, how many runs in which states, a link to its
// page, and a toggle that shows its runs below it.
function sweepRow(sweep, runs, open, span, now) {
  const byState = new Map();
  for (const run of runs) byState.set(run.state, (byState.get(run.state) || 0) + 1);
  const toggle = h("button", {
    class: "link toggle", type: "button", "aria-expanded": String(open),
    "aria-label": `${open ? "Hide" : "Show"} the runs of sweep ${sweep}`,
    on: { click: () => { if (opened.has(sweep)) opened.delete(sweep); else opened.add(sweep); refresh(); } },
  }, open ? "▾" : "▸");
  const first = runs[runs.length - 1]; // the list is newest first
  return h("tr", { class: "sweep-row", "data-sweep": sweep },
    h("td", { colspan: span },
      h("div", { class: "sweep-line" },
        toggle,
        h("a", { class: "jobname", href: `/ui/sweeps/${encodeURIComponent(sweep)}` }, `sweep ${sweepName(sweep, runs)}`),
        h("span", { class: "muted", "data-runs": runs.length }, `${runs.length} run${runs.length === 1 ? "" : "s"}`),
        h("span", { class: "sweep-states" }, [...byState].map(([state, n]) => [badge(state), ` ${n}`])),
        h("span", { class: "muted" }, "created ", dateCell(first.created_at, now)))));
}

drawFilters();
const mePromise = topbar("jobs");
poll(refresh, 2000);
