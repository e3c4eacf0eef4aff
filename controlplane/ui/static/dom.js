// Building elements and formatting values. Every piece of data reaches the page as a text node
// or an attribute value, never as markup: a tenant's job name cannot become HTML.

export function h(tag, props, ...kids) {
  return build(document.createElement(tag), props, kids);
}

const SVG = "http://www.w3.org/2000/svg";
export function s(tag, props, ...kids) {
  return build(document.createElementNS(SVG, tag), props, kids);
}

function build(el, props, kids) {
  for (const [k, v] of Object.entries(props || {})) {
    if (v == null || v === false) continue;
    if (k === "class") el.setAttribute("class", v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  add(el, kids);
  return el;
}

export function add(el, kids) {
  for (const kid of [kids].flat(Infinity)) {
    if (kid == null || kid === false) continue;
    el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}

export function fill(el, ...kids) {
  el.replaceChildren();
  return add(el, kids);
}

export const enc = encodeURIComponent;

// Hash links only, built from ids: no tenant text ever becomes a URL scheme.
export const link = (hash, text, props) => h("a", { href: hash, ...props }, text);
export const jobLink = (id, text) =>
  link(`#/jobs/${enc(id)}`, text || String(id).slice(0, 8), { class: "mono", title: id });

export function badge(state) {
  const name = String(state ?? "unknown");
  return h("span", { class: `badge st-${name.toLowerCase()}`, "data-state": name }, name);
}

const STEPS = [
  [60, "s", 1],
  [3600, "min", 60],
  [86400, "h", 3600],
  [Infinity, "d", 86400],
];

export function ago(iso, now = Date.now()) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "";
  const secs = (now - t) / 1000;
  const abs = Math.abs(secs);
  if (abs < 5) return "just now";
  const [, unit, per] = STEPS.find(([limit]) => abs < limit);
  const n = Math.floor(abs / per);
  return secs >= 0 ? `${n} ${unit} ago` : `in ${n} ${unit}`;
}

const stamp = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });
const clock = new Intl.DateTimeFormat(undefined, { timeStyle: "medium" });
const dayTime = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
export const localTime = (iso) => (iso ? stamp.format(new Date(iso)) : "—");
// In lists: the time of day for today, else the day and minute; the whole stamp on hover.
export function shortTime(iso) {
  const t = new Date(iso);
  return t.toDateString() === new Date().toDateString() ? clock.format(t) : dayTime.format(t);
}
export const clockTime = (iso) => (iso ? clock.format(new Date(iso)) : "");

// A time as people read it: local, with its age beside it, kept current by `refreshAges`.
export function when(iso, { age = true, short = false } = {}) {
  if (!iso) return h("span", { class: "muted" }, "—");
  const el = h("time", { datetime: iso, title: `${localTime(iso)} (${iso})` }, short ? shortTime(iso) : localTime(iso));
  if (!age) return el;
  return h("span", { class: "when" }, el, " ", h("span", { class: "age", "data-at": iso }, ago(iso)));
}

export function refreshAges(root = document) {
  const now = Date.now();
  for (const el of root.querySelectorAll(".age[data-at]")) el.textContent = ago(el.dataset.at, now);
}

export function duration(seconds) {
  if (seconds == null || !Number.isFinite(seconds)) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  const m = Math.floor(seconds / 60);
  if (m < 60) return `${m} min ${Math.round(seconds % 60)} s`;
  const hours = Math.floor(m / 60);
  return hours < 48 ? `${hours} h ${m % 60} min` : `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

export function bytes(n) {
  if (n == null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i ? n.toFixed(n < 10 ? 1 : 0) : n} ${units[i]}`;
}

export function num(v, digits = 4) {
  if (v == null) return "—";
  if (typeof v !== "number") return String(v); // "inf", "nan": as the API sends them
  if (Number.isInteger(v)) return v.toLocaleString();
  return Number(v.toPrecision(digits)).toString();
}

export const ms = (v) => (v == null ? "—" : v >= 1000 ? `${num(v / 1000, 3)} s` : `${num(v, 3)} ms`);

// A table whose rows come from `rows`, each column a [heading, cell(row)] pair; wrapped so a
// narrow screen scrolls it sideways instead of squeezing it.
export function table(columns, rows, props = {}) {
  const head = h("tr", null, columns.map(([title]) => h("th", null, title)));
  const body = rows.map((row) =>
    h(
      "tr",
      props.rowProps ? props.rowProps(row) : null,
      columns.map(([, cell]) => h("td", null, cell(row))),
    ),
  );
  return h(
    "div",
    { class: "table-wrap" },
    h("table", { "data-test": props.test }, h("thead", null, head), h("tbody", null, body)),
  );
}

// The page's own sentences, with `commands` set as code; never for data, which stays text.
export const prose = (text) => String(text).split("`").map((part, i) => (i % 2 ? h("code", null, part) : part));

export const empty = (text, test = "empty") => h("p", { class: "empty", "data-test": test }, prose(text));

export function errorBox(err, test = "error") {
  const status = err && err.status ? `${err.status}: ` : "";
  return h("div", { class: "error", role: "alert", "data-test": test }, status + message(err));
}

export const message = (err) => (err && err.message) || String(err);

export function kv(pairs) {
  return h(
    "dl",
    { class: "kv" },
    pairs
      .filter((p) => p)
      .map(([k, v]) => [h("dt", null, k), h("dd", null, v == null || v === "" ? "—" : v)]),
  );
}

export function card(title, ...kids) {
  return h("section", { class: "card" }, title ? h("h2", null, title) : null, kids);
}

export const compactJson = (v) => JSON.stringify(v);

// Previous pages' cursors, per filter: the API pages forward only, so the way back is kept here
// (lost on a reload, where "previous" goes back to the first page).
const trails = new Map();

export function pager(ctx, { from, shown, total, next, trailKey, test }) {
  const trail = trails.get(trailKey) || [];
  const page = Number(ctx.q.get("page") || 1);
  const to = from + shown - 1;
  const range =
    total == null
      ? shown ? `showing ${from.toLocaleString()}–${to.toLocaleString()}${next ? ", more after these" : ""}` : ""
      : shown ? `showing ${from.toLocaleString()}–${to.toLocaleString()} of ${total.toLocaleString()}` : `0 of ${total.toLocaleString()}`;
  const go = (cursor, newPage, newFrom) =>
    ctx.set({ cursor, page: newPage > 1 ? newPage : null, from: newFrom > 1 ? newFrom : null });
  const prev = h("button", { type: "button", "data-test": `${test}-prev`, disabled: page <= 1 }, "← Previous");
  prev.addEventListener("click", () => {
    const back = trail[page - 2];
    if (back) go(back.cursor, page - 1, back.from);
    else go(null, 1, 1);
  });
  const nextButton = h("button", { type: "button", "data-test": `${test}-next`, disabled: !next }, "Next →");
  nextButton.addEventListener("click", () => {
    trail[page - 1] = { cursor: ctx.q.get("cursor"), from };
    trails.set(trailKey, trail);
    go(next, page + 1, to + 1);
  });
  return h("div", { class: "pager" }, h("span", { class: "range", "data-test": `${test}-range` }, range), h("span", { class: "grow" }), prev, nextButton);
}
