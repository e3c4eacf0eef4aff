-- The model repository's statements: the `models` projection and the reads of its read model
-- (the search itself is composed with SQLAlchemy Core, controlplane/models/query/sql.py).
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: insert_model_versions
-- The `models` projection: the versions a batch published, in one statement. `search` is the
-- English tsvector of title, description and tags, in that order: the text the search's
-- reference reads (controlplane/models/query/reference.py).
INSERT INTO model_versions (tenant, name, version, artifact_sha256, size_bytes, title,
                            description, tags, domains, framework, license, metrics, job_id,
                            metadata, metadata_schema, visibility, created, published_by,
                            updated_at, search, name_trigrams)
SELECT v.tenant, v.name, v.version, v.artifact_sha256, v.size_bytes,
       v.metadata ->> 'title',
       v.metadata ->> 'description',
       ARRAY(SELECT jsonb_array_elements_text(v.metadata -> 'tags')),
       ARRAY(SELECT jsonb_array_elements_text(v.metadata -> 'domains')),
       v.metadata ->> 'framework',
       v.metadata ->> 'license',
       v.metadata -> 'metrics',
       (v.metadata -> 'provenance' ->> 'job_id')::uuid,
       v.metadata, v.metadata_schema, v.visibility, v.created, v.published_by, v.created,
       to_tsvector('english',
                   concat_ws(' ', v.metadata ->> 'title', v.metadata ->> 'description',
                             (SELECT string_agg(t, ' ')
                              FROM jsonb_array_elements_text(v.metadata -> 'tags') t))),
       -- As search.sql.trigrams makes them of a query's text.
       ARRAY(SELECT DISTINCT substr(lower(v.name), i, 3)
             FROM generate_series(1, length(v.name) - 2) i)
FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::bigint[], $6::jsonb[],
            $7::integer[], $8::text[], $9::timestamptz[], $10::text[])
     AS v(tenant, name, version, artifact_sha256, size_bytes, metadata, metadata_schema,
          visibility, created, published_by);

-- name: update_model_metadata
-- The `models` projection: a version's mutable metadata changed ($4 to $7, NULL: unchanged)
-- and metrics were added ($8), as the lifecycle's evolve folds them (models/lifecycle.py).
UPDATE model_versions m
SET description = u.description,
    domains = u.domains,
    tags = u.tags,
    metrics = u.metrics,
    metadata = m.metadata || u.changes || jsonb_build_object('metrics', u.metrics),
    updated_at = $9,
    search = to_tsvector('english', concat_ws(' ', m.title, u.description,
                                              array_to_string(u.tags, ' ')))
FROM (
    SELECT tenant, name, version,
           coalesce($4, description) AS description,
           coalesce($5, domains) AS domains,
           coalesce($6, tags) AS tags,
           metrics || $8::jsonb AS metrics,
           jsonb_strip_nulls(jsonb_build_object('description', $4::text,
                                                'domains', to_jsonb($5::text[]),
                                                'tags', to_jsonb($6::text[]),
                                                'citation', $7::jsonb)) AS changes
    FROM model_versions
    WHERE tenant = $1 AND name = $2 AND version = $3
) u
WHERE m.tenant = u.tenant AND m.name = u.name AND m.version = u.version;

-- name: deprecate_model_version
UPDATE model_versions SET deprecated = $4, updated_at = $5
WHERE tenant = $1 AND name = $2 AND version = $3;

-- name: set_model_alias
INSERT INTO model_aliases (tenant, name, alias, version) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant, name, alias) DO UPDATE SET version = excluded.version;

-- name: remove_model_alias
DELETE FROM model_aliases WHERE tenant = $1 AND name = $2 AND alias = $3;

-- name: model_aliases_of
-- A model's aliases, by name: what `models show` lists beside its versions.
SELECT alias, version FROM model_aliases WHERE tenant = $1 AND name = $2 ORDER BY alias;

-- name: model_versions_of
-- A model's versions as the tenant $3 sees them (its own: all; another's: the public ones;
-- NULL: the admin, all), newest first.
SELECT * FROM model_versions
WHERE tenant = $1 AND name = $2 AND ($3::text IS NULL OR tenant = $3 OR visibility = 'public')
ORDER BY version DESC;

-- name: model_versions_of_job
-- The versions published from a job (its provenance), for the job's page.
SELECT * FROM model_versions WHERE job_id = $1 ORDER BY created, tenant, name, version;
