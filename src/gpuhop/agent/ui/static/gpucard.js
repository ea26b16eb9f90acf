// gpuhop dashboard: one GPU's card, on the GPUs page and on the page of a job that holds
// it: what it reads now (load, memory, what jobs reserved) and its load and memory over
// the last minutes, from what the agent samples (`/ui/api/gpus`, as `gpuhop gpus` and
// `gpuhop top` read it).

import { LineChart } from "/ui/static/chart.js";
import { h, mb, replace } from "/ui/static/common.js";

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

function chart(title, name, yMax, yFormat) {
  return new LineChart({
    title, name, yMin: 0, yMax, yFormat, xMax: 0, xFormat: ago, xTicks: timeTicks, height: 150,
  });
}

function stat(label, value, fraction, name) {
  return h("div", { class: "stat", "data-stat": name },
    h("div", { class: "value" }, value),
    h("div", { class: "label" }, label),
    fraction === null ? null : h("div", { class: "bar" }, barFill(fraction)));
}

function barFill(fraction) {
  const fill = h("span", {});
  fill.style.width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
  return fill;
}

export class GpuCard {
  // `job`: the id of the job whose page this is (its own memory on the GPU is shown), or
  // null on the GPUs page.
  constructor(gpu, job = null) {
    this.job = job;
    this.head = h("div", { class: "gpu-head" });
    this.stats = h("div", { class: "stats" });
    this.holders = h("div", { class: "holders" });
    this.util = chart("Utilisation", `gpu${gpu.index}-util`, 100, percent);
    this.memory = chart("Memory used", `gpu${gpu.index}-memory`, gpu.memory_mb / 1024, gib);
    this.el = h("section", { class: "panel", "data-gpu": gpu.index },
      this.head, this.stats, this.holders, this.util.el, this.memory.el);
  }

  // One answer of /ui/api/gpus: this GPU, the agent's clock, and its samples.
  draw(gpu, now, history) {
    const where = gpu.node ? ` · node ${gpu.node}` : ""; // an agent on a Ray cluster
    replace(this.head, h("h2", {}, `GPU ${gpu.index}`), h("span", { class: "muted" }, `${gpu.name} · ${mb(gpu.memory_mb)}${where}`),
      gpu.quarantined
        ? h("p", { class: "quarantined", "data-quarantined": gpu.index },
          `Quarantined: ${gpu.quarantined}. No job gets this GPU until an admin runs: gpuhop gpus --release ${gpu.index}`)
        : null);
    const used = gpu.memory_used_mb;
    const mine = this.job && gpu.job_memory_mb ? gpu.job_memory_mb[this.job] : undefined;
    replace(this.stats,
      stat("utilisation", gpu.utilization === null ? "n/a" : `${gpu.utilization}%`, gpu.utilization === null ? null : gpu.utilization / 100, "utilisation"),
      stat("memory used", used === null ? "n/a" : mb(used), used === null ? null : used / gpu.memory_mb, "memory"),
      this.job
        ? (mine === undefined ? null : stat("this job's memory", mb(mine), mine / gpu.memory_mb, "job-memory"))
        : stat("reserved by jobs", mb(gpu.memory_reserved_mb), gpu.memory_reserved_mb / gpu.memory_mb, "reserved"));
    const series = history[String(gpu.index)] || { t: [], utilization: [], memory_used_mb: [] };
    const since = Math.min(-WINDOW, series.t.length ? series.t[0] - now : 0);
    this.util.o.xMin = this.memory.o.xMin = since;
    this.util.setData([series.t.map((t, i) => [t - now, series.utilization[i]])]);
    this.memory.setData([series.t.map((t, i) => [t - now, gibOf(series.memory_used_mb[i])])]);
  }
}

function gibOf(value) {
  return value === null ? null : value / 1024;
}
