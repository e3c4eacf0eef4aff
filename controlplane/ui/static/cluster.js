// Nodes and their GPUs (which job holds each, for the admin), and the tenants with their
// quotas and limits (the admin's).
import { api, query, session } from "./api.js";
import { badge, bytes, empty, fill, h, jobLink, kv, num, prose, table, when } from "./dom.js";

function meter(used, total, label) {
  const share = total ? Math.min(used / total, 1) : 0;
  const bar = h("span", { class: "fill" });
  bar.style.width = `${(share * 100).toFixed(1)}%`;
  return h("span", { class: `meter${share >= 0.9 ? " hot" : ""}`, title: label }, h("span", { class: "small" }, label), h("span", { class: "track" }, bar));
}

function gpuTile(gpu) {
  const status = !gpu.healthy ? "unhealthy" : gpu.allocated ? "allocated" : "free";
  return h(
    "div",
    { class: `gpu ${status}`, "data-test": "gpu", "data-status": status },
    h("div", null, h("strong", null, `GPU ${gpu.index}`), " ", h("span", { class: "muted small" }, gpu.model)),
    h("div", { class: "small muted" }, bytes(gpu.memory_mb * 1024 * 1024)),
    h(
      "div",
      { class: "small" },
      !gpu.healthy
        ? h("span", { class: "bad" }, `unhealthy${gpu.health_reason ? `: ${gpu.health_reason}` : ""}`)
        : gpu.job_id
          ? [jobLink(gpu.job_id), h("div", { class: "muted" }, `attempt ${gpu.attempt}, learner ${gpu.learner}`)]
          : status,
    ),
  );
}

export async function nodesPage(ctx) {
  ctx.title("Nodes");
  const summary = h("p", { class: "muted", "data-test": "nodes-summary" });
  const body = h("div", { "data-test": "nodes" });
  fill(ctx.root, h("div", { class: "head" }, h("h1", null, "Nodes and GPUs")), summary, body);
  const load = async () => {
    const { nodes } = await api("/v1/nodes");
    const gpus = nodes.flatMap((n) => n.gpus);
    const unhealthy = gpus.filter((g) => !g.healthy).length;
    const allocated = gpus.filter((g) => g.allocated).length;
    summary.textContent = `${nodes.length} node(s), ${gpus.length} GPU(s): ${allocated} allocated, ${gpus.length - allocated - unhealthy} free, ${unhealthy} unhealthy.`;
    if (!nodes.length) {
      fill(body, empty("No node has registered yet: start one with `trainyard agent` (or `trainyard up`)."));
      return;
    }
    fill(
      body,
      nodes.map((n) =>
        h(
          "section",
          { class: "card node", "data-node": n.name },
          h("h2", null, n.name, " ", badge(n.state), " ", h("span", { class: "muted small" }, `${n.runtime} runtime`)),
          h(
            "div",
            { class: "grid2" },
            kv([
              ["Heartbeat", when(n.heartbeat_at)],
              ["Lease until", when(n.lease_until)],
              ["Registered", when(n.registered_at)],
            ]),
            h(
              "div",
              { class: "meters" },
              meter(n.cpus_allocated, n.cpus, `CPUs ${num(n.cpus_allocated, 3)} of ${num(n.cpus, 3)}`),
              meter(n.memory_mb_allocated, n.memory_mb, `memory ${bytes(n.memory_mb_allocated * 2 ** 20)} of ${bytes(n.memory_mb * 2 ** 20)}`),
              meter(n.gpus_allocated, n.gpus.length, `GPUs ${n.gpus_allocated} of ${n.gpus.length} allocated`),
            ),
          ),
          n.gpus.length ? h("div", { class: "gpus" }, n.gpus.map(gpuTile)) : h("p", { class: "muted" }, "No GPUs: CPU work only."),
          session.isAdmin ? null : h("p", { class: "muted small" }, "Which job holds each GPU is shown to the admin only."),
        ),
      ),
    );
  };
  await ctx.guard(body, load);
  ctx.every(5000, () => ctx.guard(body, load, { keep: true }));
}

const ACTIVE = ["DEPLOYING", "DOWNLOADING", "PROCESSING", "STORING"];

// GPUs each tenant holds now, from its running jobs (the API has no per-tenant usage figure).
async function held() {
  const gpus = new Map();
  let cursor = null;
  for (let pages = 0; pages < 20; pages++) {
    const page = await api(`/v1/jobs${query({ state: ACTIVE, limit: 500, cursor })}`);
    for (const j of page.jobs) gpus.set(j.tenant, (gpus.get(j.tenant) || 0) + j.gpus.length);
    cursor = page.next_cursor;
    if (!cursor) return { gpus, complete: true };
  }
  return { gpus, complete: false };
}

export async function tenantsPage(ctx) {
  ctx.title("Tenants");
  const body = h("div", { "data-test": "tenants" });
  fill(ctx.root, h("div", { class: "head" }, h("h1", null, "Tenants and quotas")), body);
  const load = async () => {
    const [{ tenants }, usage] = await Promise.all([api("/v1/tenants"), held()]);
    if (!tenants.length) {
      fill(body, empty("No tenants yet: create one with `trainyard tenants create NAME`."));
      return;
    }
    const holds = (t) => {
      const n = usage.gpus.get(t.name) || 0;
      const text = `${n}${usage.complete ? "" : "+"}`;
      if (t.gpu_quota == null) return `${text} (no quota)`;
      const cls = n >= t.gpu_quota ? "warn" : null;
      return h("span", { class: cls }, `${text} of ${t.gpu_quota}`);
    };
    const l = (t) => t.limits || {};
    fill(
      body,
      table(
        [
          ["Tenant", (t) => h("strong", null, t.name)],
          ["Weight", (t) => num(t.weight)],
          ["GPUs held / quota", holds],
          ["Live tokens", (t) => String(t.active_tokens.length)],
          ["Streams", (t) => num(l(t).streams)],
          ["Submissions", (t) => `${num(l(t).submissions_per_s)}/s, burst ${num(l(t).submission_burst)}`],
          ["Queued jobs", (t) => num(l(t).queued_jobs)],
          ["Log lines / bytes", (t) => `${num(l(t).log_lines)} / ${bytes(l(t).log_bytes)}`],
          ["Reports", (t) => `${num(l(t).reports_per_s)}/s`],
          ["Created", (t) => when(t.created_at, { short: true })],
        ],
        tenants,
        { test: "tenants-table", rowProps: (t) => ({ "data-tenant": t.name }) },
      ),
      h("p", { class: "muted small" }, prose("Change them with `trainyard tenants set` and `trainyard tenants limits` (see docs/user-guide.md, Limits).")),
    );
  };
  await ctx.guard(body, load);
  ctx.every(10000, () => ctx.guard(body, load, { keep: true }));
}

