-- The secret environment variables of jobs (the manifest's `secret_env`), stored apart from the
-- event log: the log is append-only and kept forever, and the auditor reads it, so a credential
-- written there could never be taken back. A job's row is written in the transaction that
-- appends its JobSubmitted (no job half written), read by the agent that starts each attempt,
-- and deleted by the `jobs` projection once the job is COMPLETED, FAILED or CANCELLED. The
-- audit schema's views never read this table, and the auditor's role has no right on it.
CREATE TABLE job_secret_env (
    job_id     uuid PRIMARY KEY,
    tenant     text NOT NULL,
    env        jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

GRANT SELECT, INSERT, DELETE ON job_secret_env TO trainyard_app;
-- AGENT RIGHTS: the agent that starts an attempt gives the learners their job's secrets.
GRANT SELECT ON job_secret_env TO trainyard_agent;
