-- Search across logs (`GET /v1/logs/search`, `trainyard grep`): a tenant's lines of all its jobs
-- and attempts that match a substring or a regular expression, newest first.
--
-- `job_logs` had no tenant: a tenant's lines were found through its jobs, which is fine for one
-- job's log but makes "the newest matches among all of acme's jobs" a merge over every job it
-- ever ran. So each line now carries its job's tenant, written by the writer with the line (the
-- tenant is read from job_status by the same statement that takes the lines' ids, see
-- `reserve_log_ids`) and checked by the database (below), so that an agent cannot file a line
-- under another tenant. Lines of a job that job_status does not know (none in production: a
-- job is claimed from job_status before it logs) have no tenant, and no tenant finds them.
--
-- Two indexes serve a search, and the planner picks between them by how common the pattern is
-- (the handler plans each search for its own pattern, `plan_cache_mode = force_custom_plan`):
--   * job_logs_tenant_order, (tenant, at, job_id, id): the tenant's lines newest first, read
--     backwards until a page of matches is found. Fast for common terms (a page is found near
--     the start), and the search's order and cursor.
--   * job_logs_search, GIN (tenant, line gin_trgm_ops) (pg_trgm, with btree_gin for the tenant
--     column): the lines holding every trigram of the pattern (substring or regular
--     expression), of that tenant only; sorted afterwards. Fast for rare terms.
-- pg_trgm and btree_gin are contrib extensions that not every server ships (the embedded one of
-- `trainyard up` and the tests does not): where they are missing the GIN index is left out and
-- every search reads the tenant's lines through the order index instead. Same results, slower
-- for rare terms on big logs; docs/log-search.md says how to add the index later.
--
-- A GIN index per line, rather than partitions by time or an index of chunks of lines: it is
-- the only one of the three that serves a regular expression, a substring and the tenant with
-- one structure, needs no partition maintenance, and is dropped with the lines by retention
-- (forget_job_logs deletes rows, which the index follows). Its price is ingestion: every line's
-- trigrams are extracted as it is stored; docs/log-search.md gives the figures.

ALTER TABLE job_logs ADD COLUMN tenant text;

-- Lines stored before this migration get their job's tenant.
UPDATE job_logs l SET tenant = s.tenant FROM job_status s WHERE s.job_id = l.job_id;

CREATE INDEX job_logs_tenant_order ON job_logs (tenant, at, job_id, id);

DO $$
BEGIN
    IF (SELECT count(*) FROM pg_available_extensions WHERE name IN ('pg_trgm', 'btree_gin')) = 2
    THEN
        CREATE EXTENSION IF NOT EXISTS pg_trgm;
        CREATE EXTENSION IF NOT EXISTS btree_gin;
        CREATE INDEX job_logs_search ON job_logs USING gin (tenant, line gin_trgm_ops);
    END IF;
END
$$;

-- The tenant of every line an agent stores is its job's (NULL for a job job_status does not
-- know), also for the owner's own agents (unconfined by 0032's policies). Checked once per statement, over all its lines (COPY bypasses row-level security, see
-- 0032): a forged tenant would put a line in another tenant's searches. The application's own
-- sessions write what `reserve_log_ids` read, in the same transaction.
-- Not SECURITY DEFINER: it asks whether the session's role is an agent (agents read job_status).
CREATE FUNCTION job_logs_tenant_lines() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp
AS $$
BEGIN
    -- Agents' sessions (every one: an honest writer never trips this); a superuser, who is a
    -- member of every role, writing as itself (a bulk load) is not one.
    IF NOT pg_has_role(current_user, 'trainyard_agent', 'MEMBER')
       OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM added l LEFT JOIN job_status s ON s.job_id = l.job_id
               WHERE l.tenant IS DISTINCT FROM s.tenant) THEN
        RAISE EXCEPTION 'a log line''s tenant must be its job''s'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_logs_tenant_lines AFTER INSERT ON job_logs
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION job_logs_tenant_lines();
