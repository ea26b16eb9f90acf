// gpuhop dashboard: a small SVG line chart (no library: a few lines per series, axes with
// round ticks, a hover read-out). Resizes with its box; draws at most MAX_POINTS per series.

import { h, replace } from "/ui/static/common.js";

const NS = "http://www.w3.org/2000/svg";
const MAX_POINTS = 1500;
const COLOURS = 8; // series colours in style.css (s0..s7); more series reuse them
const MARGIN = { left: 56, right: 14, top: 10, bottom: 24 };

function svg(tag, attrs, text) {
  const el = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  if (text !== undefined) el.textContent = text;
  return el;
}

// About `count` round tick values covering [min, max].
export function ticks(min, max, count = 5) {
  const span = max - min || Math.abs(max) || 1;
  const raw = span / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => span / s <= count) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) {
    out.push(Number(v.toPrecision(12)));
  }
  return out;
}

function thin(points) {
  if (points.length <= MAX_POINTS) return points;
  const stride = Math.ceil(points.length / MAX_POINTS);
  const out = points.filter((_, i) => i % stride === 0);
  if (out[out.length - 1] !== points[points.length - 1]) out.push(points[points.length - 1]);
  return out;
}

const plain = (v) => String(Number(Number(v).toPrecision(4)));

export class LineChart {
  // options: title, name (data-metric), height, xLabel, xFormat, yFormat, labels (legend),
  // and optional fixed bounds xMin, xMax, yMin, yMax and a tick maker xTicks(min, max, n).
  constructor(options) {
    this.o = { height: 190, xFormat: plain, yFormat: plain, ...options };
    this.series = [];
    this.latest = h("span", { class: "latest" });
    this.host = h("div", { class: "plot" });
    this.tip = h("div", { class: "tip", hidden: true });
    const legend = this.o.labels && this.o.labels.length > 1
      ? h("div", { class: "legend" }, this.o.labels.map((l, i) => h("span", { class: `key${i % COLOURS}` }, l)))
      : null;
    this.el = h("figure", { class: "chart", "data-metric": this.o.name || this.o.title, "data-points": 0 },
      h("figcaption", {}, h("span", {}, this.o.title), this.latest), legend, this.host, this.tip);
    this.width = 0;
    new ResizeObserver(() => {
      if (this.host.clientWidth !== this.width) this.render();
    }).observe(this.host);
  }

  // series: one array of [x, y] per line, x ascending; y may be null (a gap).
  setData(series) {
    this.series = series;
    const count = series.reduce((n, s) => n + s.length, 0);
    this.el.setAttribute("data-points", String(count));
    const last = series[0] && series[0][series[0].length - 1];
    this.latest.textContent = last && last[1] !== null ? this.o.yFormat(last[1]) : "";
    this.render();
  }

  render() {
    const width = (this.width = this.host.clientWidth || 480);
    const height = this.o.height;
    const plotW = Math.max(10, width - MARGIN.left - MARGIN.right);
    const plotH = height - MARGIN.top - MARGIN.bottom;
    const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": this.o.title });
    const lines = this.series.map((s) => thin(s.filter(([x]) => Number.isFinite(x))));
    const ys = lines.flat().map(([, y]) => y).filter(Number.isFinite);
    if (!ys.length) {
      root.append(svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "axis" }, "no data yet"));
      replace(this.host, root);
      return;
    }
    const xs = lines.flat().map(([x]) => x);
    let [x0, x1] = [this.o.xMin ?? Math.min(...xs), this.o.xMax ?? Math.max(...xs)];
    if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
    let y0 = this.o.yMin ?? Math.min(...ys);
    let y1 = this.o.yMax ?? Math.max(...ys);
    if (y0 === y1) [y0, y1] = [y0 - (Math.abs(y0) || 1) * 0.1, y1 + (Math.abs(y1) || 1) * 0.1];
    else if (this.o.yMin === undefined || this.o.yMax === undefined) {
      const pad = (y1 - y0) * 0.06;
      if (this.o.yMin === undefined) y0 -= pad;
      if (this.o.yMax === undefined) y1 += pad;
    }
    const px = (x) => MARGIN.left + ((x - x0) / (x1 - x0)) * plotW;
    const py = (y) => MARGIN.top + (1 - (y - y0) / (y1 - y0)) * plotH;

    const axis = svg("g", { class: "axis" });
    for (const t of ticks(y0, y1, Math.max(2, Math.round(plotH / 40)))) {
      axis.append(svg("line", { class: "gridline", x1: MARGIN.left, x2: MARGIN.left + plotW, y1: py(t), y2: py(t) }));
      axis.append(svg("text", { x: MARGIN.left - 6, y: py(t) + 4, "text-anchor": "end" }, this.o.yFormat(t)));
    }
    for (const t of (this.o.xTicks || ticks)(x0, x1, Math.max(2, Math.round(plotW / 90)))) {
      axis.append(svg("text", { x: px(t), y: height - 6, "text-anchor": "middle" }, this.o.xFormat(t)));
    }
    root.append(axis);

    lines.forEach((points, i) => {
      let d = "";
      let pen = "M";
      for (const [x, y] of points) {
        if (!Number.isFinite(y)) { pen = "M"; continue; }
        d += `${pen}${px(x).toFixed(1)},${py(y).toFixed(1)}`;
        pen = "L";
      }
      root.append(svg("path", { class: `line s${i % COLOURS}`, d }));
    });

    const cursor = svg("line", { class: "cursor", y1: MARGIN.top, y2: MARGIN.top + plotH, visibility: "hidden" });
    const dots = lines.map((_, i) => svg("circle", { r: 3.5, class: `dot${i % COLOURS}`, visibility: "hidden" }));
    const overlay = svg("rect", { x: MARGIN.left, y: MARGIN.top, width: plotW, height: plotH, fill: "transparent" });
    root.append(cursor, ...dots, overlay);
    overlay.addEventListener("mousemove", (event) => this.hover(event, root, lines, { px, py, x0, x1, plotW, cursor, dots }));
    overlay.addEventListener("mouseleave", () => {
      cursor.setAttribute("visibility", "hidden");
      dots.forEach((d) => d.setAttribute("visibility", "hidden"));
      this.tip.hidden = true;
    });
    replace(this.host, root);
  }

  hover(event, root, lines, g) {
    const box = root.getBoundingClientRect();
    const scale = box.width / this.width;
    const x = g.x0 + ((event.clientX - box.left) / scale - MARGIN.left) / g.plotW * (g.x1 - g.x0);
    const parts = [];
    let at = null;
    lines.forEach((points, i) => {
      let best = null;
      for (const p of points) if (Number.isFinite(p[1]) && (!best || Math.abs(p[0] - x) < Math.abs(best[0] - x))) best = p;
      if (!best) { g.dots[i].setAttribute("visibility", "hidden"); return; }
      at = at ?? best[0];
      g.dots[i].setAttribute("cx", g.px(best[0]));
      g.dots[i].setAttribute("cy", g.py(best[1]));
      g.dots[i].setAttribute("visibility", "visible");
      const label = this.o.labels && this.o.labels.length > 1 ? `${this.o.labels[i]} ` : "";
      parts.push(`${label}${this.o.yFormat(best[1])}`);
    });
    if (at === null) return;
    g.cursor.setAttribute("x1", g.px(at));
    g.cursor.setAttribute("x2", g.px(at));
    g.cursor.setAttribute("visibility", "visible");
    this.tip.textContent = `${this.o.xLabel ? this.o.xLabel + " " : ""}${this.o.xFormat(at)}: ${parts.join(", ")}`;
    this.tip.hidden = false;
    const left = g.px(at) * scale + 8;
    this.tip.style.left = `${Math.min(left, box.width - this.tip.offsetWidth - 4)}px`;
    this.tip.style.top = "1.8rem";
  }
}
