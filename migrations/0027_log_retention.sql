-- Log retention: the lines of a job that ended long ago go, with its head and series, so that
-- `job_logs` does not grow with the whole history of the fleet. The lifecycle manager calls
-- this each sweep (`trainyard serve --log-retention-days`). The application still may not
-- delete lines itself (0007): only whole jobs' logs go, only here, only once the job has ended.

-- Candidates are found from the heads, not from job_status: job_status holds every job ever
-- run, ended and forgotten alike, while the heads hold only the jobs whose logs are still kept.
-- This index walks just the heads quiet for longer than the retention. With 100,000 ended jobs
-- of the last two years and 2,000 running: once only the last 30 days' logs are kept, a call
-- reads no row (0.03 ms; from job_status, a scan of all 100,000: 28 ms); on the first run, with
-- every job's logs still there, it reads its batch's rows only (3 ms; without the index, every
-- head is joined and sorted: 80 ms). A job's last line is stored within moments of its end, so
-- the two times nearly coincide; where a line comes later, the job's logs are kept the
-- retention after that line.
CREATE INDEX job_log_heads_quiet ON job_log_heads (updated_at);

-- The lines, heads and series of at most `max_jobs` jobs that ended (COMPLETED, FAILED or
-- CANCELLED: final, so no attempt of theirs will write again) and whose last line was stored,
-- more than `retention` ago; returns how many jobs' logs it removed. A job that lives keeps
-- every attempt's lines. At most `max_jobs` a call, so that a first run over years of history
-- is many short transactions, not one that holds the table for hours.
--
-- PL/pgSQL, not SQL, for two snapshots: the heads are locked first (a writer takes its job's
-- head before it stores lines, and SKIP LOCKED passes over a job being written to), and the
-- deletes that follow see every line committed before the lock was granted.
CREATE FUNCTION forget_job_logs(retention interval, max_jobs integer) RETURNS integer
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
    DELETE FROM job_logs WHERE job_id = ANY (jobs);
    DELETE FROM job_log_series WHERE job_id = ANY (jobs);
    DELETE FROM job_log_heads WHERE job_id = ANY (jobs);
    RETURN cardinality(jobs);
END
$$;

REVOKE ALL ON FUNCTION forget_job_logs(interval, integer) FROM PUBLIC;
-- Only the control plane's lifecycle manager: agents add lines, they never remove any.
GRANT EXECUTE ON FUNCTION forget_job_logs(interval, integer) TO trainyard_app;
