-- The model repository's read models (controlplane/models/projection.py): one row per model
-- version, searched by `trainyard models search` and GET /v1/models (controlplane/search), and
-- each model's aliases. Both are rebuilt from the model streams' events, which stay the truth.

CREATE TABLE model_versions (
    tenant           text NOT NULL,
    name             text NOT NULL,
    version          integer NOT NULL,
    artifact_sha256  text NOT NULL,
    size_bytes       bigint NOT NULL,
    -- Copied out of `metadata`, typed, for the search's terms and facets.
    title            text NOT NULL,
    description      text NOT NULL,
    tags             text[] NOT NULL,
    domains          text[] NOT NULL,
    framework        text NOT NULL,
    license          text NOT NULL,
    metrics          jsonb NOT NULL,
    job_id           uuid,
    metadata         jsonb NOT NULL,
    metadata_schema  integer NOT NULL,
    visibility       text NOT NULL,
    deprecated       text,
    created          timestamptz NOT NULL,
    published_by     text NOT NULL,
    updated_at       timestamptz NOT NULL,
    -- The English tsvector of title, description and tags, in that order (what the search's
    -- reference reads as a version's text). Written by the projection, not generated: a
    -- generated column may only use immutable functions, and array_to_string is not one.
    search           tsvector NOT NULL,
    -- The name's trigrams (every 3 characters in a row, lower-cased): a GIN index over them
    -- finds `name~text` (ILIKE '%text%', which no b-tree serves) among millions of names, as
    -- pg_trgm would; pg_trgm itself is a contrib extension that not every Postgres (the
    -- embedded one among them) ships.
    name_trigrams    text[] NOT NULL,
    PRIMARY KEY (tenant, name, version)
);
CREATE INDEX model_versions_search ON model_versions USING gin (search);
CREATE INDEX model_versions_name_trigrams ON model_versions USING gin (name_trigrams);
CREATE INDEX model_versions_tags ON model_versions USING gin (tags);
CREATE INDEX model_versions_domains ON model_versions USING gin (domains);
-- The facets matched exactly (tenant leads the primary key).
CREATE INDEX model_versions_framework ON model_versions (framework);
CREATE INDEX model_versions_license ON model_versions (license);
-- The search's order (newest first) and its cursor, and the public versions every tenant sees.
CREATE INDEX model_versions_order ON model_versions (created DESC, tenant DESC, name DESC, version DESC);
CREATE INDEX model_versions_public ON model_versions (created DESC) WHERE visibility = 'public';
-- Which versions share a blob, and which came from a job (a job's page links its models).
CREATE INDEX model_versions_artifact ON model_versions (artifact_sha256);
CREATE INDEX model_versions_job ON model_versions (job_id) WHERE job_id IS NOT NULL;

CREATE TABLE model_aliases (
    tenant   text NOT NULL,
    name     text NOT NULL,
    alias    text NOT NULL,
    version  integer NOT NULL,
    PRIMARY KEY (tenant, name, alias)
);

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON model_versions, model_aliases TO trainyard_app;

-- Every version ever published, from the events: what was published, by whom, with which
-- artifact and provenance, and what became of it (deprecated when, why).
CREATE VIEW audit.model_versions AS
SELECT p.data ->> 'tenant' AS tenant,
       p.data ->> 'name' AS name,
       (p.data ->> 'version')::integer AS version,
       p.data ->> 'artifact_sha256' AS artifact_sha256,
       (p.data ->> 'size_bytes')::bigint AS size_bytes,
       p.data ->> 'visibility' AS visibility,
       p.data -> 'metadata' ->> 'title' AS title,
       p.data -> 'metadata' ->> 'license' AS license,
       (p.data -> 'metadata' -> 'provenance' ->> 'job_id')::uuid AS job_id,
       (p.data -> 'metadata' -> 'provenance' ->> 'attempt')::integer AS attempt,
       (p.data -> 'metadata' -> 'provenance' ->> 'checkpoint_step')::bigint AS checkpoint_step,
       p.data -> 'metadata' -> 'provenance' ->> 'data_sha256' AS data_sha256,
       (p.data ->> 'at')::timestamptz AS published_at,
       p.metadata ->> 'actor' AS published_by,
       (d.data ->> 'at')::timestamptz AS deprecated_at,
       d.data ->> 'reason' AS deprecated_reason,
       p.position
FROM public.events p
LEFT JOIN public.events d
    ON d.stream_id = p.stream_id AND d.type = 'ModelVersionDeprecated'
   AND (d.data ->> 'version')::integer = (p.data ->> 'version')::integer
WHERE p.type = 'ModelVersionPublished';

COMMENT ON VIEW audit.model_versions IS
    'Every model version ever published (ModelVersionPublished), with its artifact, its '
    'provenance back to a training job, who published it, and its deprecation.';
COMMENT ON COLUMN audit.model_versions.tenant IS 'The tenant whose model it is.';
COMMENT ON COLUMN audit.model_versions.name IS 'The model''s name.';
COMMENT ON COLUMN audit.model_versions.version IS 'The version''s number (1, 2, ...).';
COMMENT ON COLUMN audit.model_versions.artifact_sha256 IS 'The artifact''s sha256, its address.';
COMMENT ON COLUMN audit.model_versions.size_bytes IS 'The artifact''s size.';
COMMENT ON COLUMN audit.model_versions.visibility IS 'private (its tenant only) or public.';
COMMENT ON COLUMN audit.model_versions.title IS 'The metadata''s title.';
COMMENT ON COLUMN audit.model_versions.license IS 'The metadata''s license.';
COMMENT ON COLUMN audit.model_versions.job_id IS
    'The training job it was published from; NULL for an upload.';
COMMENT ON COLUMN audit.model_versions.attempt IS 'The job''s attempt that made the artifact.';
COMMENT ON COLUMN audit.model_versions.checkpoint_step IS
    'The checkpoint''s step; NULL for a job''s final results or an upload.';
COMMENT ON COLUMN audit.model_versions.data_sha256 IS
    'The sha256 of the job''s training data, when its manifest pinned one.';
COMMENT ON COLUMN audit.model_versions.published_at IS 'When it was published.';
COMMENT ON COLUMN audit.model_versions.published_by IS 'Who published it (tenant:<name>, ...).';
COMMENT ON COLUMN audit.model_versions.deprecated_at IS 'When it was deprecated; NULL if not.';
COMMENT ON COLUMN audit.model_versions.deprecated_reason IS 'Why it was deprecated.';
COMMENT ON COLUMN audit.model_versions.position IS 'The publication''s position in public.events.';

GRANT SELECT ON audit.model_versions TO trainyard_auditor;

-- audit.actions gains the model repository's actions. The view keeps its columns, so its
-- grants and column comments stay; the tenant and action columns' comments gain the new words.
CREATE OR REPLACE VIEW audit.actions AS
SELECT (e.data ->> 'at')::timestamptz AS at,
       e.metadata ->> 'actor' AS actor,
       CASE
           -- A job's tenant is named by its submission, the stream's first event.
           WHEN e.stream_id LIKE 'job-%' THEN s.data ->> 'tenant'
           WHEN e.stream_id LIKE 'tenant-%' THEN substr(e.stream_id, length('tenant-') + 1)
           -- model-<tenant>.<name>: tenant names hold no '.'.
           WHEN e.stream_id LIKE 'model-%'
               THEN split_part(substr(e.stream_id, length('model-') + 1), '.', 1)
       END AS tenant,
       CASE e.type
           WHEN 'JobSubmitted' THEN 'submit'
           WHEN 'JobCancelled' THEN 'cancel'
           WHEN 'CheckpointRequested' THEN 'checkpoint_request'
           WHEN 'TenantCreated' THEN 'tenant_create'
           WHEN 'TenantUpdated' THEN 'tenant_update'
           WHEN 'TenantLimitsSet' THEN 'tenant_limits_set'
           WHEN 'TokenIssued' THEN 'token_issue'
           WHEN 'TokenRevoked' THEN 'token_revoke'
           WHEN 'AdminTokenIssued' THEN 'admin_token_issue'
           WHEN 'ModelVersionPublished' THEN 'model_publish'
           WHEN 'ModelMetadataUpdated' THEN 'model_update'
           WHEN 'ModelAliasSet' THEN 'model_alias_set'
           WHEN 'ModelAliasRemoved' THEN 'model_alias_remove'
           WHEN 'ModelVersionDeprecated' THEN 'model_deprecate'
       END AS action,
       CASE WHEN e.stream_id LIKE 'job-%' THEN substr(e.stream_id, length('job-') + 1)::uuid END
           AS job_id,
       e.data ->> 'token_id' AS token_id,
       e.data ->> 'reason' AS reason,
       e.metadata ->> 'correlation_id' AS correlation_id,
       -- traceparent is version-traceid-parentid-flags (W3C trace context).
       nullif(split_part(e.metadata -> 'trace' ->> 'traceparent', '-', 2), '') AS trace_id,
       e.type AS event_type,
       e.position,
       e.recorded_at
FROM public.events e
LEFT JOIN public.events s
    ON s.stream_id = e.stream_id AND s.stream_version = 1 AND e.stream_id LIKE 'job-%'
WHERE e.type IN ('JobSubmitted', 'JobCancelled', 'CheckpointRequested', 'TenantCreated',
                 'TenantUpdated', 'TenantLimitsSet', 'TokenIssued', 'TokenRevoked',
                 'AdminTokenIssued', 'ModelVersionPublished', 'ModelMetadataUpdated',
                 'ModelAliasSet', 'ModelAliasRemoved', 'ModelVersionDeprecated');

COMMENT ON COLUMN audit.actions.tenant IS
    'The tenant acted on (the job''s, the tenant''s, or the model''s); NULL for the admin token.';
COMMENT ON COLUMN audit.actions.action IS
    'submit, cancel, checkpoint_request, tenant_create, tenant_update, tenant_limits_set, '
    'token_issue, token_revoke, admin_token_issue, model_publish, model_update, '
    'model_alias_set, model_alias_remove or model_deprecate.';
COMMENT ON COLUMN audit.actions.reason IS
    'The reason given with a cancellation or a model version''s deprecation; NULL otherwise.';
