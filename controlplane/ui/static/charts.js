// One small hand-written SVG plot for every chart the dashboard draws (training metrics, trials,
// query rates): lines, points or a step line per series, nice ticks, a readout on hover.
import { h, s, fill, num } from "./dom.js";

const PAD = { left: 56, right: 12, top: 10, bottom: 30 };
const MOST_POINTS = 1500; // per series: more than a chart's width in pixels shows nothing more

function niceStep(span, count) {
  const raw = span / Math.max(count, 1);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

export function ticks(lo, hi, count = 5, integer = false) {
  if (!(hi > lo)) return [lo];
  const step = integer ? Math.max(1, niceStep(hi - lo, count)) : niceStep(hi - lo, count);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  }
  return out;
}

function thin(points) {
  if (points.length <= MOST_POINTS) return points;
  const stride = points.length / MOST_POINTS;
  const out = [];
  for (let i = 0; i < MOST_POINTS; i++) out.push(points[Math.floor(i * stride)]);
  out.push(points[points.length - 1]);
  return out;
}

// A chart is drawn at its box's width (so its text stays legible on a phone): drawn again when
// that width changes (a rotated phone, a resized window).
const charts = new WeakMap();
const resized = new ResizeObserver((entries) => {
  for (const { target, contentRect } of entries) {
    if (!target.isConnected) resized.unobserve(target);
    const last = charts.get(target);
    if (last && contentRect.width > 0 && Math.abs(contentRect.width - last.width) > 24) plot(target, ...last.args);
  }
});

function extent(values, pad) {
  let lo = Math.min(...values);
  let hi = Math.max(...values);
  if (lo === hi) {
    lo -= Math.abs(lo) * 0.1 || 1;
    hi += Math.abs(hi) * 0.1 || 1;
  } else if (pad) {
    const p = (hi - lo) * 0.05;
    lo -= p;
    hi += p;
  }
  return [lo, hi];
}

// `series`: [{name, points: [[x, y], ...], mode: "line" | "points" | "step", color}]; points
// whose y is not a finite number (a diverging loss sent as "inf") are left out, and counted.
// Draws into `box` (a div) at its current width; returns how many points it drew.
// Steps, trial numbers and seconds are whole: the x axis has no ticks between them.
export function plot(box, series, options = {}) {
  const { xLabel = "", yLabel = "", logY = false, test = "chart" } = options;
  const width = Math.max(box.clientWidth || 640, 280);
  charts.set(box, { width, args: [series, options] });
  resized.observe(box);
  const height = Math.round(Math.min(300, Math.max(180, width * 0.4)));
  const y = (v) => (logY ? Math.log10(v) : v);
  let skipped = 0;
  const shown = series.map((one, i) => {
    const ok = one.points.filter(([, v]) => {
      const good = typeof v === "number" && Number.isFinite(v) && (!logY || v > 0);
      if (!good) skipped += 1;
      return good;
    });
    return { ...one, color: one.color ?? i, points: thin(ok.map(([px, v]) => [px, y(v)])) };
  });
  const all = shown.flatMap((one) => one.points);
  const drawn = all.length;
  if (!drawn) {
    fill(box, h("p", { class: "empty", "data-test": `${test}-empty` }, "no data points yet"));
    return 0;
  }
  const [x0, x1] = extent(all.map((p) => p[0]), false);
  const [y0, y1] = extent(all.map((p) => p[1]), true);
  const iw = width - PAD.left - PAD.right;
  const ih = height - PAD.top - PAD.bottom;
  const sx = (v) => PAD.left + ((v - x0) / (x1 - x0)) * iw;
  const sy = (v) => PAD.top + ih - ((v - y0) / (y1 - y0)) * ih;
  const fmtY = (v) => num(logY ? 10 ** v : v, 3);

  const grid = [];
  const yTicks = logY ? ticks(Math.floor(y0), Math.ceil(y1), 4).filter((t) => t >= y0 && t <= y1) : ticks(y0, y1, 5);
  for (const t of yTicks) {
    grid.push(s("line", { class: "grid", x1: PAD.left, x2: width - PAD.right, y1: sy(t), y2: sy(t) }));
    grid.push(s("text", { class: "tick", x: PAD.left - 6, y: sy(t) + 4, "text-anchor": "end" }, fmtY(t)));
  }
  for (const t of ticks(x0, x1, Math.max(2, Math.floor(iw / 90)), true)) {
    grid.push(s("line", { class: "grid", x1: sx(t), x2: sx(t), y1: PAD.top, y2: PAD.top + ih }));
    grid.push(s("text", { class: "tick", x: sx(t), y: height - 12, "text-anchor": "middle" }, num(t, 4)));
  }

  const marks = shown.map((one) => {
    const cls = `c${one.color % 8}`;
    const pts = [...one.points].sort((a, b) => a[0] - b[0]);
    const kids = [];
    if (one.mode === "step" && pts.length) {
      let d = `M${sx(pts[0][0])},${sy(pts[0][1])}`;
      for (let i = 1; i < pts.length; i++) d += `H${sx(pts[i][0])}V${sy(pts[i][1])}`;
      kids.push(s("path", { class: `line step ${cls}`, d }));
    } else if (one.mode !== "points" && pts.length > 1) {
      const d = pts.map(([px, py]) => `${sx(px).toFixed(1)},${sy(py).toFixed(1)}`).join(" ");
      kids.push(s("polyline", { class: `line ${cls}`, points: d }));
    }
    if (one.mode === "points" || (one.mode !== "step" && pts.length <= 60)) {
      for (const [px, py] of pts) {
        kids.push(s("circle", { class: `dot ${cls}`, cx: sx(px), cy: sy(py), r: one.mode === "points" ? 4 : 2.5 }));
      }
    }
    return s("g", { "data-series": one.name, "data-count": pts.length }, kids);
  });

  const cursor = s("line", { class: "cursor", y1: PAD.top, y2: PAD.top + ih, visibility: "hidden" });
  const svg = s(
    "svg",
    {
      class: "chart",
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "aria-label": `${yLabel} by ${xLabel}`,
      "data-test": test,
      "data-points": drawn,
    },
    s("rect", { class: "frame", x: PAD.left, y: PAD.top, width: iw, height: ih }),
    grid,
    s("text", { class: "axis", x: PAD.left + iw / 2, y: height - 1, "text-anchor": "middle" }, xLabel),
    s("text", { class: "axis", x: 12, y: PAD.top + ih / 2, transform: `rotate(-90 12 ${PAD.top + ih / 2})`, "text-anchor": "middle" }, yLabel + (logY ? " (log)" : "")),
    marks,
    cursor,
  );
  const readout = h("div", { class: "readout muted" }, skipped ? `${skipped} value(s) not finite or not plottable, left out` : "");
  const legend = h(
    "div",
    { class: "legend" },
    shown.length > 1 ? shown.map((one) => h("span", { class: `key c${one.color % 8}` }, one.name)) : null,
  );
  svg.addEventListener("mousemove", (event) => {
    const box2 = svg.getBoundingClientRect();
    const px = ((event.clientX - box2.left) / box2.width) * width;
    if (px < PAD.left || px > width - PAD.right) return;
    const xv = x0 + ((px - PAD.left) / iw) * (x1 - x0);
    cursor.setAttribute("x1", px);
    cursor.setAttribute("x2", px);
    cursor.setAttribute("visibility", "visible");
    const parts = shown.map((one) => {
      let best = null;
      for (const p of one.points) if (!best || Math.abs(p[0] - xv) < Math.abs(best[0] - xv)) best = p;
      return best ? `${one.name}: ${num(best[0], 6)} → ${fmtY(best[1])}` : null;
    });
    readout.textContent = parts.filter(Boolean).join("   ");
  });
  svg.addEventListener("mouseleave", () => cursor.setAttribute("visibility", "hidden"));
  fill(box, svg, legend, readout);
  return drawn;
}
