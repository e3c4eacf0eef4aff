// Hand-written SVG charts: `plot` for every chart of a few series the dashboard draws (training
// metrics, trials, query rates, jobs compared): lines, points or a step line per series, nice
// ticks, a readout on hover; `traces` for hundreds of curves on one chart (a search's trials);
// `parallel` for parallel coordinates (a search's hyperparameters against its objective).
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
    if (last && contentRect.width > 0 && Math.abs(contentRect.width - last.width) > 24) last.redraw();
  }
});

function sized(box, redraw) {
  const width = Math.max(box.clientWidth || 640, 280);
  charts.set(box, { width, redraw });
  resized.observe(box);
  return width;
}

// Loops, not Math.min(...values): a thousand trials' points are more arguments than a call takes.
function extent(values, pad) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
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
  const width = sized(box, () => plot(box, series, options));
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
  const { ih, sx, sy, fmtY, grid } = frameAxes({ width, height, x0, x1, y0, y1, logY, xLabel, yLabel });

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
    grid,
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
    const xv = x0 + ((px - PAD.left) / (width - PAD.left - PAD.right)) * (x1 - x0);
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

// The axes of a chart of x against y: grid lines, tick labels and the axis names.
function frameAxes({ width, height, x0, x1, y0, y1, logY, xLabel, yLabel }) {
  const iw = width - PAD.left - PAD.right;
  const ih = height - PAD.top - PAD.bottom;
  const sx = (v) => PAD.left + ((v - x0) / (x1 - x0)) * iw;
  const sy = (v) => PAD.top + ih - ((v - y0) / (y1 - y0)) * ih;
  const fmtY = (v) => num(logY ? 10 ** v : v, 3);
  const out = [s("rect", { class: "frame", x: PAD.left, y: PAD.top, width: iw, height: ih })];
  const yTicks = logY ? ticks(Math.floor(y0), Math.ceil(y1), 4).filter((t) => t >= y0 && t <= y1) : ticks(y0, y1, 5);
  for (const t of yTicks) {
    out.push(s("line", { class: "grid", x1: PAD.left, x2: width - PAD.right, y1: sy(t), y2: sy(t) }));
    out.push(s("text", { class: "tick", x: PAD.left - 6, y: sy(t) + 4, "text-anchor": "end" }, fmtY(t)));
  }
  for (const t of ticks(x0, x1, Math.max(2, Math.floor(iw / 90)), true)) {
    out.push(s("line", { class: "grid", x1: sx(t), x2: sx(t), y1: PAD.top, y2: PAD.top + ih }));
    out.push(s("text", { class: "tick", x: sx(t), y: height - 12, "text-anchor": "middle" }, num(t, 4)));
  }
  out.push(
    s("text", { class: "axis", x: PAD.left + iw / 2, y: height - 1, "text-anchor": "middle" }, xLabel),
    s("text", { class: "axis", x: 12, y: PAD.top + ih / 2, transform: `rotate(-90 12 ${PAD.top + ih / 2})`, "text-anchor": "middle" }, yLabel + (logY ? " (log)" : "")),
  );
  return { iw, ih, sx, sy, fmtY, grid: out };
}

// Calls `fn` with the latest pointer event at most once a frame: finding the line nearest the
// pointer among a thousand must not run for every mousemove.
function onFrame(fn) {
  let pending = null;
  return (event) => {
    if (!pending) requestAnimationFrame(() => {
      fn(pending);
      pending = null;
    });
    pending = event;
  };
}

const svgPoint = (svg, event, width) => {
  const r = svg.getBoundingClientRect();
  const scale = width / r.width;
  return [(event.clientX - r.left) * scale, (event.clientY - r.top) * scale];
};

// Many curves on one chart: `series` [{id, name, points: [[x, y], ...], color, emphasis}] with
// `emphasis` "best" (drawn over the rest, thick) or null; `marks` [{x, label}] are drawn as
// dashed verticals (a search's rungs). The curve nearest the pointer is named in the readout
// (`describe(series, [x, y])`) and drawn over the others; a click on it calls `onPick(id)`.
// Points are thinned per curve, and curves get no dots: a thousand of them stay a few
// thousand SVG elements. Returns how many points it drew.
export function traces(box, series, options = {}) {
  const { xLabel = "", yLabel = "", logY = false, marks = [], test = "traces", onPick = null, describe = null, legend = [] } = options;
  const width = sized(box, () => traces(box, series, options));
  const height = Math.round(Math.min(380, Math.max(220, width * 0.42)));
  let skipped = 0;
  const shown = series.map((one) => {
    const ok = [];
    for (const [x, v] of one.points) {
      if (typeof v === "number" && Number.isFinite(v) && (!logY || v > 0)) ok.push([x, logY ? Math.log10(v) : v]);
      else skipped += 1;
    }
    ok.sort((a, b) => a[0] - b[0]);
    return { ...one, points: thin(ok) };
  });
  const xs = [];
  const ys = [];
  for (const one of shown) for (const [x, y] of one.points) xs.push(x), ys.push(y);
  for (const m of marks) xs.push(m.x);
  if (!ys.length) {
    fill(box, h("p", { class: "empty", "data-test": `${test}-empty` }, "no data points yet"));
    return 0;
  }
  const [x0, x1] = extent(xs, false);
  const [y0, y1] = extent(ys, true);
  const { ih, sx, sy, fmtY, grid } = frameAxes({ width, height, x0, x1, y0, y1, logY, xLabel, yLabel });
  const rungs = marks.map((m) =>
    s("g", { class: "mark" }, s("line", { x1: sx(m.x), x2: sx(m.x), y1: PAD.top, y2: PAD.top + ih }), s("text", { x: sx(m.x) - 3, y: PAD.top + 11, "text-anchor": "end" }, m.label)),
  );
  // Pixel positions, kept for finding the curve nearest the pointer.
  const pixels = new Map();
  const lines = s("g", { class: "traces" });
  const elements = new Map();
  const front = [];
  for (const one of shown) {
    if (!one.points.length) continue;
    const xy = new Float32Array(one.points.length * 2);
    one.points.forEach(([x, y], i) => {
      xy[2 * i] = sx(x);
      xy[2 * i + 1] = sy(y);
    });
    pixels.set(one.id, { one, xy });
    let text = "";
    for (let i = 0; i < xy.length; i += 2) text += `${xy[i].toFixed(1)},${xy[i + 1].toFixed(1)} `;
    const cls = `c${(one.color ?? 0) % 8}`;
    const last = xy.length - 2;
    const el = s(
      "g",
      { class: `trace ${cls}${one.emphasis ? ` ${one.emphasis}` : ""}`, "data-series": one.id },
      s("polyline", { points: text }),
      s("circle", { cx: xy[last], cy: xy[last + 1], r: 2.2 }),
    );
    elements.set(one.id, el);
    if (one.emphasis) front.push(el);
    else lines.append(el);
  }
  lines.append(...front);
  const readout = h("div", { class: "readout muted", "data-test": `${test}-readout` }, skipped ? `${skipped} value(s) not finite or not plottable, left out` : "");
  const svg = s(
    "svg",
    { class: "chart many", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `${yLabel} by ${xLabel}, ${pixels.size} curves`, "data-test": test, "data-points": ys.length, "data-curves": pixels.size },
    grid,
    rungs,
    lines,
  );
  let hovered = null;
  const nearest = (event) => {
    const [px, py] = svgPoint(svg, event, width);
    let best = null;
    let bestD = 24 ** 2; // pixels: farther than this from every curve is no curve
    for (const entry of pixels.values()) {
      const { xy } = entry;
      for (let i = 0; i < xy.length; i += 2) {
        const d = (xy[i] - px) ** 2 + (xy[i + 1] - py) ** 2;
        if (d < bestD) {
          bestD = d;
          best = [entry, i / 2];
        }
      }
    }
    return best;
  };
  const hover = (event) => {
    const found = event && nearest(event);
    const id = found ? found[0].one.id : null;
    if (hovered !== null && hovered !== id) elements.get(hovered)?.classList.remove("hover");
    hovered = id;
    if (!found) return;
    const el = elements.get(id);
    el.classList.add("hover");
    lines.append(el); // over the others
    const [one, i] = [found[0].one, found[1]];
    const [x, y] = one.points[i];
    readout.textContent = describe ? describe(one, [x, logY ? 10 ** y : y]) : `${one.name}: ${num(x, 6)} → ${fmtY(y)}`;
  };
  svg.addEventListener("mousemove", onFrame(hover));
  svg.addEventListener("mouseleave", () => hover(null));
  if (onPick) {
    svg.classList.add("pickable");
    svg.addEventListener("click", (event) => {
      const found = nearest(event);
      if (found) onPick(found[0].one.id);
    });
  }
  const key = legend.length ? h("div", { class: "legend" }, legend.map(([color, text]) => h("span", { class: `key c${color % 8}` }, text))) : null;
  fill(box, svg, key, readout);
  return ys.length;
}

// Mark the curves or lines in `box` whose ids are in `ids` as picked (drawn over the rest),
// without drawing the chart again.
export function markPicked(box, ids) {
  for (const el of box.querySelectorAll("[data-series]")) {
    const on = ids.has(el.dataset.series);
    el.classList.toggle("picked", on);
    if (on) el.parentNode.append(el);
  }
}

const PC = { left: 24, right: 24, top: 46, bottom: 26 };

// Where a value falls on an axis, 0 (bottom) to 1 (top), or null when it is not on it. Axes:
// {name, label, kind: "linear" | "log" | "category", lo, hi, values (of a category), invert}.
function place(axis, v) {
  let t = null;
  if (axis.kind === "category") {
    const i = axis.values.indexOf(String(v));
    t = i < 0 ? null : (i + 0.5) / axis.values.length;
  } else if (typeof v === "number" && Number.isFinite(v)) {
    if (axis.kind === "log") t = v > 0 ? (Math.log10(v) - Math.log10(axis.lo)) / (Math.log10(axis.hi) - Math.log10(axis.lo)) : null;
    else t = axis.hi > axis.lo ? (v - axis.lo) / (axis.hi - axis.lo) : 0.5;
  }
  if (t === null) return null;
  t = Math.min(Math.max(t, 0), 1);
  return axis.invert ? 1 - t : t;
}

function axisTicks(axis) {
  if (axis.kind === "category") return axis.values.map((v) => [v, v.length > 14 ? `${v.slice(0, 13)}…` : v]);
  if (axis.kind === "log") {
    const out = [];
    for (let e = Math.ceil(Math.log10(axis.lo) - 1e-9); e <= Math.floor(Math.log10(axis.hi) + 1e-9); e++) out.push([10 ** e, num(10 ** e, 2)]);
    return out.length >= 2 ? out : [[axis.lo, num(axis.lo, 2)], [axis.hi, num(axis.hi, 2)]];
  }
  return ticks(axis.lo, axis.hi, 4, axis.kind === "int").map((t) => [t, num(t, 3)]);
}

// Parallel coordinates: one vertical axis per entry of `axes`, one line per row across them.
// `rows`: [{id, values: [one per axis], color: a CSS color or null, emphasis: "best" | null}].
// A value off its axis (none, or not among a category's) breaks the line there. The line
// nearest the pointer is named (`describe(row)`); a click calls `onPick(id)`.
export function parallel(box, axes, rows, options = {}) {
  const { test = "parallel", onPick = null, describe = null } = options;
  const width = sized(box, () => parallel(box, axes, rows, options));
  const height = Math.round(Math.min(360, Math.max(240, width * 0.36)));
  const iw = width - PC.left - PC.right;
  const ih = height - PC.top - PC.bottom;
  const ax = (i) => PC.left + (axes.length > 1 ? (i / (axes.length - 1)) * iw : iw / 2);
  const ay = (t) => PC.top + (1 - t) * ih;
  const drawnAxes = axes.map((axis, i) => {
    const x = ax(i);
    const anchor = i === 0 ? "start" : i === axes.length - 1 ? "end" : "middle";
    const tickSide = i === axes.length - 1 ? -5 : 5;
    return s(
      "g",
      { class: "pc-axis", "data-axis": axis.name, "data-kind": axis.kind },
      s("line", { x1: x, x2: x, y1: PC.top, y2: PC.top + ih }),
      s("text", { class: "axis-name", x, y: PC.top - 26, "text-anchor": anchor }, axis.label || axis.name),
      s("text", { class: "tick", x, y: PC.top - 13, "text-anchor": anchor }, axis.kind === "log" ? "log scale" : ""),
      axisTicks(axis).map(([v, label]) => {
        const t = place(axis, v);
        return t === null ? null : s("text", { class: "tick", x: x + tickSide, y: ay(t) + 4, "text-anchor": tickSide > 0 ? "start" : "end" }, label);
      }),
    );
  });
  const pixels = [];
  const lines = s("g", { class: "pc-lines" });
  const elements = new Map();
  const front = [];
  for (const row of rows) {
    let d = "";
    let pen = false;
    const xy = [];
    row.values.forEach((v, i) => {
      const t = i < axes.length ? place(axes[i], v) : null;
      if (t === null) {
        pen = false;
        return;
      }
      const [x, y] = [ax(i), ay(t)];
      d += `${pen ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
      pen = true;
      xy.push([x, y]);
    });
    if (!d) continue;
    const el = s("path", { class: `pc-line${row.emphasis ? ` ${row.emphasis}` : ""}${row.color ? "" : " none"}`, d, stroke: row.color || null, "data-series": row.id });
    elements.set(row.id, el);
    pixels.push({ row, xy });
    if (row.emphasis) front.push(el);
    else lines.append(el);
  }
  lines.append(...front);
  const readout = h("div", { class: "readout muted", "data-test": `${test}-readout` });
  const svg = s(
    "svg",
    { class: "chart parallel", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `${axes.map((a) => a.name).join(", ")}: ${pixels.length} trials`, "data-test": test, "data-lines": pixels.length },
    lines,
    drawnAxes,
  );
  // The distance from the pointer to the nearest segment of each line, in pixels.
  const nearest = (event) => {
    const [px, py] = svgPoint(svg, event, width);
    let best = null;
    let bestD = 12 ** 2;
    for (const entry of pixels) {
      const { xy } = entry;
      for (let i = 0; i + 1 < xy.length; i++) {
        const [[xa, ya], [xb, yb]] = [xy[i], xy[i + 1]];
        if (px < Math.min(xa, xb) - 12 || px > Math.max(xa, xb) + 12) continue;
        const dx = xb - xa;
        const dy = yb - ya;
        const k = Math.max(0, Math.min(1, ((px - xa) * dx + (py - ya) * dy) / (dx * dx + dy * dy || 1)));
        const d = (xa + k * dx - px) ** 2 + (ya + k * dy - py) ** 2;
        if (d < bestD) {
          bestD = d;
          best = entry.row;
        }
      }
    }
    return best;
  };
  let hovered = null;
  const hover = (event) => {
    const row = event && nearest(event);
    const id = row ? row.id : null;
    if (hovered !== null && hovered !== id) elements.get(hovered)?.classList.remove("hover");
    hovered = id;
    if (!row) return;
    const el = elements.get(id);
    el.classList.add("hover");
    lines.append(el);
    readout.textContent = describe ? describe(row) : String(row.id);
  };
  svg.addEventListener("mousemove", onFrame(hover));
  svg.addEventListener("mouseleave", () => hover(null));
  if (onPick) {
    svg.classList.add("pickable");
    svg.addEventListener("click", (event) => {
      const row = nearest(event);
      if (row) onPick(row.id);
    });
  }
  fill(box, svg, readout);
  return pixels.length;
}
