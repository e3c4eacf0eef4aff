// The model repository: search (the API's query language), a model's versions, aliases and
// where each came from (the job that trained it).
import { api, query, session } from "./api.js";
import { bytes, card, empty, enc, fill, h, jobLink, kv, link, num, pager, table, when } from "./dom.js";

const PAGE = 25;

const modelHash = (v) => `#/models/${enc(v.tenant)}/${enc(v.name)}`;

function metricChips(metrics) {
  return Object.entries(metrics || {}).map(([k, v]) => h("span", { class: "chip" }, `${k} ${num(v)}`));
}

function quoted(value) {
  return /[\s"()]/.test(value) ? `"${value.replace(/"/g, "")}"` : value;
}

export async function modelsList(ctx) {
  ctx.title("Models");
  const q = ctx.q.get("q") || "";
  const input = h("input", {
    type: "search", name: "q", value: q, placeholder: 'e.g. resnet framework:pytorch metrics.accuracy>=0.9',
    "data-test": "models-q", "aria-label": "search models", class: "wide",
  });
  const form = h("form", { class: "filters" }, input, h("button", { type: "submit" }, "Search"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    ctx.set({ q: input.value.trim() || null, cursor: null, page: null, from: null });
  });
  const facets = h("div", { class: "facets", "data-test": "facets" });
  const body = h("div", { "data-test": "models" });
  fill(
    ctx.root,
    h("div", { class: "head" }, h("h1", null, "Models")),
    form,
    h("p", { class: "muted small" }, "Words search titles, descriptions and tags; name~, name:, framework:, domain:, tenant:, license:, tag:, metrics.NAME>=X, version>=N, created<DATE; OR, NOT, -term and parentheses combine them."),
    facets,
    body,
  );
  const from = Number(ctx.q.get("from") || 1);
  await ctx.guard(body, async () => {
    const page = await api(`/v1/models${query({ q, limit: PAGE, cursor: ctx.q.get("cursor") })}`);
    fill(
      facets,
      Object.entries(page.facets || {}).map(([facet, counts]) =>
        Object.keys(counts).length
          ? h(
              "div",
              { class: "facet" },
              h("span", { class: "muted" }, `${facet}: `),
              Object.entries(counts).map(([value, count]) =>
                link(`#/models?q=${enc(`${q} ${facet}:${quoted(value)}`.trim())}`, `${value} (${count})`, { class: "chip" }),
              ),
            )
          : null,
      ),
    );
    fill(
      body,
      page.versions.length
        ? table(
            [
              ["Model", (v) => [link(modelHash(v), `${v.tenant}/${v.name}`, { class: "strong" }), h("span", { class: "muted" }, `:${v.version}`)]],
              ["Title", (v) => v.metadata.title],
              ["Framework", (v) => v.metadata.framework],
              ["Metrics", (v) => metricChips(v.metadata.metrics)],
              ["Visibility", (v) => v.visibility],
              ["Published", (v) => when(v.created, { short: true })],
            ],
            page.versions,
            { test: "models-table", rowProps: (v) => ({ "data-model": v.reference }) },
          )
        : empty(q ? "No model version matches this query." : "No models yet: publish one with `trainyard models publish`."),
      pager(ctx, { from, shown: page.versions.length, total: page.total, next: page.next_cursor, test: "models", trailKey: `models|${q}` }),
    );
  });
}

export async function modelPage(ctx, tenant, name) {
  ctx.title(name);
  const body = h("div", { "data-test": "model" });
  fill(ctx.root, h("div", { class: "head" }, h("h1", null, `${tenant}/${name}`)), body);
  await ctx.guard(body, async () => {
    const model = await api(`/v1/models/${enc(name)}${query({ tenant })}`);
    const latest = model.versions.find((v) => v.version === model.latest) || model.versions[0];
    const m = latest.metadata;
    const aliases = Object.entries(model.aliases || {});
    const artifact = (v) => `/v1/models/${enc(name)}/versions/${v.version}/artifact${query({ tenant })}`;
    fill(
      body,
      card(
        m.title,
        h("p", { class: "prewrap" }, m.description),
        kv([
          ["Latest", model.latest == null ? "none (all deprecated)" : `version ${model.latest}`],
          ["Aliases", aliases.length ? aliases.map(([a, v]) => h("span", { class: "chip" }, `${a} → ${v}`)) : null],
          ["Framework", m.framework],
          ["License", m.license],
          ["Domains", (m.domains || []).join(", ")],
          ["Tags", (m.tags || []).map((t) => h("span", { class: "chip" }, t))],
          ["Creators", (m.creators || []).map((c) => c.name).join(", ")],
          ["Citation", m.citation ? [m.citation.text || "", m.citation.doi ? ` doi:${m.citation.doi}` : ""] : null],
          ["Entry point", m.servable ? h("code", null, m.servable.entry_point) : null],
        ]),
      ),
      card(
        "Versions",
        table(
          [
            ["Version", (v) => h("strong", null, String(v.version))],
            ["Published", (v) => [when(v.created), h("div", { class: "muted small" }, v.published_by)]],
            ["Metrics", (v) => metricChips(v.metadata.metrics)],
            ["Trained by", (v) => provenance(v.metadata.provenance)],
            ["Visibility", (v) => v.visibility],
            ["Status", (v) => (v.deprecated ? h("span", { class: "warn" }, `deprecated: ${v.deprecated.reason || ""}`) : "current")],
            ["Artifact", (v) => [h("a", { href: artifact(v), download: `${name}-v${v.version}` }, bytes(v.size_bytes)), " ", h("span", { class: "mono muted small", title: v.artifact_sha256 }, v.artifact_sha256.slice(0, 12))]],
          ],
          model.versions,
          { test: "versions", rowProps: (v) => ({ "data-version": v.version }) },
        ),
      ),
      session.isAdmin || tenant === session.tenant
        ? null
        : h("p", { class: "muted small" }, `A public model of tenant ${tenant}: its training jobs are theirs, not shown to you.`),
    );
  });
}

function provenance(p) {
  if (!p || !p.job_id) return h("span", { class: "muted" }, "not recorded");
  return h(
    "span",
    { "data-test": "provenance" },
    "job ", jobLink(p.job_id),
    p.attempt != null ? `, attempt ${p.attempt}` : "",
    p.checkpoint_step != null ? `, checkpoint at step ${p.checkpoint_step}` : "",
  );
}

