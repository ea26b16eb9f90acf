// gpuhop dashboard: the GPUs page. Each GPU's load and memory over the last hour (sampled
// by the agent every few seconds), what it reads now, which jobs hold it (by name, as the
// jobs page names them), and why it is quarantined if a hardware fault took it out of
// service.

import { api, h, jobHref, poll, replace, topbar } from "/ui/static/common.js";
import { GpuCard } from "/ui/static/gpucard.js";

const main = document.getElementById("main");
const note = h("p", { class: "note" });
const grid = h("div", { class: "gpus", id: "gpus" });
replace(main, h("div", { class: "toolbar" }, h("h1", {}, "GPUs")), note, grid);

const cards = new Map();

function card(gpu) {
  let c = cards.get(gpu.index);
  if (c) return c;
  c = new GpuCard(gpu);
  cards.set(gpu.index, c);
  grid.append(c.el);
  return c;
}

async function refresh() {
  const { now, gpus, names, history, every } = await api("/ui/api/gpus");
  const me = await mePromise;
  note.textContent = !gpus.length
    ? "This host has no GPU: jobs run on its CPU."
    : `Sampled every ${every} s for the last hour.${me.fake_gpus ? " These are fake GPUs (the agent runs with --fake-gpus): they read 0." : ""}`
      + (me.admin ? "" : " Only your own jobs are named.");
  for (const gpu of gpus) {
    const c = card(gpu);
    c.draw(gpu, now, history);
    replace(c.holders, h("span", { class: "muted" }, "Held by"),
      gpu.job_ids.length
        ? gpu.job_ids.map((id) => h("a", { class: "chip", href: jobHref(id), "data-job": id, title: id },
          names[id] || id))
        : h("span", {}, gpu.memory_reserved_mb ? "other users' jobs" : "no job"));
  }
}

const mePromise = topbar("gpus");
poll(refresh, 5000);
