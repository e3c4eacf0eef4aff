// Searches: the list, and one search's trials as a chart (each trial's metric at each rung, and
// the best so far), live from the search's event stream.
import { api, query } from "./api.js";
import { plot } from "./charts.js";
import { badge, card, compactJson, empty, enc, fill, h, jobLink, kv, link, num, pager, table, when } from "./dom.js";

const STATES = ["running", "completed", "failed", "cancelled"];
const EVENTS = ["SearchSubmitted", "TrialCreated", "TrialPromoted", "TrialRungFinished", "TrialFailed", "TrialPruned", "BestUpdated", "SearchEnded"];
const PAGE = 50;

const bestText = (s) => (s.best ? `${num(s.best.metric)} (trial ${s.best.trial}, rung ${s.best.rung})` : "—");

export async function searchesList(ctx) {
  ctx.title("Searches");
  const state = ctx.q.get("state") || "";
  const select = h(
    "select",
    { "data-test": "search-state", "aria-label": "state" },
    h("option", { value: "" }, "all states"),
    STATES.map((st) => h("option", { value: st }, st)),
  );
  select.value = state;
  select.addEventListener("change", () => ctx.set({ state: select.value || null, cursor: null, page: null, from: null }));
  const body = h("div", { "data-test": "searches" });
  fill(ctx.root, h("div", { class: "head" }, h("h1", null, "Searches")), h("div", { class: "filters" }, select), body);
  const from = Number(ctx.q.get("from") || 1);
  const load = async () => {
    const page = await api(`/v1/searches${query({ state, limit: PAGE, cursor: ctx.q.get("cursor") })}`);
    fill(
      body,
      page.searches.length
        ? table(
            [
              ["Search", (s) => [link(`#/searches/${enc(s.id)}`, s.name, { class: "strong" }), " ", h("span", { class: "mono muted" }, s.id.slice(0, 8))]],
              ["State", (s) => badge(s.state)],
              ["Searcher", (s) => s.searcher],
              ["Metric", (s) => `${s.metric.name} (${s.metric.mode})`],
              ["Trials", (s) => `${s.trials} of ${s.max_trials}`],
              ["Best", bestText],
              ["Created", (s) => when(s.created_at, { short: true })],
            ],
            page.searches,
            { test: "searches-table" },
          )
        : empty(state ? `No ${state} searches.` : "No searches yet: start one with `trainyard search submit FILE`."),
      pager(ctx, { from, shown: page.searches.length, total: page.total ?? null, next: page.next_cursor, test: "searches", trailKey: `searches|${state}` }),
    );
  };
  await ctx.guard(body, load);
  ctx.every(5000, () => ctx.guard(body, load, { keep: true }));
}

function trialSeries(trials, mode) {
  const rungs = new Map();
  const done = [];
  for (const t of trials) {
    for (const r of t.results) {
      if (!rungs.has(r.rung)) rungs.set(r.rung, []);
      rungs.get(r.rung).push([t.number, r.metric]);
      done.push([t.number, r.metric]);
    }
  }
  const series = [...rungs.entries()]
    .sort(([a], [b]) => a - b)
    .map(([rung, points]) => ({ name: `rung ${rung}`, points, mode: "points", color: rung }));
  // The best so far, in trial order: what the search had found by then.
  done.sort((a, b) => a[0] - b[0]);
  const better = mode === "min" ? (a, b) => a < b : (a, b) => a > b;
  const best = [];
  for (const [n, v] of done) {
    if (typeof v !== "number") continue;
    const prev = best.length ? best[best.length - 1][1] : null;
    best.push([n, prev == null || better(v, prev) ? v : prev]);
  }
  if (best.length) series.push({ name: "best so far", points: best, mode: "step", color: 7 });
  return series;
}

export async function searchPage(ctx, id) {
  ctx.title("Search");
  const head = h("div", { class: "head" });
  const info = h("div");
  const chartBox = h("div", { class: "chartbox", "data-test": "trials-chart-box" });
  const trialsBox = h("div", { "data-test": "trials" });
  const live = h("span", { class: "pill", "data-test": "search-live" });
  fill(ctx.root, head, info, card("Trials", h("div", { class: "toolbar" }, live), chartBox, trialsBox));
  let events = null;

  const load = async () => {
    const [search, { trials }] = await Promise.all([api(`/v1/searches/${enc(id)}`), api(`/v1/searches/${enc(id)}/trials`)]);
    ctx.title(search.name);
    fill(head, h("div", null, h("h1", null, search.name, " ", badge(search.state)), h("div", { class: "mono muted small" }, search.id)));
    const spec = search.spec || {};
    fill(
      info,
      h(
        "div",
        { class: "grid2" },
        card(
          "Search",
          kv([
            ["Searcher", `${search.searcher}${spec.searcher ? ` ${compactJson(spec.searcher)}` : ""}`],
            ["Metric", `${search.metric.name}, ${search.metric.mode === "min" ? "lower" : "higher"} is better`],
            ["Budget", spec.budget ? `${spec.budget.max} ${spec.budget.unit} per trial` : null],
            ["Trials", `${search.trials} of ${search.max_trials}${spec.max_concurrent_trials ? `, ${spec.max_concurrent_trials} at once` : ""}`],
            ["Created", when(search.created_at)],
            ["Ended", search.ended_at ? [when(search.ended_at), search.reason ? `: ${search.reason}` : ""] : null],
          ]),
        ),
        card(
          "Best so far",
          search.best
            ? h(
                "div",
                { "data-test": "best" },
                h("div", { class: "big" }, num(search.best.metric)),
                kv([
                  ["Trial", String(search.best.trial)],
                  ["Rung", String(search.best.rung)],
                  ["Hyperparameters", h("code", null, compactJson((trials.find((t) => t.number === search.best.trial) || {}).hparams || {}))],
                  ["Job", (() => { const t = trials.find((x) => x.number === search.best.trial); return t ? jobLink(t.job_id) : null; })()],
                ]),
              )
            : empty("No trial has reported its metric yet.", "no-best"),
        ),
      ),
    );
    const series = trialSeries(trials, search.metric.mode);
    if (series.length) plot(chartBox, series, { xLabel: "trial", yLabel: search.metric.name, test: "trials-chart" });
    else fill(chartBox, empty("No trial has finished a rung yet.", "trials-chart-empty"));
    fill(
      trialsBox,
      trials.length
        ? table(
            [
              ["#", (t) => String(t.number)],
              ["State", (t) => badge(t.state)],
              ["Rung", (t) => String(t.rung)],
              ["Budget", (t) => String(t.budget)],
              [search.metric.name, (t) => num(t.metric)],
              ["Per rung", (t) => t.results.map((r) => `${r.rung}: ${num(r.metric)}`).join(", ")],
              ["Hyperparameters", (t) => h("code", { class: "small" }, compactJson(t.hparams))],
              ["Job", (t) => jobLink(t.job_id)],
              ["Why", (t) => h("span", { class: "reason" }, t.reason || "")],
            ],
            trials,
            { test: "trials-table", rowProps: (t) => ({ "data-trial": t.number }) },
          )
        : empty("No trials yet."),
    );
    if (search.state !== "running" && events) events.close("ended");
    return search;
  };

  let search = null;
  const ok = await ctx.guard(info, async () => (search = await load()), { fatal: ctx.root, test: "search-error" });
  if (!ok || search.state !== "running") return;
  const soon = ctx.throttle(() => ctx.guard(trialsBox, load, { keep: true }), 1000);
  const handlers = Object.fromEntries(EVENTS.map((e) => [e, soon]));
  // The server ends the stream after SearchEnded: closed here, or the browser would reconnect.
  handlers.SearchEnded = () => {
    events.close("ended");
    soon();
  };
  events = ctx.stream(`/v1/searches/${enc(id)}/events`, {
    ordered: handlers,
    status: (st) => {
      live.textContent = st === "ended" ? "search ended" : st;
      live.dataset.state = st;
    },
  });
}
