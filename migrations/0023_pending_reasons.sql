-- Why each queued job waits: its reasons now (written by the pending-reasons recorder each
-- round), and every span of time a reason held it (the `pending` projection of the recorder's
-- events), so that history answers "why was it pending from 10:00 to 10:40".

-- One row a job that was ever queued. `version` is its pending stream's: the recorder appends
-- there without reading the stream first. `queued` goes false when it leaves the queue; the
-- row stays, for its stream's version and a later attempt's return. `estimated_start`: when it
-- should start, from the running jobs' expected ends; NULL when it can start now, or when an
-- end it waits for is not known.
CREATE TABLE pending_reasons (
    job_id      uuid PRIMARY KEY,
    tenant      text NOT NULL,
    attempt     integer NOT NULL,
    version     integer NOT NULL CHECK (version >= 1),
    queued      boolean NOT NULL,
    position    integer CHECK (position >= 1),
    kinds       text[] NOT NULL,
    reasons     jsonb NOT NULL,
    since       timestamptz NOT NULL,
    estimated_start timestamptz,
    updated_at  timestamptz NOT NULL
);
-- Each round reads the jobs still queued, not every job that ever waited.
CREATE INDEX pending_reasons_queued ON pending_reasons (job_id) WHERE queued;

-- Which recorder wrote last, and its round: a recorder keeps the rows it wrote in memory, and
-- reads them again only when another (another replica's, or its own predecessor) wrote since.
CREATE TABLE pending_rounds (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    writer  uuid NOT NULL,
    round   bigint NOT NULL
);

CREATE TABLE pending_spans (
    job_id      uuid NOT NULL,
    attempt     integer NOT NULL,
    reason      text NOT NULL,
    blocking    text NOT NULL CHECK (blocking IN ('never', 'waiting')),
    detail      text NOT NULL,
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz,
    PRIMARY KEY (job_id, attempt, reason, started_at)
);
-- A change closes the job's open spans.
CREATE INDEX pending_spans_open ON pending_spans (job_id) WHERE ended_at IS NULL;

GRANT SELECT, INSERT, UPDATE, DELETE ON pending_reasons, pending_rounds TO trainyard_app;
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON pending_spans TO trainyard_app;

CREATE VIEW audit.pending_reasons AS
SELECT p.job_id,
       j.tenant,
       p.attempt,
       p.reason,
       p.blocking,
       p.detail,
       p.started_at,
       p.ended_at,
       extract(epoch FROM coalesce(p.ended_at, now()) - p.started_at)::float8 AS seconds
FROM public.pending_spans p
JOIN public.job_status j USING (job_id);

COMMENT ON VIEW audit.pending_reasons IS
    'Every span of time a reason held a queued job back: why it was pending, and for how long.';
COMMENT ON COLUMN audit.pending_reasons.job_id IS 'The job.';
COMMENT ON COLUMN audit.pending_reasons.tenant IS 'Whose job it is.';
COMMENT ON COLUMN audit.pending_reasons.attempt IS 'The attempt that waited (a restarted job queues again).';
COMMENT ON COLUMN audit.pending_reasons.reason IS
    'no_nodes, unschedulable, gpu_unhealthy, quota, backoff, resources, fair_share, priority, starting or replicas.';
COMMENT ON COLUMN audit.pending_reasons.blocking IS
    'never: it will not run as it is (the cluster, the job or the quota must change); waiting: it waits its turn or for room.';
COMMENT ON COLUMN audit.pending_reasons.detail IS 'What the reason said when it began.';
COMMENT ON COLUMN audit.pending_reasons.started_at IS 'When the reason began to hold the job.';
COMMENT ON COLUMN audit.pending_reasons.ended_at IS 'When it stopped (NULL: it still holds).';
COMMENT ON COLUMN audit.pending_reasons.seconds IS 'How long it held the job (until now while it still does).';

GRANT SELECT ON audit.pending_reasons TO trainyard_auditor;
