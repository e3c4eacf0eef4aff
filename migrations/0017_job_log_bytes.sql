-- The bytes a job has logged so far, for the agent that enforces the job's log limits (after a
-- restart too). A function that runs with its owner's rights: agents learn the total, and still
-- cannot read tenants' lines (they may only add them, see 0014).
CREATE FUNCTION job_log_bytes(job uuid) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$ SELECT coalesce(sum(octet_length(line)), 0)::bigint FROM job_logs WHERE job_id = job $$;

REVOKE ALL ON FUNCTION job_log_bytes(uuid) FROM PUBLIC;
-- AGENT RIGHTS: what a job has logged, in bytes.
GRANT EXECUTE ON FUNCTION job_log_bytes(uuid) TO trainyard_agent, trainyard_app;
