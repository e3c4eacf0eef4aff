// Search across logs: the lines of all the tenant's jobs and attempts that hold a substring (or
// match a regular expression), newest first, a page at a time (GET /v1/logs/search); "Follow"
// adds new matching lines at the top as they come (the same route as SSE, whose ids the
// browser sends back itself when it reconnects).
import { api, query, session } from "./api.js";
import { empty, enc, errorBox, fill, h, link, localTime, pager } from "./dom.js";

const SIZE = 100;

export async function logSearchPage(ctx) {
  ctx.title("Log search");
  const q = ctx.q;
  const input = (name, props) => h("input", { name, value: q.get(name) || "", "data-test": `logsearch-${name}`, ...props });
  const pattern = input("pattern", { placeholder: "text to find, e.g. out of memory", "aria-label": "pattern", class: "grow", spellcheck: "false" });
  const label = input("label", { placeholder: "label, e.g. team=vision", "aria-label": "label filter" });
  const since = input("since", { type: "datetime-local", "aria-label": "since" });
  const tenant = session.isAdmin ? input("tenant", { placeholder: "tenant", "aria-label": "tenant" }) : null;
  const box = (name, text) => {
    const el = h("input", { type: "checkbox", name, "data-test": `logsearch-${name}` });
    el.checked = q.get(name) === "true";
    return h("label", null, el, ` ${text}`);
  };
  const regex = box("regex", "regular expression");
  const ignoreCase = box("ignore_case", "ignore case");
  const form = h("form", { class: "filters", "data-test": "logsearch-form" }, pattern, regex, ignoreCase, label, since, tenant, h("button", { type: "submit", "data-test": "logsearch-submit" }, "Search"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const checked = (el) => (el.querySelector("input").checked ? "true" : null);
    ctx.set({
      pattern: pattern.value, regex: checked(regex), ignore_case: checked(ignoreCase), label: label.value.trim() || null,
      since: since.value || null, tenant: tenant?.value.trim() || null, cursor: null, page: null, from: null,
    });
  });
  const live = h("div", { "data-test": "logsearch-live" });
  const body = h("div", { "data-test": "logsearch-results" });
  fill(ctx.root, h("div", { class: "head" }, h("h1", null, "Log search")), form, live, body);
  pattern.focus();
  if (!q.get("pattern")) {
    fill(body, empty("Find a text in the logs of all your jobs and attempts, newest first; `trainyard grep` does the same."));
    return;
  }
  const params = {
    pattern: q.get("pattern"), regex: q.get("regex"), ignore_case: q.get("ignore_case"), tenant: q.get("tenant"),
    label: (q.get("label") || "").split(/[\s,]+/).filter(Boolean),
    since: q.get("since") ? new Date(q.get("since")).toISOString() : null,
  };
  const rows = (lines) => lines.map((x) =>
    h("tr", { "data-test": "logsearch-line" },
      h("td", { class: "mono" }, localTime(x.at)),
      h("td", null, link(`#/jobs/${enc(x.job_id)}`, x.job_id.slice(0, 8), { class: "mono" })),
      h("td", { class: "mono muted" }, `attempt ${x.attempt} · learner ${x.learner} · ${x.stream}`),
      h("td", { class: "mono" }, x.line)));
  const table = (lines, test) => h("div", { class: "table-wrap" }, h("table", { "data-test": test },
    h("thead", null, h("tr", null, ["Time", "Job", "Where", "Line"].map((t) => h("th", null, t)))),
    h("tbody", null, rows(lines))));

  const from = Number(q.get("from") || 1);
  await ctx.guard(body, async () => {
    const page = await api(`/v1/logs/search${query({ ...params, limit: SIZE, cursor: q.get("cursor") })}`);
    fill(body,
      page.lines.length ? table(page.lines, "logsearch-table") : empty("No line matches.", "logsearch-none"),
      pager(ctx, { from, shown: page.lines.length, total: null, next: page.next_cursor, trailKey: `logs?${query(params)}`, test: "logsearch" }));
  }, { test: "logsearch-error" });

  // Following: new matches above the page, newest on top, until the page is left.
  const follow = h("button", { type: "button", "data-test": "logsearch-follow" }, "Follow new lines");
  const fresh = h("tbody");
  let source = null;
  follow.addEventListener("click", () => {
    if (source) return;
    follow.disabled = true;
    follow.textContent = "Following…";
    fill(live, follow, h("div", { class: "table-wrap" }, h("table", { "data-test": "logsearch-followed" },
      h("thead", null, h("tr", null, h("th", { colspan: 4 }, "New lines, newest on top"))), fresh)));
    source = new EventSource(`/v1/logs/search${query({ ...params, follow: "true" })}`);
    source.addEventListener("line", (event) => fresh.prepend(...rows([JSON.parse(event.data)])));
    source.addEventListener("error", (event) => {
      // A message named "error" is the server's reason for ending the stream; without data it
      // is the browser's own notice of a dropped connection, which it retries by itself.
      if (event.data) {
        source.close();
        const why = JSON.parse(event.data);
        live.prepend(errorBox({ status: why.status, message: why.error }, "logsearch-follow-error"));
      }
    });
    ctx.cleanups.push(() => source.close());
  });
  live.append(follow);
}
