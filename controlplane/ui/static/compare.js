// Jobs compared: their metric curves overlaid on one chart, picked on the jobs list, from a
// search's trials (a trial's rungs are jobs of their own, drawn as one curve) or added by id.
// The page's address holds the jobs (`#/compare?jobs=A.B,C`: one curve per comma, its jobs
// joined by dots; jobs.js writes it), so a comparison is a link to share and Back returns to it.
import { api } from "./api.js";
import { plot } from "./charts.js";
import { badge, card, empty, enc, errorBox, fill, h, jobLink, num } from "./dom.js";
import { MOST_COMPARED as MOST, TERMINAL } from "./jobs.js";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function groupsOf(q) {
  return (q.get("jobs") || "")
    .split(",")
    .map((item) => item.split(".").filter((id) => UUID.test(id)))
    .filter((group) => group.length)
    .slice(0, MOST);
}

// One curve from a group's jobs' reports, in the order given (a trial's rungs): a step reported
// again (a restarted attempt, a rung resuming from a checkpoint) keeps its latest value, and
// each job's lowest learner stands for the job, as the search's curves do.
function curveOf(reports, name) {
  const steps = new Map();
  for (const metrics of reports) {
    let first = Infinity;
    for (const m of metrics) if (name in m.values && m.learner < first) first = m.learner;
    for (const m of metrics) if (m.learner === first && name in m.values) steps.set(m.step, m.values[name]);
  }
  return [...steps].sort((a, b) => a[0] - b[0]);
}

async function loadGroup(group) {
  const jobs = await Promise.all(group.map((id) => api(`/v1/jobs/${enc(id)}`)));
  const reports = await Promise.all(group.map((id) => api(`/v1/jobs/${enc(id)}/metrics`).then((r) => r.metrics)));
  return { group, jobs, reports };
}

export async function comparePage(ctx) {
  ctx.title("Compare jobs");
  const groups = groupsOf(ctx.q);
  const metricPick = h("select", { "data-test": "compare-metric", "aria-label": "metric" });
  const logScale = h("input", { type: "checkbox", "data-test": "compare-log" });
  const addInput = h("input", { class: "wide", placeholder: "add a job by its id", "aria-label": "job id", "data-test": "compare-add", spellcheck: "false" });
  const addForm = h("form", { class: "filters" }, addInput, h("button", { type: "submit" }, "Add"));
  const chartBox = h("div", { class: "chartbox", "data-test": "compare-box" });
  const tableBox = h("div", { "data-test": "compare-jobs" });
  const note = h("div");
  const missing = h("div");
  fill(
    ctx.root,
    h("div", { class: "head" }, h("h1", null, "Compare jobs"), h("span", { class: "muted" }, `${groups.length} curve${groups.length === 1 ? "" : "s"}`)),
    note,
    card("Metric curves", h("div", { class: "toolbar" }, h("label", null, "metric ", metricPick), h("label", null, logScale, " log scale")), missing, chartBox),
    card("Jobs", tableBox, addForm),
  );
  const go = (next) => ctx.set({ jobs: next.length ? next.map((g) => g.join(".")).join(",") : null });
  addForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const id = addInput.value.trim().toLowerCase();
    if (!UUID.test(id)) {
      fill(note, errorBox(new Error("a job's id is a UUID, as the jobs list and `trainyard status` show it"), "compare-add-error"));
      return;
    }
    if (groups.length >= MOST) {
      fill(note, errorBox(new Error(`at most ${MOST} curves at once: remove one first`), "compare-add-error"));
      return;
    }
    go([...groups, [id]]);
  });
  if (groups.length < 2) fill(note, empty("Pick two or more jobs on the jobs list or trials on a search's page, or add jobs by their ids below.", "compare-few"));

  let loaded = [];
  const draw = () => {
    const shown = loaded.filter((g) => g.reports);
    const names = [...new Set(shown.flatMap((g) => g.reports.flat().flatMap((m) => Object.keys(m.values))))];
    const common = names.filter((n) => shown.every((g) => g.reports.flat().some((m) => n in m.values)));
    if (metricPick.options.length !== names.length) fill(metricPick, names.map((n) => h("option", { value: n }, n)));
    const chosen = names.includes(metricPick.value) ? metricPick.value : common.find((n) => /loss/i.test(n)) || common[0] || names[0];
    if (chosen) metricPick.value = chosen;
    const curves = loaded.map((g, i) => ({ ...g, color: i, points: g.reports && chosen ? curveOf(g.reports, chosen) : [] }));
    const name = (g) => (g.jobs ? g.jobs[0].manifest.name : g.group[0].slice(0, 8));
    // A job that reported nothing (still queued, or a job that never logs metrics), or not the
    // chosen metric, has no line: said above the chart and in its row, so that a curve missing
    // from the chart is never taken for one hidden under another.
    const why = (c) => {
      if (!c.reports || c.points.length) return null;
      const still = c.jobs.some((j) => !TERMINAL.has(j.state));
      if (!c.reports.some((r) => r.length)) return still ? "no metrics reported yet" : "reported no metrics";
      return `reported no ${chosen}${still ? " yet" : ""}`;
    };
    const quiet = curves.filter(why);
    fill(
      missing,
      quiet.length && names.length
        ? h("p", { class: "muted", "data-test": "compare-no-metrics" }, `Not drawn: ${quiet.map((c) => `${name(c)} · ${c.group[c.group.length - 1].slice(0, 8)} (${why(c)})`).join("; ")}.`)
        : null,
    );
    if (!names.length) fill(chartBox, empty(shown.length ? "These jobs have reported no metrics." : loaded.length ? "None of these jobs could be read: see each below." : "No jobs to compare.", "compare-empty"));
    else {
      plot(
        chartBox,
        curves.filter((c) => c.points.length).map((c) => ({ name: `${name(c)} · ${c.group[c.group.length - 1].slice(0, 8)}`, points: c.points, color: c.color })),
        { xLabel: "step", yLabel: chosen, logY: logScale.checked, test: "compare-chart" },
      );
    }
    fill(
      tableBox,
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { "data-test": "compare-table" },
          h("thead", null, h("tr", null, ["", "Job", "State", "Jobs (rung by rung)", "Last", "Lowest", "Highest", "Steps", ""].map((t) => h("th", null, t)))),
          h(
            "tbody",
            null,
            curves.map((c, i) => {
              let [lowest, highest] = [null, null];
              for (const [, v] of c.points) {
                if (typeof v !== "number") continue;
                if (lowest === null || v < lowest) lowest = v;
                if (highest === null || v > highest) highest = v;
              }
              const remove = h("button", { type: "button", "data-test": "compare-remove" }, "Remove");
              remove.addEventListener("click", () => go(groups.filter((_, k) => k !== i)));
              const last = c.jobs?.[c.jobs.length - 1];
              return h(
                "tr",
                { "data-compare": c.group.join(".") },
                h("td", null, c.points.length ? h("span", { class: `key c${c.color % 8}` }) : null),
                h("td", null, c.jobs ? h("a", { href: `#/jobs/${enc(last.id)}`, class: "strong" }, name(c)) : errorBox(c.error, "compare-error")),
                h("td", null, last ? badge(last.state) : ""),
                h("td", null, c.group.map((id) => [jobLink(id), " "])),
                h("td", null, c.points.length ? num(c.points[c.points.length - 1][1]) : why(c) ? h("span", { class: "muted", "data-test": "compare-no-metric" }, why(c)) : "—"),
                h("td", null, num(lowest)),
                h("td", null, num(highest)),
                h("td", null, String(c.points.length)),
                h("td", null, remove),
              );
            }),
          ),
        ),
      ),
    );
  };
  metricPick.addEventListener("change", draw);
  logScale.addEventListener("change", draw);

  const load = async () => {
    const settled = await Promise.allSettled(groups.map(loadGroup));
    loaded = settled.map((r, i) => (r.status === "fulfilled" ? r.value : { group: groups[i], error: r.reason }));
    if (loaded.some((g) => g.error?.status === 401)) return;
    draw();
  };
  await ctx.guard(chartBox, load);
  // Jobs still training: their curves grow while the page is open.
  ctx.every(5000, () => loaded.some((g) => g.jobs?.some((j) => !TERMINAL.has(j.state))) && ctx.guard(chartBox, load, { keep: true }));
}
