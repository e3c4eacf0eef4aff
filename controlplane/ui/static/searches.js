// Searches: the list, and one search's page, live from its event stream: every trial's metric
// curve on one chart (coloured by the rung it reached, the best drawn over the rest), its
// hyperparameters against the objective in parallel coordinates, each trial's metric at each
// rung and the best so far, and the trials' table, where (as on both charts, by a click)
// trials are picked to be compared on a page of their own (compare.js).
import { api, query } from "./api.js";
import { markPicked, parallel, plot, traces } from "./charts.js";
import { compareHash } from "./jobs.js";
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

// Every trial's curve, in as few requests as the API pages them (one up to 1,000 trials).
async function allCurves(id) {
  const trials = [];
  let after = null;
  for (;;) {
    const page = await api(`/v1/searches/${enc(id)}/curves${query({ after })}`);
    for (const t of page.trials) trials.push(t);
    if (page.next_after == null) return { ...page, trials };
    after = page.next_after;
  }
}

// The budgets of the searcher's rungs, as `searchers.Asha.rungs` computes them: where a trial's
// curve crosses into its next rung.
function rungBudgets(spec) {
  const max = spec.budget?.max;
  const searcher = spec.searcher || {};
  if (!max) return [];
  if (searcher.name !== "asha") return [max];
  const least = searcher.min_budget;
  const factor = searcher.reduction ?? 3;
  const steps = Math.ceil(Math.log(max / least) / Math.log(factor) - 1e-9);
  return [...new Set(Array.from({ length: steps + 1 }, (_, k) => Math.min(least * factor ** k, max)))];
}

// One axis per hyperparameter of the space (a `repeat` by how many items it drew), scaled as
// the space draws it: log-uniform on a log scale, a choice by its values.
function hparamAxes(space) {
  return Object.entries(space?.params || {}).map(([name, p]) => {
    const of = (hp) => hp[name];
    switch (p.type) {
      case "log_uniform":
        return { name, kind: "log", lo: p.low, hi: p.high, of };
      case "uniform":
        return { name, kind: "linear", lo: p.low, hi: p.high, of };
      case "int":
        return { name, kind: "int", lo: p.low, hi: p.high, of };
      case "choice":
        return { name, kind: "category", values: p.values.map(String), of };
      default: // repeat
        return { name, label: `${name} (items)`, kind: "int", lo: p.min, hi: p.max, of: (hp) => (Array.isArray(hp[name]) ? hp[name].length : null) };
    }
  });
}

// From blue (the worst metric) to orange (the best).
const shade = (t) => `hsl(${Math.round(215 - 190 * t)}, 75%, 48%)`;

const rungBadge = (rung, top) => h("span", { class: `rung c${rung % 8}`, "data-rung": rung, title: top ? "the top rung: the whole budget" : "" }, `rung ${rung}${top ? " (top)" : ""}`);

export async function searchPage(ctx, id) {
  ctx.title("Search");
  const head = h("div", { class: "head" });
  const info = h("div");
  const curvesBox = h("div", { class: "chartbox", "data-test": "curves-box" });
  const parallelBox = h("div", { class: "chartbox", "data-test": "parallel-box" });
  const chartBox = h("div", { class: "chartbox", "data-test": "trials-chart-box" });
  const trialsBox = h("div", { "data-test": "trials" });
  const live = h("span", { class: "pill", "data-test": "search-live" });
  const logScale = h("input", { type: "checkbox", "data-test": "curves-log" });
  const curvesNote = h("span", { class: "muted small", "data-test": "curves-note" });
  const pickedNote = h("span", { class: "muted", "data-test": "picked" }, "Pick trials (click a curve, a line or a row) to compare them.");
  const compare = h("button", { type: "button", "data-test": "compare", disabled: true }, "Compare picked");
  const clear = h("button", { type: "button", "data-test": "clear-picked", disabled: true }, "Clear");
  fill(
    ctx.root,
    head,
    info,
    card("Curves", h("div", { class: "toolbar" }, h("label", null, logScale, " log scale"), curvesNote), curvesBox),
    card("Hyperparameters against the objective", parallelBox),
    card("Trials", h("div", { class: "toolbar" }, live, h("span", { class: "grow" }), pickedNote, compare, clear), chartBox, trialsBox),
  );
  let events = null;
  let search = null;
  let trials = [];
  let curves = null;
  const picked = new Set(); // trial numbers, as the charts' data-series (text)

  const showPicked = () => {
    for (const box of [curvesBox, parallelBox]) markPicked(box, picked);
    for (const input of trialsBox.querySelectorAll("input[data-pick]")) input.checked = picked.has(input.dataset.pick);
    for (const row of trialsBox.querySelectorAll("tr[data-trial]")) row.classList.toggle("picked", picked.has(row.dataset.trial));
    pickedNote.textContent = picked.size ? `${picked.size} trial${picked.size > 1 ? "s" : ""} picked: ${[...picked].sort((a, b) => a - b).join(", ")}` : "Pick trials (click a curve, a line or a row) to compare them.";
    compare.disabled = picked.size < 2;
    clear.disabled = !picked.size;
  };
  const toggle = (number) => {
    const key = String(number);
    if (picked.has(key)) picked.delete(key);
    else picked.add(key);
    showPicked();
  };
  compare.addEventListener("click", () => {
    const jobs = new Map((curves?.trials || []).map((t) => [String(t.number), t.jobs]));
    const byNumber = new Map(trials.map((t) => [String(t.number), [t.job_id]]));
    location.hash = compareHash([...picked].sort((a, b) => a - b).map((n) => jobs.get(n) || byNumber.get(n)).filter(Boolean));
  });
  clear.addEventListener("click", () => {
    picked.clear();
    showPicked();
  });

  const describe = (number) => {
    const t = trials.find((x) => x.number === number);
    return t ? `trial ${t.number}, rung ${t.rung}, ${t.state}: ${search.metric.name} ${num(t.metric)}; ${compactJson(t.hparams)}` : `trial ${number}`;
  };

  const drawCurves = () => {
    if (!curves || !search) return;
    const best = search.best?.trial;
    const series = curves.trials.map((t) => ({
      id: String(t.number),
      name: `trial ${t.number}`,
      points: t.points,
      color: t.rung,
      emphasis: t.number === best ? "best" : null,
    }));
    const budgets = rungBudgets(search.spec || {});
    const rungsSeen = [...new Set(curves.trials.map((t) => t.rung))].sort((a, b) => a - b);
    const thinned = curves.trials.filter((t) => t.reported > t.points.length).length;
    curvesNote.textContent = `${curves.trials.length} trial${curves.trials.length === 1 ? "" : "s"}${thinned ? `; ${thinned} curve(s) thinned to an even sample of their reports` : ""}; colour: the rung each reached${best != null ? `; thick: the best (trial ${best})` : ""}.`;
    traces(curvesBox, series, {
      xLabel: "step",
      yLabel: curves.metric,
      logY: logScale.checked,
      test: "curves-chart",
      marks: budgets.length > 1 ? budgets.slice(0, -1).map((x, k) => ({ x, label: `rung ${k}` })) : [],
      legend: rungsSeen.map((r) => [r, `reached rung ${r}`]),
      onPick: toggle,
      describe: (one, [x, y]) => `${describe(Number(one.id))}, at step ${num(x, 6)}: ${num(y)}`,
    });
  };
  logScale.addEventListener("change", () => {
    drawCurves();
    showPicked();
  });

  const drawParallel = () => {
    if (!search) return;
    const axes = hparamAxes(search.spec?.space);
    const mode = search.metric.mode;
    const scored = new Set(trials.filter((t) => typeof t.metric === "number" && Number.isFinite(t.metric)));
    let lo = Infinity;
    let hi = -Infinity;
    for (const t of scored) {
      lo = Math.min(lo, t.metric);
      hi = Math.max(hi, t.metric);
    }
    const objective = { name: search.metric.name, label: `${search.metric.name} (best at the top)`, kind: "linear", lo, hi, invert: mode === "min", of: (t) => t.metric };
    if (!axes.length) {
      fill(parallelBox, empty("This search's space has no hyperparameters to draw.", "parallel-empty"));
      return;
    }
    const goodness = (v) => (hi > lo ? (mode === "min" ? hi - v : v - lo) / (hi - lo) : 1);
    const rows = trials.map((t) => ({
      id: String(t.number),
      values: [...axes.map((a) => a.of(t.hparams || {})), scored.has(t) ? t.metric : null],
      color: scored.has(t) ? shade(goodness(t.metric)) : null,
      emphasis: t.number === search.best?.trial ? "best" : null,
    }));
    parallel(parallelBox, scored.size ? [...axes, objective] : axes, rows, {
      test: "parallel-chart",
      onPick: toggle,
      describe: (row) => describe(Number(row.id)),
    });
  };

  const drawTable = () => {
    const top = rungBudgets(search.spec || {}).length - 1;
    fill(
      trialsBox,
      trials.length
        ? table(
            [
              ["", (t) => h("input", { type: "checkbox", "data-pick": t.number, "aria-label": `pick trial ${t.number}`, onchange: () => toggle(t.number) })],
              ["#", (t) => String(t.number)],
              ["State", (t) => badge(t.state)],
              ["Rung", (t) => rungBadge(t.rung, t.rung === top && top > 0)],
              ["Budget", (t) => String(t.budget)],
              [search.metric.name, (t) => num(t.metric)],
              ["Per rung", (t) => t.results.map((r) => `${r.rung}: ${num(r.metric)}`).join(", ")],
              ["Hyperparameters", (t) => h("code", { class: "small" }, compactJson(t.hparams))],
              ["Job", (t) => jobLink(t.job_id)],
              ["Why", (t) => h("span", { class: "reason" }, t.reason || "")],
            ],
            trials,
            { test: "trials-table", rowProps: (t) => ({ "data-trial": t.number, class: t.number === search.best?.trial ? "best-row" : null }) },
          )
        : empty("No trials yet."),
    );
  };

  let fetched = 0; // when the last of the page's first reads answered, by the page's clock
  const load = async () => {
    const [fresh, listed] = await Promise.all([api(`/v1/searches/${enc(id)}`), api(`/v1/searches/${enc(id)}/trials`)]);
    fetched = Math.max(fetched, performance.now());
    search = fresh;
    trials = listed.trials;
    ctx.title(search.name);
    fill(head, h("div", null, h("h1", null, search.name, " ", badge(search.state)), h("div", { class: "mono muted small" }, search.id)));
    const spec = search.spec || {};
    const bestTrial = search.best ? trials.find((t) => t.number === search.best.trial) : null;
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
            ["Rungs", rungBudgets(spec).length > 1 ? rungBudgets(spec).map((b, k) => `${k}: ${b}`).join(", ") : null],
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
                  ["Hyperparameters", h("code", null, compactJson(bestTrial?.hparams || {}))],
                  ["Job", bestTrial ? jobLink(bestTrial.job_id) : null],
                ]),
              )
            : empty("No trial has reported its metric yet.", "no-best"),
        ),
      ),
    );
    const series = trialSeries(trials, search.metric.mode);
    if (series.length) plot(chartBox, series, { xLabel: "trial", yLabel: search.metric.name, test: "trials-chart" });
    else fill(chartBox, empty("No trial has finished a rung yet.", "trials-chart-empty"));
    drawTable();
    drawParallel();
    drawCurves();
    showPicked();
    if (search.state !== "running" && events) events.close("ended");
  };
  const loadCurves = async () => {
    curves = await allCurves(id);
    fetched = Math.max(fetched, performance.now());
    drawCurves();
    showPicked();
  };

  // For `trainyard bench ui`: when the page first showed every part, by the page's clock.
  let rendered = null;
  ctx.hook("searchRendered", () => rendered);
  const started = performance.now();
  const [ok] = await Promise.all([
    ctx.guard(info, load, { fatal: ctx.root, test: "search-error" }),
    ctx.guard(curvesBox, loadCurves, { test: "curves-error" }),
  ]);
  requestAnimationFrame(() =>
    setTimeout(() => {
      const now = performance.now();
      rendered = { at_ms: now, since_route_ms: now - started, fetched_ms: fetched - started, trials: trials.length, curves: curves?.trials.length ?? 0 };
    }),
  );
  if (!ok || search.state !== "running") return;
  const soon = ctx.throttle(() => ctx.guard(trialsBox, load, { keep: true }), 1000);
  // Curves are the larger read: at most one every few seconds, however fast trials report.
  const curvesSoon = ctx.throttle(() => ctx.guard(curvesBox, loadCurves, { keep: true }), 4000);
  const changed = () => {
    soon();
    curvesSoon();
  };
  const handlers = Object.fromEntries(EVENTS.map((e) => [e, changed]));
  // The server ends the stream after SearchEnded: closed here, or the browser would reconnect.
  handlers.SearchEnded = () => {
    events.close("ended");
    changed();
  };
  events = ctx.stream(`/v1/searches/${enc(id)}/events`, {
    ordered: handlers,
    status: (st) => {
      live.textContent = st === "ended" ? "search ended" : st;
      live.dataset.state = st;
    },
  });
  // Trials report their curves in their logs, between the search's events; and the read model
  // may not have caught up with the events the stream sent: read again while it runs.
  ctx.every(5000, () => search.state === "running" && changed());
}
