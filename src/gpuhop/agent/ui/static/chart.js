// gpuhop dashboard: a small SVG line chart (no library: a few lines per series, axes with
// round ticks, a hover read-out). Resizes with its box; draws at most MAX_POINTS per series.
// As TensorBoard's and W&B's: smoothing (a debiased moving average, the raw line kept
// faint behind it), a log scale for the y axis, and drag across it to zoom in on the x
// axis (a double click zooms out).

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

// Ticks for a log scale, given log10 bounds: the powers of ten, with 2 and 5 times them
// where there are few decades; as exponents.
function logTicks(min, max, count) {
  const out = [];
  const decades = Math.ceil(max) - Math.floor(min);
  const steps = decades >= count ? [1] : decades >= 2 ? [1, 2, 5] : [1, 1.5, 2, 3, 5, 7];
  for (let e = Math.floor(min); e <= Math.ceil(max); e += 1) {
    for (const m of steps) {
      const t = Math.log10(m) + e;
      if (t >= min && t <= max) out.push(t);
    }
  }
  if (out.length > 2 * count) return out.filter((t) => Number.isInteger(Math.round(t * 1e9) / 1e9));
  return out.length >= 2 ? out : ticks(min, max, count);
}

// TensorBoard's smoothing: an exponential moving average, debiased so that its first
// points are not pulled towards zero. `weight` 0 leaves the points as they are.
export function smooth(points, weight) {
  let last = 0;
  let n = 0;
  return points.map(([x, y]) => {
    if (!Number.isFinite(y)) return [x, y];
    last = last * weight + (1 - weight) * y;
    n += 1;
    return [x, last / (1 - weight ** n)];
  });
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
  // options: title, name (data-metric), height, xLabel, xFormat, yFormat, labels (one per
  // series: the legend, unless legend is false), smoothing (0 to <1), yLog, best (the index
  // of a series drawn bold), and optional fixed bounds xMin, xMax, yMin, yMax and a tick
  // maker xTicks(min, max, n).
  constructor(options) {
    this.o = { height: 190, xFormat: plain, yFormat: plain, smoothing: 0, yLog: false, legend: true, ...options };
    this.series = [];
    this.zoom = null; // [x0, x1] while zoomed in
    this.latest = h("span", { class: "latest" });
    this.host = h("div", { class: "plot" });
    this.tip = h("div", { class: "tip", hidden: true });
    this.legend = h("div", { class: "legend" });
    this.el = h("figure", { class: "chart", "data-metric": this.o.name || this.o.title, "data-points": 0 },
      h("figcaption", {}, h("span", {}, this.o.title), this.latest), this.legend, this.host, this.tip);
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
    // The latest value read out: the first line's, unless the lines are peers (a sweep's runs).
    this.latest.textContent = last && last[1] !== null && this.o.legend ? this.o.yFormat(last[1]) : "";
    const labels = this.o.legend && this.o.labels && this.o.labels.length > 1 ? this.o.labels : [];
    replace(this.legend, labels.map((l, i) => h("span", { class: `key${i % COLOURS}` }, l)));
    this.legend.hidden = !labels.length;
    this.render();
  }

  // The y a point is drawn at: its log10 on a log scale, where only positive values show.
  scaled(y) {
    if (!Number.isFinite(y)) return null;
    if (!this.o.yLog) return y;
    return y > 0 ? Math.log10(y) : null;
  }

  render() {
    const width = (this.width = this.host.clientWidth || 480);
    const height = this.o.height;
    const plotW = Math.max(10, width - MARGIN.left - MARGIN.right);
    const plotH = height - MARGIN.top - MARGIN.bottom;
    const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": this.o.title });
    const [zx0, zx1] = this.zoom || [-Infinity, Infinity];
    const raw = this.series.map((s) => thin(s.filter(([x]) => Number.isFinite(x) && x >= zx0 && x <= zx1))
      .map(([x, y]) => [x, this.scaled(y)]));
    const lines = this.o.smoothing > 0 ? raw.map((points) => smooth(points, this.o.smoothing)) : raw;
    const ys = raw.flat().map(([, y]) => y).filter(Number.isFinite);
    if (!ys.length) {
      const empty = this.o.yLog && this.series.some((s) => s.length) ? "no positive values for a log scale" : "no data yet";
      root.append(svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "axis" }, empty));
      replace(this.host, root);
      return;
    }
    const xs = raw.flat().map(([x]) => x);
    let [x0, x1] = this.zoom || [this.o.xMin ?? Math.min(...xs), this.o.xMax ?? Math.max(...xs)];
    if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
    const fixed = (v) => (this.o.yLog ? undefined : v);
    let y0 = fixed(this.o.yMin) ?? Math.min(...ys);
    let y1 = fixed(this.o.yMax) ?? Math.max(...ys);
    if (y0 === y1) [y0, y1] = [y0 - (Math.abs(y0) || 1) * 0.1, y1 + (Math.abs(y1) || 1) * 0.1];
    else if (fixed(this.o.yMin) === undefined || fixed(this.o.yMax) === undefined) {
      const pad = (y1 - y0) * 0.06;
      if (fixed(this.o.yMin) === undefined) y0 -= pad;
      if (fixed(this.o.yMax) === undefined) y1 += pad;
    }
    const px = (x) => MARGIN.left + ((x - x0) / (x1 - x0)) * plotW;
    const py = (y) => MARGIN.top + (1 - (y - y0) / (y1 - y0)) * plotH;

    const axis = svg("g", { class: "axis" });
    const yCount = Math.max(2, Math.round(plotH / 40));
    for (const t of this.o.yLog ? logTicks(y0, y1, yCount) : ticks(y0, y1, yCount)) {
      const label = this.o.yFormat(this.o.yLog ? 10 ** t : t);
      axis.append(svg("line", { class: "gridline", x1: MARGIN.left, x2: MARGIN.left + plotW, y1: py(t), y2: py(t) }));
      axis.append(svg("text", { x: MARGIN.left - 6, y: py(t) + 4, "text-anchor": "end" }, label));
    }
    for (const t of (this.o.xTicks || ticks)(x0, x1, Math.max(2, Math.round(plotW / 90)))) {
      axis.append(svg("text", { x: px(t), y: height - 6, "text-anchor": "middle" }, this.o.xFormat(t)));
    }
    root.append(axis);

    const path = (points) => {
      let d = "";
      let pen = "M";
      for (const [x, y] of points) {
        if (!Number.isFinite(y)) { pen = "M"; continue; }
        d += `${pen}${px(x).toFixed(1)},${py(y).toFixed(1)}`;
        pen = "L";
      }
      return d;
    };
    // The raw values stay, faint, behind their smoothed line.
    if (this.o.smoothing > 0) raw.forEach((points, i) => root.append(svg("path", { class: `raw s${i % COLOURS}`, d: path(points) })));
    lines.forEach((points, i) => {
      const best = i === this.o.best ? " best" : "";
      root.append(svg("path", { class: `line s${i % COLOURS}${best}`, d: path(points) }));
    });

    const cursor = svg("line", { class: "cursor", y1: MARGIN.top, y2: MARGIN.top + plotH, visibility: "hidden" });
    const dots = lines.map((_, i) => svg("circle", { r: 3.5, class: `dot${i % COLOURS}`, visibility: "hidden" }));
    const overlay = svg("rect", { x: MARGIN.left, y: MARGIN.top, width: plotW, height: plotH, fill: "transparent" });
    const band = svg("rect", { class: "zoom-band", y: MARGIN.top, height: plotH, visibility: "hidden" });
    root.append(band, cursor, ...dots, overlay);
    const g = { px, py, x0, x1, plotW, cursor, dots };
    overlay.addEventListener("mousemove", (event) => this.hover(event, root, lines, g));
    this.zoomable(overlay, root, band, g);
    overlay.addEventListener("mouseleave", () => {
      cursor.setAttribute("visibility", "hidden");
      dots.forEach((d) => d.setAttribute("visibility", "hidden"));
      this.tip.hidden = true;
    });
    replace(this.host, root);
  }

  // The x value under the pointer.
  xAt(event, root, g) {
    const box = root.getBoundingClientRect();
    const scale = box.width / this.width;
    return g.x0 + ((event.clientX - box.left) / scale - MARGIN.left) / g.plotW * (g.x1 - g.x0);
  }

  // Drag across the plot to zoom in on that stretch of x; a double click shows it all again.
  zoomable(overlay, root, band, g) {
    let from = null;
    const span = (x) => [Math.min(from, x), Math.max(from, x)];
    overlay.addEventListener("mousedown", (event) => { from = this.xAt(event, root, g); event.preventDefault(); });
    overlay.addEventListener("mousemove", (event) => {
      if (from === null) return;
      const [a, b] = span(this.xAt(event, root, g));
      band.setAttribute("x", g.px(a));
      band.setAttribute("width", Math.max(0, g.px(b) - g.px(a)));
      band.setAttribute("visibility", "visible");
    });
    overlay.addEventListener("mouseup", (event) => {
      if (from === null) return;
      const [a, b] = span(this.xAt(event, root, g));
      from = null;
      band.setAttribute("visibility", "hidden");
      if (g.px(b) - g.px(a) < 4) return; // a click, not a drag
      this.zoom = [a, b];
      this.el.dataset.zoomed = "true";
      this.render();
    });
    overlay.addEventListener("dblclick", () => {
      this.zoom = null;
      delete this.el.dataset.zoomed;
      this.render();
    });
  }

  hover(event, root, lines, g) {
    const box = root.getBoundingClientRect();
    const scale = box.width / this.width;
    const x = this.xAt(event, root, g);
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
      parts.push(`${label}${this.o.yFormat(this.o.yLog ? 10 ** best[1] : best[1])}`);
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
