-- Log search's indexer locks only the queued ranges it copies (issue 38: several indexers at
-- once, in one control plane and across replicas, so that indexing scales with the database).
--
-- 0035's `index_job_log_lines` took its ranges in a PL/pgSQL `FOR range IN SELECT ... FOR
-- UPDATE SKIP LOCKED` loop. Such a loop fetches its query's rows ten at a time, and each row
-- fetched is locked, so a call that stopped after its first range (a writer's 5,000-line
-- statement and the next make a 10,000-line batch) still held up to nine more ranges until it
-- committed: a second indexer skipped them, and with ten ranges or fewer queued found nothing
-- to do at all (tests/controlplane/logs/test_log_indexers.py shows it). An explicit cursor
-- fetched one row at a time locks exactly the ranges the call takes.
--
-- Nothing else changes: same batches, order, copy and merge (see 0035).

CREATE OR REPLACE FUNCTION index_job_log_lines(max_lines integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    -- Oldest first, so that no range waits forever; the ranges other indexers hold are
    -- skipped, not waited for.
    queue CURSOR FOR SELECT entry, first_id, last_id FROM job_log_search_queue
                     ORDER BY entry FOR UPDATE SKIP LOCKED;
    entries bigint[] := '{}';
    queued bigint := 0;
    range record;
    copied integer;
BEGIN
    OPEN queue;
    WHILE queued < max_lines LOOP
        FETCH queue INTO range;
        EXIT WHEN NOT FOUND;
        entries := entries || range.entry;
        queued := queued + range.last_id - range.first_id + 1;
    END LOOP;
    CLOSE queue;
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
