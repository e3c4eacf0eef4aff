// Deployments: their replicas and live query statistics, polled.
import { api, query, session } from "./api.js";
import { plot } from "./charts.js";
import { badge, card, empty, enc, fill, h, jobLink, kv, link, ms, num, table, when } from "./dom.js";

// The admin acts for one tenant at a time here (the API lists one tenant's deployments).
async function tenantPicker(ctx) {
  if (!session.isAdmin) return { tenant: null, picker: null };
  const { tenants } = await api("/v1/tenants");
  const tenant = ctx.q.get("tenant") || (tenants[0] && tenants[0].name) || "";
  const select = h(
    "select",
    { "data-test": "tenant-pick", "aria-label": "tenant" },
    tenants.map((t) => h("option", { value: t.name }, t.name)),
  );
  select.value = tenant;
  select.addEventListener("change", () => ctx.set({ tenant: select.value }));
  return { tenant, picker: h("label", { class: "filters" }, "tenant ", select) };
}

export async function deploymentsList(ctx) {
  ctx.title("Deployments");
  const body = h("div", { "data-test": "deployments" });
  const bar = h("div");
  fill(ctx.root, h("div", { class: "head" }, h("h1", null, "Deployments")), bar, body);
  let tenant = null;
  const ok = await ctx.guard(body, async () => {
    const picked = await tenantPicker(ctx);
    tenant = picked.tenant;
    fill(bar, picked.picker);
  });
  if (!ok) return;
  if (session.isAdmin && !tenant) {
    fill(body, empty("No tenants yet."));
    return;
  }
  const load = async () => {
    const { items } = await api(`/v1/deployments${query({ tenant })}`);
    fill(
      body,
      items.length
        ? table(
            [
              ["Name", (d) => link(`#/deployments/${enc(d.name)}${query({ tenant })}`, d.name, { class: "strong" })],
              ["Model", (d) => modelLink(d.model)],
              ["State", (d) => badge(d.state)],
              ["Replicas", (d) => `${d.replica_jobs} running of ${d.replicas}`],
              ["Created", (d) => when(d.created_at, { short: true })],
            ],
            items,
            { test: "deployments-table" },
          )
        : empty("No deployments: serve a model with `trainyard deploy NAME --model REF`."),
    );
  };
  await ctx.guard(body, load);
  ctx.every(5000, () => ctx.guard(body, load, { keep: true }));
}

const WINDOW_S = 300;

// "acme/resnet:3" (the version a deployment resolved) as a link to the model's page.
function modelLink(ref) {
  const match = /^([^/]+)\/([^:]+):\d+$/.exec(ref || "");
  return match ? link(`#/models/${enc(match[1])}/${enc(match[2])}`, ref) : ref;
}

export async function deploymentPage(ctx, name) {
  ctx.title(name);
  const tenant = ctx.q.get("tenant");
  const suffix = query({ tenant });
  const head = h("div", { class: "head" }, h("h1", null, name));
  const info = h("div");
  const stats = h("div", { "data-test": "deployment-stats" });
  const rateBox = h("div", { class: "chartbox", "data-test": "rate" });
  fill(ctx.root, head, info, card("Live statistics", stats, h("h3", null, "Requests per second (while this page is open)"), rateBox));
  const samples = []; // [seconds since the page opened, requests]
  const opened = Date.now();

  const loadInfo = async () => {
    const d = await api(`/v1/deployments/${enc(name)}${suffix}`);
    fill(head, h("h1", null, name, " ", badge(d.state)));
    fill(
      info,
      h(
        "div",
        { class: "grid2" },
        card(
          "Serving",
          kv([
            ["Model", modelLink(d.model)],
            ["Entry point", h("code", null, d.entry_point)],
            ["Replicas", `${d.replicas} wanted, ${d.replica_jobs.length} running`],
            ["Resources", `${d.resources.gpus} GPU, ${d.resources.cpus} CPU, ${d.resources.memory_mb} MiB, ${d.resources.image}`],
            ["Batching", `up to ${d.serving.max_batch_size} items, waits ${d.serving.max_wait_ms} ms`],
            ["Memo", d.serving.memo ? `on, ${num(d.serving.memo_max_entries)} entries` : "off"],
            ["Task timeout", `${d.serving.task_timeout_s} s`],
            d.failures ? ["Failures in a row", h("span", { class: "bad" }, String(d.failures))] : null,
            d.next_replica_at ? ["Next replica", when(d.next_replica_at)] : null,
            ["Created", when(d.created_at)],
          ]),
        ),
        card(
          "Replica jobs",
          d.replica_jobs.length
            ? table(
                [
                  ["Job", (r) => jobLink(r.job_id)],
                  ["State", (r) => badge(r.state)],
                  ["Attempt", (r) => String(r.attempt)],
                ],
                d.replica_jobs,
              )
            : empty("No replica is running."),
        ),
      ),
    );
  };

  const stat = (label, value, test) => h("div", { class: "stat", "data-test": test }, h("div", { class: "v" }, value), h("div", { class: "k" }, label));
  const loadStats = async () => {
    const f = await api(`/v1/deployments/${enc(name)}/metrics${suffix}`);
    const lookups = f.memo.hits + f.memo.misses;
    fill(
      stats,
      h(
        "div",
        { class: "stats" },
        stat("requests", num(f.requests), "stat-requests"),
        stat("succeeded", num(f.succeeded)),
        stat("failed", num(f.failed)),
        stat("queue depth", num(f.queue_depth)),
        stat("running", num(f.running)),
        stat("memo hits", lookups ? `${Math.round((100 * f.memo.hits) / lookups)} %` : "—"),
        stat("latency p50", ms(f.latency_ms.p50)),
        stat("latency p99", ms(f.latency_ms.p99)),
      ),
      kv([
        ["Memo", `${num(f.memo.hits)} hits, ${num(f.memo.misses)} misses, ${num(f.memo.entries)} entries`],
        ["Batches", `${num(f.batches.count)} of ${num(f.batches.items)} items: mean ${num(f.batches.mean_size, 3)}, largest ${num(f.batches.max_size)}; ${num(f.batches.full)} left full, ${num(f.batches.timeout)} at max wait`],
        ["Invocation", `p50 ${ms(f.batches.invocation_ms.p50)}, p99 ${ms(f.batches.invocation_ms.p99)}`],
        ["Inference", `p50 ${ms(f.batches.inference_ms.p50)}, p99 ${ms(f.batches.inference_ms.p99)}`],
      ]),
      h("p", { class: "muted small" }, "Over the tasks kept (24 hours), computed from the recorded tasks."),
    );
    const t = (Date.now() - opened) / 1000;
    samples.push([t, f.requests]);
    while (samples.length && samples[0][0] < t - WINDOW_S) samples.shift();
    const rates = [];
    for (let i = 1; i < samples.length; i++) {
      const [t0, r0] = samples[i - 1];
      const [t1, r1] = samples[i];
      rates.push([Math.round(t1), Math.max(0, (r1 - r0) / (t1 - t0))]);
    }
    if (rates.length) plot(rateBox, [{ name: "requests/s", points: rates }], { xLabel: "seconds on this page", yLabel: "requests/s", test: "rate-chart" });
    else fill(rateBox, h("p", { class: "muted" }, "measuring…"));
  };
  const ok = await ctx.guard(info, loadInfo, { fatal: ctx.root, test: "deployment-error" });
  if (!ok) return;
  await ctx.guard(stats, loadStats);
  ctx.every(2000, () => ctx.guard(stats, loadStats, { keep: true }));
  ctx.every(5000, () => ctx.guard(info, loadInfo, { keep: true }));
}
