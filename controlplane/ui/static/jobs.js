// The jobs list: filters, a page size, and pages through the whole set with its total; a box
// per job picks it to be compared with others (compare.js).
import { api, query, session } from "./api.js";
import { badge, empty, enc, fill, h, link, pager, when } from "./dom.js";

export const STATES = ["QUEUED", "DEPLOYING", "DOWNLOADING", "PROCESSING", "STORING", "COMPLETED", "FAILED", "CANCELLED"];
export const TERMINAL = new Set(["COMPLETED", "FAILED", "CANCELLED"]);
const ACTIVE = STATES.slice(0, 5);
const SIZES = [10, 25, 50, 100, 200];

// The compare page's address, here rather than in compare.js so that the list, which comes
// with the first load, links to it without loading the charts: one curve per comma, the jobs
// of one curve (a trial's rungs) joined by dots.
export const MOST_COMPARED = 16; // curves: past this a chart of overlaid lines is no longer read line by line
export const compareHash = (groups) => `#/compare?${new URLSearchParams({ jobs: groups.map((g) => g.join(".")).join(",") })}`;

// Jobs picked on the list, in the order picked, with their names (a pick on another page of
// the list is named without reading it again). Kept while the tab shows the dashboard, so that
// paging, filtering and Back from the compare page keep them, and in the tab's session storage
// for a reload; only for the identity that picked them, so that another sign-in in the same
// tab starts with none.
const PICKS = "trainyard.jobs.picked";
const who = () => (session.isAdmin ? "admin" : session.tenant);
let kept = { who: null, jobs: new Map() };

function readPicks() {
  if (kept.who === who()) return kept.jobs;
  kept = { who: who(), jobs: new Map() };
  try {
    const saved = JSON.parse(sessionStorage.getItem(PICKS));
    if (saved?.who === kept.who && Array.isArray(saved.jobs)) kept.jobs = new Map(saved.jobs.slice(0, MOST_COMPARED));
  } catch {
    // Storage refused (site data blocked) or a value not ours: none kept from before the load.
  }
  return kept.jobs;
}

function keepPicks() {
  try {
    sessionStorage.setItem(PICKS, JSON.stringify({ who: kept.who, jobs: [...kept.jobs] }));
  } catch {
    // Storage refused: the picks last until the page is loaded again.
  }
}

export function forgetPicks() {
  kept = { who: null, jobs: new Map() };
  try {
    sessionStorage.removeItem(PICKS);
  } catch {
    // Storage refused: nothing was kept there.
  }
}

export function labels(map) {
  return Object.entries(map || {}).map(([k, v]) => h("span", { class: "chip" }, `${k}=${v}`));
}

export async function jobsList(ctx) {
  ctx.title("Jobs");
  const q = ctx.q;
  const state = q.get("state") || "";
  const label = q.get("label") || "";
  const stateSelect = h(
    "select",
    { name: "state", "data-test": "filter-state", "aria-label": "state" },
    h("option", { value: "" }, "all states"),
    h("option", { value: "active" }, "active (queued to storing)"),
    STATES.map((st) => h("option", { value: st }, st.toLowerCase())),
  );
  stateSelect.value = state;
  const labelInput = h("input", {
    name: "label", value: label, placeholder: "label, e.g. team=vision", "data-test": "filter-label", "aria-label": "label filter",
  });
  const limit = Math.min(Math.max(Number(q.get("limit")) || 50, 1), 500);
  const sizeSelect = h(
    "select",
    { name: "limit", "data-test": "page-size", "aria-label": "jobs per page" },
    [...new Set([...SIZES, limit])].sort((a, b) => a - b).map((n) => h("option", { value: n }, `${n} per page`)),
  );
  sizeSelect.value = String(limit);
  const form = h("form", { class: "filters" }, stateSelect, labelInput, h("button", { type: "submit" }, "Filter"), h("span", { class: "grow" }), sizeSelect);
  const apply = (event) => {
    event.preventDefault();
    ctx.set({
      state: stateSelect.value || null, label: labelInput.value.trim() || null,
      limit: sizeSelect.value === "50" ? null : sizeSelect.value, cursor: null, page: null, from: null,
    });
  };
  form.addEventListener("submit", apply);
  stateSelect.addEventListener("change", apply);
  sizeSelect.addEventListener("change", apply);
  const body = h("div", { "data-test": "jobs" });
  const picks = readPicks();
  const pickedNote = h("span", { class: "muted", "data-test": "jobs-picked" });
  const pickedChips = h("span", { "data-test": "jobs-picked-list" });
  const compare = h("button", { type: "button", "data-test": "jobs-compare", disabled: true }, "Compare picked");
  const clear = h("button", { type: "button", "data-test": "jobs-clear-picked", disabled: true }, "Clear");
  const picksBar = h("div", { class: "toolbar" }, pickedNote, pickedChips, h("span", { class: "grow" }), compare, clear);
  fill(ctx.root, h("div", { class: "head" }, h("h1", null, "Jobs")), form, picksBar, body);

  // Drawn again on each pick, without reading the list again: its boxes and rows are marked
  // in place, and the bar names every pick, also those on other pages.
  const showPicks = () => {
    const full = picks.size >= MOST_COMPARED;
    pickedNote.textContent = picks.size
      ? `${picks.size} job${picks.size > 1 ? "s" : ""} picked${full ? ` (at most ${MOST_COMPARED})` : ""}:`
      : "Pick two or more jobs to compare their metric curves.";
    // Named again only when the picks changed, not at each redraw of the list: a button under
    // the pointer stays the one clicked.
    const drawn = [...picks.keys()].join();
    if (pickedChips.dataset.drawn !== drawn) {
      pickedChips.dataset.drawn = drawn;
      fill(
        pickedChips,
        [...picks].map(([id, name]) =>
          h("span", { class: "chip", "data-picked": id, title: id }, `${name} · ${id.slice(0, 8)} `, h("button", { type: "button", class: "unpick", "data-unpick": id, "aria-label": `unpick ${name}` }, "×")),
        ),
      );
    }
    compare.disabled = picks.size < 2;
    compare.title = picks.size < 2 ? "pick two or more jobs" : "";
    clear.disabled = !picks.size;
    for (const box of body.querySelectorAll("input[data-pick-job]")) {
      box.checked = picks.has(box.dataset.pickJob);
      box.disabled = full && !box.checked;
      box.closest("tr").classList.toggle("picked", box.checked);
    }
  };
  const changed = () => {
    keepPicks();
    showPicks();
  };
  let names = new Map(); // the shown page's jobs: id → name
  // One listener for the whole table (up to 500 rows), not one per box.
  body.addEventListener("change", (event) => {
    const id = event.target.dataset?.pickJob;
    if (!id) return;
    if (event.target.checked && picks.size < MOST_COMPARED) picks.set(id, names.get(id) || id.slice(0, 8));
    else picks.delete(id);
    changed();
  });
  pickedChips.addEventListener("click", (event) => {
    const id = event.target.dataset?.unpick;
    if (!id) return;
    picks.delete(id);
    changed();
  });
  compare.addEventListener("click", () => {
    location.hash = compareHash([...picks.keys()].map((id) => [id]));
  });
  clear.addEventListener("click", () => {
    picks.clear();
    changed();
  });

  const states = state === "active" ? ACTIVE : state ? [state] : [];
  const labelFilters = label.split(/[\s,]+/).filter(Boolean);
  const from = Number(q.get("from") || 1);
  const load = async () => {
    const page = await api(`/v1/jobs${query({ state: states, label: labelFilters, limit, cursor: q.get("cursor") })}`);
    names = new Map(page.jobs.map((j) => [j.id, j.manifest.name]));
    const columns = [
      [
        "",
        (j) => h("input", { type: "checkbox", "data-pick-job": j.id, "data-test": "pick-job", "aria-label": `pick ${j.manifest.name} to compare` }),
      ],
      ["Job", (j) => [link(`#/jobs/${enc(j.id)}`, j.manifest.name, { class: "strong" }), " ", h("span", { class: "mono muted" }, j.id.slice(0, 8))]],
      ["State", (j) => badge(j.state)],
      session.isAdmin ? ["Tenant", (j) => j.tenant] : null,
      ["Attempt", (j) => (j.restarts ? `${j.attempt} (${j.restarts} restart${j.restarts > 1 ? "s" : ""})` : String(j.attempt))],
      ["GPUs", (j) => String(j.manifest.learners * j.manifest.gpus_per_learner)],
      ["Nodes", (j) => j.nodes.join(", ") || "—"],
      ["Labels", (j) => labels(j.manifest.labels)],
      ["Submitted", (j) => when(j.submitted_at, { short: true })],
      ["Updated", (j) => when(j.updated_at, { short: true })],
    ].filter(Boolean);
    const filtered = states.length || labelFilters.length;
    // A redraw every few seconds must not throw a reader back to the table's left edge.
    const scrolled = body.querySelector(".table-wrap")?.scrollLeft || 0;
    fill(
      body,
      page.jobs.length
        ? table(columns, page.jobs)
        : empty(filtered ? "No jobs match these filters." : "No jobs yet: submit one with `trainyard submit job.yaml` or POST /v1/jobs."),
      pager(ctx, {
        from, shown: page.jobs.length, total: page.total, next: page.next_cursor, test: "jobs",
        trailKey: `jobs|${state}|${label}|${limit}`,
      }),
    );
    const wrap = body.querySelector(".table-wrap");
    if (wrap) wrap.scrollLeft = scrolled;
    showPicks();
  };
  showPicks();
  await ctx.guard(body, load);
  ctx.every(5000, () => ctx.guard(body, load));
}

function table(columns, rows) {
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { "data-test": "jobs-table" },
      h("thead", null, h("tr", null, columns.map(([t]) => h("th", null, t)))),
      h("tbody", null, rows.map((row) => h("tr", { "data-job": row.id }, columns.map(([, cell]) => h("td", null, cell(row)))))),
    ),
  );
}
