// A job's page: its timeline, attempts, pending reasons, live logs and metrics chart.
import { api, session } from "./api.js";
import { plot } from "./charts.js";
import {
  badge, bytes, card, clockTime, duration, empty, enc, errorBox, fill, h, kv, num, table, when,
} from "./dom.js";
import { labels, TERMINAL } from "./jobs.js";

const EVENT_TYPES = [
  "JobSubmitted", "JobDeploying", "JobDownloading", "JobProcessing", "JobStoring", "JobCompleted",
  "JobFailed", "JobCancelled", "JobRestarted", "LearnersReachedPhase", "LearnersExited",
  "DeploymentRolledBack", "CheckpointRequested", "CheckpointSaved",
];

const PREFIX = "@@trainyard/1 ";

// The launcher's reports to the agent, as people read them (as `trainyard logs` shows them).
export function reportText(text) {
  if (!text.startsWith(PREFIX)) return null;
  let m;
  try {
    m = JSON.parse(text.slice(PREFIX.length));
  } catch {
    return null;
  }
  switch (m && m.kind) {
    case "metric":
      return [`step ${m.step}: ${Object.entries(m.values).map(([k, v]) => `${k} ${num(v)}`).join(", ")}`, m];
    case "checkpoint_saved":
      return [`checkpoint saved at step ${m.step} (${bytes(m.size_bytes)}, ${m.path})`, m];
    case "checkpoint_restored":
      return [`resumed from the checkpoint at step ${m.step}`, m];
    case "phase_started":
      return [`${m.phase} started`, m];
    case "phase_ended":
      return [`${m.phase} ${m.outcome} after ${duration(m.duration_s)}${m.error ? `: ${m.error}` : ""}`, m];
    default:
      return null;
  }
}

const MOST_LINES = 5000; // in the page; the full log is one click away, never silently cut

class LogView {
  constructor(jobId) {
    this.box = h("div", { class: "log", role: "log", "aria-live": "off", "data-test": "log" });
    this.note = h("p", { class: "muted small", "data-test": "log-note" });
    this.count = h("span", { class: "muted", "data-test": "log-count" }, "0 lines");
    this.full = h("a", { href: `/v1/jobs/${enc(jobId)}/logs`, target: "_blank", rel: "noopener" }, "full log as text");
    this.queue = [];
    this.lines = 0;
    this.dropped = 0;
    this.lastAttempt = null;
    this.ranks = false; // a job of several learners: each line names its rank (its learner index)
    this.follow = true;
    this.timer = null;
    this.box.addEventListener("scroll", () => {
      this.follow = this.box.scrollHeight - this.box.scrollTop - this.box.clientHeight < 40;
    });
  }

  push(line, id, report) {
    this.queue.push([line, id, report]);
    // Many lines arrive at once after a (re)connect: draw them together.
    this.timer ??= setTimeout(() => this.flush(), 60);
  }

  // Draws what is queued; also called at once when the log ends, so that "log complete" is
  // never shown above lines still waiting for the timer.
  flush() {
    clearTimeout(this.timer);
    this.timer = null;
    const frag = document.createDocumentFragment();
    for (const [line, id, report] of this.queue) {
      if (line.attempt !== this.lastAttempt) {
        if (this.lastAttempt !== null) frag.append(h("div", { class: "attempt-sep" }, `attempt ${line.attempt}`));
        this.lastAttempt = line.attempt;
      }
      const kind = report ? "rep" : line.stream === "stderr" ? "err" : "out";
      frag.append(
        h(
          "div",
          { class: `l ${kind}`, "data-id": id, "data-kind": kind },
          h("span", { class: "gut", title: `attempt ${line.attempt}, learner ${line.learner}, ${line.stream}` }, this.ranks ? String(line.attempt) : `${line.attempt}·${line.learner}`),
          this.ranks ? h("span", { class: "rk", title: `rank ${line.learner}`, "data-rank": line.learner }, `r${line.learner}`) : null,
          h("time", { class: "t", datetime: line.at }, clockTime(line.at)),
          h("span", { class: "x" }, report ? report[0] : line.line),
        ),
      );
    }
    this.lines += this.queue.length;
    this.queue = [];
    this.box.append(frag);
    while (this.box.childElementCount > MOST_LINES) {
      const first = this.box.firstElementChild;
      if (first.classList.contains("l")) this.dropped += 1;
      first.remove();
    }
    this.count.textContent = `${this.lines.toLocaleString()} line${this.lines === 1 ? "" : "s"}`;
    this.note.textContent = this.dropped ? `The ${this.dropped.toLocaleString()} oldest lines are not kept on this page: read them in the full log.` : "";
    if (this.follow) this.box.scrollTop = this.box.scrollHeight;
  }
}

const HUMAN = {
  JobSubmitted: "submitted", JobDeploying: "deploying", JobDownloading: "downloading", JobProcessing: "processing",
  JobStoring: "storing", JobCompleted: "completed", JobFailed: "failed", JobCancelled: "cancelled", JobRestarted: "restarted",
  LearnersReachedPhase: "learners reached a phase", LearnersExited: "learners exited", DeploymentRolledBack: "deployment rolled back",
  CheckpointRequested: "checkpoint requested", CheckpointSaved: "checkpoint saved",
};

function stateBar(transitions) {
  const now = Date.now();
  const bar = h("div", { class: "statebar", "data-test": "statebar" });
  transitions.forEach((t, i) => {
    const start = Date.parse(t.at);
    const end = i + 1 < transitions.length ? Date.parse(transitions[i + 1].at) : TERMINAL.has(t.state) ? start : now;
    const secs = Math.max(0, (end - start) / 1000);
    const seg = h("span", { class: `seg st-${t.state.toLowerCase()}`, title: `${t.state}, attempt ${t.attempt}: ${duration(secs)} from ${clockTime(t.at)}` }, t.state.toLowerCase());
    // Widths from durations, with a floor so that a 20 ms DOWNLOADING still shows.
    seg.style.flexGrow = String(Math.max(secs, 0.0001));
    seg.style.minWidth = TERMINAL.has(t.state) ? "5.5em" : "0.6em";
    bar.append(seg);
  });
  return bar;
}

// The current attempt's ranks (each learner as torch.distributed numbers it): node, GPUs, state.
function rankTable(job) {
  const spread = job.ranks.some((r) => r.node == null) && job.nodes.length > 1;
  return [
    table(
      [
        ["Rank", (r) => String(r.rank)],
        ["Node", (r) => r.node ?? "—"],
        ["GPUs", (r) => (r.gpus.length ? h("span", { class: "mono small" }, r.gpus.join(" ")) : "—")],
        ["State", (r) => badge(r.state)],
        ["Exit", (r) => (r.exit_code == null ? "—" : String(r.exit_code))],
      ],
      job.ranks,
      { test: "ranks", rowProps: (r) => ({ "data-rank": r.rank }) },
    ),
    spread ? h("p", { class: "muted small" }, `The attempt runs on ${job.nodes.join(", ")}; which node each rank runs on is not recorded.`) : null,
  ];
}

// Each attempt: when it started, how it ended and why. A restart's reason says why the attempt
// before it ended (its event already carries the new attempt's number).
function attempts(history) {
  const rows = new Map();
  for (const e of history) {
    const before = rows.get(e.attempt - 1);
    if (e.event === "JobRestarted" && before) Object.assign(before, { to: e.at, restarted: true, reason: e.reason });
    if (!rows.has(e.attempt)) rows.set(e.attempt, { attempt: e.attempt, from: e.at, restarted: false, reason: null });
    const a = rows.get(e.attempt);
    Object.assign(a, { to: e.at, state: e.state });
    if (e.reason && e.event !== "JobRestarted" && e.event !== "CheckpointRequested") a.reason = e.reason;
  }
  return [...rows.values()];
}

export async function jobPage(ctx, id) {
  ctx.title("Job");
  const headline = h("div", { class: "head" });
  const notice = h("div", { class: "notice", "data-test": "action-result", "aria-live": "polite" });
  const summary = h("div");
  const ranksBox = h("div", { "data-test": "ranks-card" });
  const pendingBox = h("div", { "data-test": "pending" });
  const timeline = h("div", { "data-test": "timeline" });
  const attemptsBox = h("div", { "data-test": "attempts" });
  const chartBox = h("div", { class: "chartbox", "data-test": "metrics" });
  const metricPick = h("select", { "data-test": "metric-name", "aria-label": "metric" });
  const logScale = h("input", { type: "checkbox", "data-test": "metric-log" });
  const streamState = h("span", { class: "pill", "data-test": "log-status" }, "connecting");
  const logs = new LogView(id);
  const showReports = h("input", { type: "checkbox", checked: true, "data-test": "log-reports" });
  const followBox = h("input", { type: "checkbox", checked: true, "data-test": "log-follow" });
  showReports.addEventListener("change", () => logs.box.classList.toggle("hide-rep", !showReports.checked));
  followBox.addEventListener("change", () => {
    logs.follow = followBox.checked;
    if (logs.follow) logs.box.scrollTop = logs.box.scrollHeight;
  });
  fill(
    ctx.root,
    headline,
    notice,
    pendingBox,
    h("div", { class: "grid2" }, card("Summary", summary), card("Attempts", attemptsBox)),
    ranksBox,
    card("Timeline", timeline),
    card(
      "Metrics",
      h("div", { class: "toolbar" }, h("label", null, "metric ", metricPick), h("label", null, logScale, " log scale")),
      chartBox,
    ),
    card(
      "Logs",
      h(
        "div",
        { class: "toolbar" },
        streamState, logs.count,
        h("label", null, showReports, " launcher reports"),
        h("label", null, followBox, " follow"),
        h("span", { class: "grow" }), logs.full,
      ),
      logs.note,
      logs.box,
    ),
  );

  let job = null;
  let points = [];

  const drawChart = () => {
    const names = [...new Set(points.flatMap((p) => Object.keys(p.values)))];
    const chosen = names.includes(metricPick.value) ? metricPick.value : names.find((n) => /loss/i.test(n)) || names[0];
    if (metricPick.options.length !== names.length) {
      fill(metricPick, names.map((n) => h("option", { value: n }, n)));
    }
    if (chosen) metricPick.value = chosen;
    const groups = new Map();
    for (const p of points) {
      if (!(chosen in p.values)) continue;
      const key = `attempt ${p.attempt} · learner ${p.learner}`;
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push([p.step, p.values[chosen]]);
    }
    const series = [...groups].map(([name, pts], i) => ({ name, points: pts, color: i }));
    if (!names.length) {
      fill(chartBox, empty(job && TERMINAL.has(job.state) ? "This job reported no metrics." : "No metrics reported yet: learners report them with `runners.metrics.log(step=..., loss=...)`.", "metrics-empty"));
      return;
    }
    plot(chartBox, series, { xLabel: "step", yLabel: chosen, logY: logScale.checked, test: "metrics-chart" });
  };
  metricPick.addEventListener("change", drawChart);
  logScale.addEventListener("change", drawChart);

  const loadMetrics = async () => {
    points = (await api(`/v1/jobs/${enc(id)}/metrics`)).metrics;
    drawChart();
  };
  const metricsSoon = ctx.throttle(() => ctx.guard(chartBox, loadMetrics, { keep: true }), 1500);

  // The buttons outlive the redraws live updates make, so that an armed cancel stays armed.
  const title = h("div");
  const cancel = h("button", { type: "button", class: "danger", "data-test": "cancel", hidden: true }, "Cancel job");
  const checkpoint = h("button", { type: "button", "data-test": "checkpoint", hidden: true }, "Checkpoint now");
  let armed = null;
  const disarm = () => {
    clearTimeout(armed);
    armed = null;
    cancel.textContent = "Cancel job";
    cancel.classList.remove("armed");
  };
  cancel.addEventListener("click", async () => {
    // Two clicks: a stray tap on a phone must not end a week of training.
    if (!armed) {
      cancel.textContent = "Click again to cancel";
      cancel.classList.add("armed");
      armed = setTimeout(disarm, 5000);
      return;
    }
    disarm();
    cancel.disabled = true;
    await act("cancel", { reason: "cancelled from the dashboard" }, "Cancellation recorded.");
  });
  checkpoint.addEventListener("click", async () => {
    checkpoint.disabled = true;
    await act("checkpoint", undefined, "Checkpoint requested: the learners save one at their next step.");
  });
  fill(headline, title, h("div", { class: "actions" }, checkpoint, cancel));

  const renderHead = () => {
    ctx.title(job.manifest.name);
    const terminal = TERMINAL.has(job.state);
    cancel.hidden = terminal;
    cancel.disabled = false;
    checkpoint.hidden = terminal;
    const requested = Boolean(job.checkpoint_requested_at);
    checkpoint.disabled = job.state !== "PROCESSING" || requested;
    checkpoint.textContent = requested ? "Checkpoint requested…" : "Checkpoint now";
    checkpoint.title = job.state === "PROCESSING" ? "ask the learners to save a checkpoint now" : "only a PROCESSING job can checkpoint";
    fill(
      title,
      h("h1", { "data-test": "job-name" }, job.manifest.name, " ", badge(job.state)),
      h("div", { class: "mono muted small", "data-test": "job-id" }, job.id),
    );
  };

  const act = async (what, body, done) => {
    try {
      await api(`/v1/jobs/${enc(id)}/${what}`, { method: "POST", body });
      fill(notice, h("div", { class: "ok" }, done));
    } catch (err) {
      fill(notice, errorBox(err, "action-error"));
    }
    await refresh();
  };

  const renderSummary = (history) => {
    const m = job.manifest;
    fill(
      summary,
      kv([
        ["State", badge(job.state)],
        session.isAdmin ? ["Tenant", job.tenant] : null,
        ["Attempt", `${job.attempt}${job.restarts ? ` (${job.restarts} restart${job.restarts > 1 ? "s" : ""})` : ""}`],
        job.rollbacks ? ["Rollbacks", String(job.rollbacks)] : null,
        ["Image", h("span", { class: "mono" }, m.image)],
        ["Command", h("code", { class: "cmd" }, m.command.join(" "))],
        ["Resources", `${m.learners} learner(s) × ${m.gpus_per_learner} GPU, ${m.cpus} CPU, ${m.memory_mb} MiB`],
        ["Nodes", job.nodes.join(", ")],
        ["GPUs", job.gpus.length ? h("span", { class: "mono small" }, job.gpus.join(" ")) : null],
        ["Labels", Object.keys(m.labels).length ? labels(m.labels) : null],
        ["Submitted", when(job.submitted_at)],
        ["Last change", when(job.updated_at)],
        ["Last checkpoint", job.last_checkpoint ? [`step ${job.last_checkpoint.step} of attempt ${job.last_checkpoint.attempt}, ${bytes(job.last_checkpoint.size_bytes)}, `, when(job.last_checkpoint.at)] : null],
        job.not_before && job.state === "QUEUED" ? ["Backoff until", when(job.not_before)] : null,
        job.exit_codes.length ? ["Exit codes", job.exit_codes.join(", ")] : null,
        job.failure_reason ? ["Failure", h("span", { class: "bad", "data-test": "failure" }, job.failure_reason)] : null,
        job.unschedulable_reason ? ["Unschedulable", h("span", { class: "bad" }, job.unschedulable_reason)] : null,
      ]),
    );
    // One learner is the job itself; several train together, each a rank.
    fill(ranksBox, job.ranks && job.ranks.length > 1 ? card("Ranks", rankTable(job)) : null);
    fill(
      timeline,
      stateBar(job.transitions),
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { "data-test": "history" },
          h("thead", null, h("tr", null, ["Time", "Event", "State", "Attempt", "By", "Reason"].map((t) => h("th", null, t)))),
          h(
            "tbody",
            null,
            history.map((e) =>
              h(
                "tr",
                { class: e.event === "JobRestarted" || e.event === "DeploymentRolledBack" ? "warn-row" : null, "data-event": e.event },
                h("td", null, when(e.at)),
                h("td", null, HUMAN[e.event] || e.event),
                h("td", null, badge(e.state)),
                h("td", null, String(e.attempt)),
                h("td", { class: "muted" }, e.actor),
                h("td", { class: "reason" }, e.reason || ""),
              ),
            ),
          ),
        ),
      ),
    );
    const rows = attempts(history);
    fill(
      attemptsBox,
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          null,
          h("thead", null, h("tr", null, ["#", "Started", "Ran", "Ended as", "Why"].map((t) => h("th", null, t)))),
          h(
            "tbody",
            null,
            rows.map((a) => {
              const end = TERMINAL.has(a.state) || a.restarted ? Date.parse(a.to) : Date.now();
              return h(
                "tr",
                null,
                h("td", null, String(a.attempt)),
                h("td", null, when(a.from, { short: true })),
                h("td", null, duration((end - Date.parse(a.from)) / 1000)),
                h("td", null, a.restarted ? h("span", { class: "warn" }, "restarted") : badge(a.state)),
                h("td", { class: "reason" }, a.reason || ""),
              );
            }),
          ),
        ),
      ),
    );
  };

  const loadPending = async () => {
    if (!job || job.state !== "QUEUED") {
      fill(pendingBox);
      return;
    }
    const p = await api(`/v1/jobs/${enc(id)}/pending`);
    fill(
      pendingBox,
      card(
        "Why is it pending?",
        kv([
          ["Position", p.position == null ? "—" : `${p.position} in the queue`],
          ["Estimated start", p.estimated_start ? when(p.estimated_start) : "not known"],
        ]),
        p.reasons.length
          ? h(
              "ul",
              { class: "reasons", "data-test": "pending-reasons" },
              p.reasons.map((r) =>
                h(
                  "li",
                  { "data-reason": r.reason },
                  h("span", { class: `badge ${r.blocking === "never" ? "st-failed" : "st-queued"}` }, r.blocking),
                  " ", h("strong", null, r.reason), ": ", r.detail, " ",
                  h("span", { class: "muted" }, "since ", when(r.since)),
                ),
              ),
            )
          : empty("No reason recorded yet: the scheduler judges the queue twice a second."),
      ),
    );
  };

  let seen = 0; // the newest event's position the page has drawn
  const refresh = async () => {
    const [fresh, history] = await Promise.all([api(`/v1/jobs/${enc(id)}`), api(`/v1/jobs/${enc(id)}/history`)]);
    job = fresh;
    seen = Math.max(seen, ...history.history.map((e) => e.position));
    renderHead();
    renderSummary(history.history);
    await loadPending();
    if (TERMINAL.has(job.state) && events) events.close("ended");
  };

  let events = null;
  const ok = await ctx.guard(summary, refresh, { fatal: ctx.root, test: "job-error" });
  if (!ok) return;
  ctx.guard(chartBox, loadMetrics);

  const refreshSoon = ctx.throttle(() => ctx.guard(notice, refresh, { keep: true }), 300);
  if (!TERMINAL.has(job.state)) {
    const handlers = Object.fromEntries(
      EVENT_TYPES.map((t) => [
        t,
        (event) => {
          // The server ends the stream after a terminal state: closed here, or the browser
          // would reconnect to it every few seconds.
          if (TERMINAL.has(event.state)) events.close("ended");
          refreshSoon();
        },
      ]),
    );
    // From the last event drawn: the past is in the history already.
    events = ctx.stream(`/v1/jobs/${enc(id)}/events`, { ordered: handlers, after: seen });
    ctx.every(3000, () => job.state === "QUEUED" && ctx.guard(pendingBox, loadPending, { keep: true }));
  }

  logs.ranks = job.manifest.learners > 1;
  logs.box.classList.toggle("ranked", logs.ranks);
  const logStream = ctx.stream(`/v1/jobs/${enc(id)}/logs?follow=true&protocol=true`, {
    ordered: {
      line: (line, lineId) => {
        const report = line.stream === "stdout" ? reportText(line.line) : null;
        logs.push(line, lineId, report);
        if (report && report[1].kind === "metric") metricsSoon();
      },
    },
    control: {
      end: () => {
        logs.flush();
        logStream.close("complete");
        metricsSoon();
      },
    },
    status: (st) => {
      streamState.textContent = st === "complete" ? "log complete" : st;
      streamState.dataset.state = st;
    },
  });
  // For the browser tests: drop the log stream and resume it from the last line shown.
  ctx.hook("reconnectLogs", () => logStream.reopen());
  ctx.hook("logLines", () => logs.lines);
}
