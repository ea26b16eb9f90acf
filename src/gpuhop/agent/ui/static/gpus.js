// gpuhop dashboard: the GPUs page. Each GPU's load and memory over the last hour (sampled
// by the agent every few seconds), what it reads now, which jobs hold it, and why it is
// quarantined if a hardware fault took it out of service.

import { LineChart } from "/ui/static/chart.js";
import { api, h, jobHref, mb, poll, replace, topbar } from "/ui/static/common.js";

const main = document.getElementById("main");
const note = h("p", { class: "note" });
const grid = h("div", { class: "gpus", id: "gpus" });
replace(main, h("div", { class: "toolbar" }, h("h1", {}, "GPUs")), note, grid);

const cards = new Map();
const percent = (v) => `${Math.round(v)}%`;
const gib = (v) => `${Number(v.toFixed(1))} GiB`;
// The x axis is seconds before now: "-10m" ... "now", over at least the last five minutes.
const WINDOW = 300;
const STEPS = [10, 15, 30, 60, 120, 300, 600, 900, 1200, 1800];
const ago = (s) => (Math.round(s) === 0 ? "now" : Math.abs(s) < 60 ? `${Math.round(s)}s` : `${Math.round(s / 60)}m`);
function timeTicks(min, max, count) {
  const step = STEPS.find((s) => (max - min) / s <= count) || 3600;
  const out = [];
  for (let t = 0; t >= min; t -= step) out.unshift(t);
  return out;
}

function card(gpu) {
  let c = cards.get(gpu.index);
  if (c) return c;
  c = {
    head: h("div", { class: "gpu-head" }),
    stats: h("div", { class: "stats" }),
    holders: h("div", { class: "holders" }),
    util: chart("Utilisation", `gpu${gpu.index}-util`, 100, percent),
    memory: chart("Memory used", `gpu${gpu.index}-memory`, gpu.memory_mb / 1024, gib),
  };
  c.el = h("section", { class: "panel", "data-gpu": gpu.index }, c.head, c.stats, c.holders, c.util.el, c.memory.el);
  cards.set(gpu.index, c);
  grid.append(c.el);
  return c;
}

function chart(title, name, yMax, yFormat) {
  return new LineChart({
    title, name, yMin: 0, yMax, yFormat, xMax: 0, xFormat: ago, xTicks: timeTicks, height: 150,
  });
}

function stat(label, value, fraction) {
  return h("div", { class: "stat" },
    h("div", { class: "value" }, value),
    h("div", { class: "label" }, label),
    fraction === null ? null : h("div", { class: "bar" }, barFill(fraction)));
}

function barFill(fraction) {
  const fill = h("span", {});
  fill.style.width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
  return fill;
}

async function refresh() {
  const { now, gpus, history, every } = await api("/ui/api/gpus");
  const me = await mePromise;
  note.textContent = !gpus.length
    ? "This host has no GPU: jobs run on its CPU."
    : `Sampled every ${every} s for the last hour.${me.fake_gpus ? " These are fake GPUs (the agent runs with --fake-gpus): they read 0." : ""}`
      + (me.admin ? "" : " Only your own jobs are named.");
  for (const gpu of gpus) {
    const c = card(gpu);
    const where = gpu.node ? ` · node ${gpu.node}` : "";  // an agent on a Ray cluster
    replace(c.head, h("h2", {}, `GPU ${gpu.index}`), h("span", { class: "muted" }, `${gpu.name} · ${mb(gpu.memory_mb)}${where}`),
      gpu.quarantined
        ? h("p", { class: "quarantined", "data-quarantined": gpu.index },
          `Quarantined: ${gpu.quarantined}. No job gets this GPU until an admin runs: gpuhop gpus --release ${gpu.index}`)
        : null);
    const used = gpu.memory_used_mb;
    replace(c.stats,
      stat("utilisation", gpu.utilization === null ? "n/a" : `${gpu.utilization}%`, gpu.utilization === null ? null : gpu.utilization / 100),
      stat("memory used", used === null ? "n/a" : mb(used), used === null ? null : used / gpu.memory_mb),
      stat("reserved by jobs", mb(gpu.memory_reserved_mb), gpu.memory_reserved_mb / gpu.memory_mb));
    replace(c.holders, h("span", { class: "muted" }, "Held by"),
      gpu.job_ids.length
        ? gpu.job_ids.map((id) => h("a", { class: "chip", href: jobHref(id), "data-job": id }, id))
        : h("span", {}, gpu.memory_reserved_mb ? "other users' jobs" : "no job"));
    const series = history[String(gpu.index)] || { t: [], utilization: [], memory_used_mb: [] };
    const since = Math.min(-WINDOW, series.t.length ? series.t[0] - now : 0);
    c.util.o.xMin = c.memory.o.xMin = since;
    c.util.setData([series.t.map((t, i) => [t - now, series.utilization[i]])]);
    c.memory.setData([series.t.map((t, i) => [t - now, gibOf(series.memory_used_mb[i])])]);
  }
}

function gibOf(value) {
  return value === null ? null : value / 1024;
}

const mePromise = topbar("gpus");
poll(refresh, 5000);
