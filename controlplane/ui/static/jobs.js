// The jobs list: filters, a page size, and pages through the whole set with its total.
import { api, query, session } from "./api.js";
import { badge, empty, enc, fill, h, link, pager, when } from "./dom.js";

export const STATES = ["QUEUED", "DEPLOYING", "DOWNLOADING", "PROCESSING", "STORING", "COMPLETED", "FAILED", "CANCELLED"];
export const TERMINAL = new Set(["COMPLETED", "FAILED", "CANCELLED"]);
const ACTIVE = STATES.slice(0, 5);
const SIZES = [10, 25, 50, 100, 200];

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
  fill(ctx.root, h("div", { class: "head" }, h("h1", null, "Jobs")), form, body);

  const states = state === "active" ? ACTIVE : state ? [state] : [];
  const labelFilters = label.split(/[\s,]+/).filter(Boolean);
  const from = Number(q.get("from") || 1);
  const load = async () => {
    const page = await api(`/v1/jobs${query({ state: states, label: labelFilters, limit, cursor: q.get("cursor") })}`);
    const columns = [
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
  };
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
