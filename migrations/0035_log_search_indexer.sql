-- Log search's index moves off the writers' path (issue 38: ingestion >= 50,000 lines/s with it).
--
-- 0034 kept the trigram index (and the tenant's order index) on `job_logs` itself, so that
-- every line a writer stored had its trigrams extracted and put into the GIN index inside the
-- writer's COPY: one writer stored 28,422 lines/s with it against 55,377 without
-- (docs/log-search.md). A larger GIN pending list does not help enough: the pending list still
-- takes every line's trigrams (about 1.4 kB of index entries per 73-character line, each page
-- WAL-logged) inside the COPY; only the merge into the tree moves out. We measured it at about
-- 9 us a line against the 2 us that separate 50,000 lines/s from the writer's 55,000 without.
--
-- So the searchable copy of the lines is a table of its own, filled behind the writers:
--   * job_log_search: every line with a tenant, its order index and (where pg_trgm is) its
--     trigram index; written only by `index_job_log_lines`, which the lifecycle manager calls
--     each sweep (controlplane/agents/manager.py) and which copies committed lines in bulk.
--   * job_log_search_queue: what is stored but not yet copied, one row per job per statement
--     that stored lines (a range of the job's ids), added by a statement-level trigger on
--     job_logs in the writer's own transaction: a set-based aggregate over the statement's
--     lines, no per-row work. Every writer (agents of any version, bulk loads) goes through
--     it, so no line can be left out of search by a writer that does not know about it.
--   * job_log_searched: what a search reads, the copied lines and the queued ones (read
--     through job_logs' (job_id, id) key) in one statement, so in one snapshot: the indexer
--     moves lines from the second to the first in one transaction, and a search sees each
--     line exactly once, the moment the writer commits it. Searches are exact, with no lag;
--     what the indexer's lag costs is time, as the queued lines are matched one by one.
-- The price is the line text stored twice (the copy is about the size of job_logs' heap) and
-- the indexer's work, which is what the writer did before, now done in bulk behind it.

CREATE TABLE job_log_search (
    job_id  uuid NOT NULL,
    id      bigint NOT NULL,
    tenant  text NOT NULL,
    attempt integer NOT NULL,
    learner integer NOT NULL,
    stream  text NOT NULL,
    seq     bigint NOT NULL,
    at      timestamptz NOT NULL,
    line    text NOT NULL,
    -- By job: what retention deletes with the job's lines.
    PRIMARY KEY (job_id, id)
);

-- The tenant's lines newest first: a search for a common term walks it backwards and stops
-- after a page; also the search's order and cursor (0034's job_logs_tenant_order, moved).
CREATE INDEX job_log_search_order ON job_log_search (tenant, at, job_id, id);

CREATE TABLE job_log_search_queue (
    -- The order the indexer takes the ranges in, oldest first, so none waits forever.
    entry    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant   text NOT NULL,
    job_id   uuid NOT NULL,
    first_id bigint NOT NULL,
    last_id  bigint NOT NULL
);

-- A search reads its tenant's queued lines only.
CREATE INDEX job_log_search_queue_tenant ON job_log_search_queue (tenant);

-- Lines stored before this migration are copied now, and the indexes built afterwards (one
-- sorted build each: far cheaper than the same entries added line by line).
INSERT INTO job_log_search (job_id, id, tenant, attempt, learner, stream, seq, at, line)
SELECT job_id, id, tenant, attempt, learner, stream, seq, at, line
FROM job_logs WHERE tenant IS NOT NULL;

DROP INDEX job_logs_tenant_order;
DROP INDEX IF EXISTS job_logs_search;

-- 0034 installed pg_trgm and btree_gin where the server has them; only there is there a
-- trigram index (docs/log-search.md says how to add it later). Its pending list holds a whole
-- call of the indexer (10,000 lines of about 1.4 kB of entries each), which merges it into the
-- tree once at its end (`index_job_log_lines`): one sorted merge a call instead of one each
-- 4 MB (the default), 22 us a line copied against 30 over the benchmark's log; and searches,
-- which read the pending list whole, never find more than one call's lines in it.
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_extension WHERE extname IN ('pg_trgm', 'btree_gin')) = 2 THEN
        CREATE INDEX job_log_search_trigrams ON job_log_search
            USING gin (tenant, line gin_trgm_ops) WITH (gin_pending_list_limit = 32768);
    END IF;
END
$$;

-- Queues each statement's new lines for the indexer: one range per job. A job's ids only grow
-- from one statement to the next (its writers take turns on its head, 0007), so ranges never
-- overlap and each line is queued once. Lines without a tenant are found by no search and are
-- not queued. SECURITY DEFINER: agents store lines but may not touch the queue themselves.
CREATE FUNCTION job_logs_queue_for_search() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
    INSERT INTO job_log_search_queue (tenant, job_id, first_id, last_id)
    SELECT tenant, job_id, min(id), max(id) FROM added
    WHERE tenant IS NOT NULL
    GROUP BY tenant, job_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_logs_queue_for_search AFTER INSERT ON job_logs
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION job_logs_queue_for_search();

-- The indexer: copies the lines of the oldest queued ranges, about `max_lines` of them (whole
-- ranges), into job_log_search and takes the ranges off the queue, in one transaction; returns
-- how many lines it copied. A queued range was committed with its lines, so every line of it
-- is there to copy. SKIP LOCKED: two callers (two managers for a moment) take different ranges.
-- Then the trigram index's pending list, which now holds these lines' entries, is merged into
-- its tree (see the index above).
-- PL/pgSQL for the loop that stops at `max_lines`: FOR UPDATE does not go with the window
-- function that would say it in one statement.
CREATE FUNCTION index_job_log_lines(max_lines integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    entries bigint[] := '{}';
    queued bigint := 0;
    range record;
    copied integer;
BEGIN
    FOR range IN SELECT entry, first_id, last_id FROM job_log_search_queue
                 ORDER BY entry FOR UPDATE SKIP LOCKED LOOP
        entries := entries || range.entry;
        queued := queued + range.last_id - range.first_id + 1;
        EXIT WHEN queued >= max_lines;
    END LOOP;
    INSERT INTO job_log_search (job_id, id, tenant, attempt, learner, stream, seq, at, line)
    SELECT l.job_id, l.id, l.tenant, l.attempt, l.learner, l.stream, l.seq, l.at, l.line
    FROM job_log_search_queue q
    JOIN job_logs l ON l.job_id = q.job_id AND l.id BETWEEN q.first_id AND q.last_id
    WHERE q.entry = ANY (entries);
    GET DIAGNOSTICS copied = ROW_COUNT;
    DELETE FROM job_log_search_queue WHERE entry = ANY (entries);
    IF copied > 0 AND to_regclass('job_log_search_trigrams') IS NOT NULL THEN
        PERFORM gin_clean_pending_list('job_log_search_trigrams');
    END IF;
    RETURN copied;
END
$$;

REVOKE ALL ON FUNCTION index_job_log_lines(integer) FROM PUBLIC;
-- Only the control plane's lifecycle manager (and the benchmark, as the owner).
GRANT EXECUTE ON FUNCTION index_job_log_lines(integer) TO trainyard_app;

-- What a search reads: the copied lines, and the queued ones not yet copied. Both parts give
-- the tenant, so a search's `tenant = $1` reaches the copy's indexes and the queue's.
CREATE VIEW job_log_searched AS
SELECT tenant, job_id, id, attempt, learner, stream, seq, at, line FROM job_log_search
UNION ALL
SELECT q.tenant, l.job_id, l.id, l.attempt, l.learner, l.stream, l.seq, l.at, l.line
FROM job_log_search_queue q
JOIN job_logs l ON l.job_id = q.job_id AND l.id BETWEEN q.first_id AND q.last_id;

REVOKE ALL ON job_log_searched FROM PUBLIC;
GRANT SELECT ON job_log_searched TO trainyard_app;

-- Retention (0027) now forgets a job's copy and queued ranges too. The queue first: its DELETE
-- waits for an indexer holding the job's ranges, so the copy's DELETE, a statement later,
-- sees the lines that indexer copied.
CREATE OR REPLACE FUNCTION forget_job_logs(retention interval, max_jobs integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    jobs uuid[];
BEGIN
    jobs := ARRAY(
        SELECT h.job_id FROM job_log_heads h JOIN job_status s USING (job_id)
        WHERE h.updated_at < now() - retention
          AND s.state IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND s.updated_at < now() - retention
        ORDER BY h.updated_at
        LIMIT max_jobs
        FOR UPDATE OF h SKIP LOCKED
    );
    DELETE FROM job_log_search_queue WHERE job_id = ANY (jobs);
    DELETE FROM job_log_search WHERE job_id = ANY (jobs);
    DELETE FROM job_logs WHERE job_id = ANY (jobs);
    DELETE FROM job_log_series WHERE job_id = ANY (jobs);
    DELETE FROM job_log_heads WHERE job_id = ANY (jobs);
    RETURN cardinality(jobs);
END
$$;
