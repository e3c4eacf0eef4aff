-- Learner logs: every stdout/stderr line of every learner, and the agent's own notes about it.
--
-- A line is identified by where it came from: (job, attempt, learner, stream, seq), where `seq`
-- numbers the lines of one stream of one learner from 1. That key is what makes writes
-- idempotent: an agent that retries a batch, or resumes after a restart, never stores a line
-- twice.
--
-- Readers need one order over all of a job's lines, and a cursor (the SSE `id`) that resumes
-- exactly after a line even while several learners write at once. `id` is that order: a
-- per-job counter handed out by `job_log_heads`, whose row each writer locks from taking its
-- ids until it commits. So the writers of one job take turns, a later id never commits before
-- an earlier one, and `id > cursor` can never skip a line that commits late (a bigserial could:
-- it is handed out at insert time, not commit time). Unlike the event store's (xid, position)
-- order it needs no cluster-wide snapshot bound, so a long transaction elsewhere does not hold
-- logs back. The price is that the writers of one job are serialized: a job's log throughput
-- is that of one COPY stream.

CREATE TABLE job_logs (
    job_id  uuid NOT NULL,
    attempt integer NOT NULL CHECK (attempt > 0),
    learner integer NOT NULL CHECK (learner >= 0),
    stream  text NOT NULL CHECK (stream IN ('stdout', 'stderr', 'system')),
    seq     bigint NOT NULL CHECK (seq > 0),
    id      bigint NOT NULL CHECK (id > 0),
    at      timestamptz NOT NULL,
    line    text NOT NULL,
    PRIMARY KEY (job_id, attempt, learner, stream, seq),
    CONSTRAINT job_logs_cursor_key UNIQUE (job_id, id)
);

-- One row per job that has logs: the last id handed out, and when (for "has the log gone
-- quiet?"). Writers lock the row while they write.
CREATE TABLE job_log_heads (
    job_id     uuid PRIMARY KEY,
    last_id    bigint NOT NULL,
    updated_at timestamptz NOT NULL
);

-- The last stored seq of every stream of every learner: where an agent resumes, and what a
-- retried batch leaves out. Written in the same transaction as the lines.
CREATE TABLE job_log_series (
    job_id   uuid NOT NULL,
    attempt  integer NOT NULL,
    learner  integer NOT NULL,
    stream   text NOT NULL,
    last_seq bigint NOT NULL,
    PRIMARY KEY (job_id, attempt, learner, stream)
);

-- Logs outlive their jobs: the application may add lines, never change or remove them.
REVOKE ALL ON job_logs FROM PUBLIC;
GRANT SELECT, INSERT ON job_logs TO trainyard_app;
GRANT SELECT, INSERT, UPDATE ON job_log_heads, job_log_series TO trainyard_app;
