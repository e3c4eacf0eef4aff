-- The audit schema: documented, read-only views over the event log for auditors.
--
-- Every view reads `public.events`, the source of truth, rather than the projections or the
-- operational tables (job_status, allocations, ...), which are rebuilt, updated and released
-- in place: an audit answer must come from what was recorded, and stay the same answer however
-- the read models change. docs/audit.md lists questions an auditor asks, with their SQL.
--
-- The views decode each event's JSON `data` at its current schema version (1 for all of
-- them). A migration that raises an event's schema version, or adds an event type that moves a
-- job between states, must update these views; tests/test_audit.py runs a real scenario through
-- them and checks the answers, so a view that falls behind fails there.
--
-- The views run with their owner's rights (Postgres's default for views), so the auditor's
-- role needs no privilege on `events` itself and cannot read anything the views leave out
-- (job manifests with their environments, token hashes, logs).
--
-- Times: `at` is the instant an event says it happened (what the jobs API shows, and what
-- `as_of` compares with); `recorded_at` is when Postgres stored it. They differ by the time a
-- report took to reach the database, or by an agent's clock skew.
--
-- Cost: the views scan the job events (no index serves `job_id = ...`, which is derived from
-- `stream_id`). That is fine for audits, which are rare; dashboards should read projections.

-- The auditor's role: reads the audit schema, nothing else. NOLOGIN: grant it to a login role
-- (`CREATE ROLE alice LOGIN IN ROLE trainyard_auditor`).
DO $$
BEGIN
    CREATE ROLE trainyard_auditor NOLOGIN;
EXCEPTION
    -- Roles are cluster-wide; another database of the same cluster may have created it.
    WHEN duplicate_object THEN NULL;
END
$$;

CREATE SCHEMA audit;
COMMENT ON SCHEMA audit IS
    'Read-only views over the event log for auditors (role trainyard_auditor); see docs/audit.md.';

-- Every state change of every job, in stream order. A job's state is what its last transition
-- entered; `from_state` is the state before it (NULL for the submission).
CREATE VIEW audit.job_transitions AS
WITH job_events AS (
    SELECT e.stream_id,
           substr(e.stream_id, length('job-') + 1)::uuid AS job_id,
           e.stream_version,
           e.position,
           e.type,
           e.data,
           e.metadata,
           e.recorded_at
    FROM public.events e
    WHERE e.stream_id LIKE 'job-%'
      -- The events that move a job between states (not the checkpoint events).
      AND e.type IN ('JobSubmitted', 'JobDeploying', 'JobDownloading', 'JobProcessing',
                     'JobStoring', 'JobCompleted', 'JobFailed', 'JobCancelled', 'JobRestarted')
), entered AS (
    SELECT job_id,
           -- Only the submission carries the tenant; it is the stream's first event.
           first_value(data ->> 'tenant') OVER stream AS tenant,
           -- Attempt 1, plus one for every restart so far: as the lifecycle counts them (a
           -- JobRestarted event starts the attempt it names). JobCancelled carries no attempt.
           1 + count(*) FILTER (WHERE type = 'JobRestarted') OVER stream AS attempt,
           CASE type
               WHEN 'JobSubmitted' THEN 'QUEUED'
               WHEN 'JobDeploying' THEN 'DEPLOYING'
               WHEN 'JobDownloading' THEN 'DOWNLOADING'
               WHEN 'JobProcessing' THEN 'PROCESSING'
               WHEN 'JobStoring' THEN 'STORING'
               WHEN 'JobCompleted' THEN 'COMPLETED'
               WHEN 'JobFailed' THEN 'FAILED'
               WHEN 'JobCancelled' THEN 'CANCELLED'
               WHEN 'JobRestarted' THEN 'QUEUED'
           END AS state,
           (data ->> 'at')::timestamptz AS at,
           metadata ->> 'actor' AS actor,
           data ->> 'reason' AS reason,
           (data ->> 'exit_code')::integer AS exit_code,
           type,
           stream_version,
           position,
           recorded_at
    FROM job_events
    WINDOW stream AS (PARTITION BY job_id ORDER BY stream_version)
)
SELECT job_id,
       tenant,
       attempt,
       lag(state) OVER (PARTITION BY job_id ORDER BY stream_version) AS from_state,
       state AS to_state,
       at,
       actor,
       reason,
       exit_code,
       type AS event_type,
       stream_version,
       position,
       recorded_at
FROM entered;

COMMENT ON VIEW audit.job_transitions IS
    'Every state change of every job, from its job events in stream order: '
    'one row per event that moved the job to a state.';
COMMENT ON COLUMN audit.job_transitions.job_id IS 'The job (its stream is job-<job_id>).';
COMMENT ON COLUMN audit.job_transitions.tenant IS 'The tenant the job was submitted for.';
COMMENT ON COLUMN audit.job_transitions.attempt IS
    'The attempt the job was at after this transition: 1, plus one per restart so far.';
COMMENT ON COLUMN audit.job_transitions.from_state IS
    'The state before this transition; NULL for the submission.';
COMMENT ON COLUMN audit.job_transitions.to_state IS
    'The state entered: QUEUED (submitted, or restarted), DEPLOYING, DOWNLOADING, PROCESSING, '
    'STORING, COMPLETED, FAILED or CANCELLED.';
COMMENT ON COLUMN audit.job_transitions.at IS
    'When it happened, as the event says (what the jobs API shows and as_of compares with).';
COMMENT ON COLUMN audit.job_transitions.actor IS
    'Who caused it: tenant:<name> or admin (HTTP API), agent:<node>, '
    'system:lifecycle-manager (a lost node), operator:cli.';
COMMENT ON COLUMN audit.job_transitions.reason IS
    'Why, for FAILED, CANCELLED and restarts (QUEUED again); NULL otherwise.';
COMMENT ON COLUMN audit.job_transitions.exit_code IS
    'For FAILED: the failing learner''s exit code, when it exited (NULL when killed or never started).';
COMMENT ON COLUMN audit.job_transitions.event_type IS
    'The event recorded: JobSubmitted, JobDeploying, ..., JobRestarted.';
COMMENT ON COLUMN audit.job_transitions.stream_version IS
    'The event''s version in the job''s stream: orders one job''s transitions.';
COMMENT ON COLUMN audit.job_transitions.position IS 'The event''s position in public.events.';
COMMENT ON COLUMN audit.job_transitions.recorded_at IS 'When the database stored the event.';

-- One row per job: what was submitted, by whom, and where the job stands now.
CREATE VIEW audit.jobs AS
WITH latest AS (
    SELECT DISTINCT ON (job_id) job_id, to_state, attempt, at, reason
    FROM audit.job_transitions
    ORDER BY job_id, stream_version DESC
)
SELECT l.job_id,
       s.data ->> 'tenant' AS tenant,
       s.data -> 'manifest' ->> 'name' AS name,
       (s.data ->> 'at')::timestamptz AS submitted_at,
       s.metadata ->> 'actor' AS submitted_by,
       (s.data -> 'manifest' ->> 'learners')::integer AS learners,
       (s.data -> 'manifest' ->> 'gpus_per_learner')::integer AS gpus_per_learner,
       l.to_state AS state,
       l.attempt,
       l.attempt - 1 AS restarts,
       l.at AS state_since,
       l.reason
FROM latest l
JOIN public.events s ON s.stream_id = 'job-' || l.job_id AND s.stream_version = 1;

COMMENT ON VIEW audit.jobs IS
    'One row per job: its submission (from JobSubmitted) and its state now '
    '(its last transition in audit.job_transitions).';
COMMENT ON COLUMN audit.jobs.job_id IS 'The job.';
COMMENT ON COLUMN audit.jobs.tenant IS 'The tenant the job was submitted for.';
COMMENT ON COLUMN audit.jobs.name IS 'The name in its manifest.';
COMMENT ON COLUMN audit.jobs.submitted_at IS 'When it was submitted.';
COMMENT ON COLUMN audit.jobs.submitted_by IS 'Who submitted it: tenant:<name> or admin.';
COMMENT ON COLUMN audit.jobs.learners IS 'Learners per attempt, from its manifest.';
COMMENT ON COLUMN audit.jobs.gpus_per_learner IS 'GPUs per learner, from its manifest.';
COMMENT ON COLUMN audit.jobs.state IS 'Its state now (its last transition).';
COMMENT ON COLUMN audit.jobs.attempt IS 'Its attempt now: 1, plus one per restart.';
COMMENT ON COLUMN audit.jobs.restarts IS 'How many times it was restarted.';
COMMENT ON COLUMN audit.jobs.state_since IS
    'When it entered its state now: for a finished job, when it finished.';
COMMENT ON COLUMN audit.jobs.reason IS
    'Why it is in that state: the failure or cancellation reason, or the last restart''s.';

-- Who did what: the commands people give through the API or the CLI. What agents and the
-- lifecycle manager do to jobs is in audit.job_transitions.
CREATE VIEW audit.actions AS
SELECT (e.data ->> 'at')::timestamptz AS at,
       e.metadata ->> 'actor' AS actor,
       CASE
           -- A job's tenant is named by its submission, the stream's first event.
           WHEN e.stream_id LIKE 'job-%' THEN s.data ->> 'tenant'
           WHEN e.stream_id LIKE 'tenant-%' THEN substr(e.stream_id, length('tenant-') + 1)
       END AS tenant,
       CASE e.type
           WHEN 'JobSubmitted' THEN 'submit'
           WHEN 'JobCancelled' THEN 'cancel'
           WHEN 'CheckpointRequested' THEN 'checkpoint_request'
           WHEN 'TenantCreated' THEN 'tenant_create'
           WHEN 'TokenIssued' THEN 'token_issue'
           WHEN 'TokenRevoked' THEN 'token_revoke'
           WHEN 'AdminTokenIssued' THEN 'admin_token_issue'
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
                 'TokenIssued', 'TokenRevoked', 'AdminTokenIssued');

COMMENT ON VIEW audit.actions IS
    'Who did what: job submissions, cancellations and checkpoint requests; tenants created; '
    'tokens issued and revoked. The use of a token by each request is not recorded as an event, '
    'so it is not here (see docs/audit.md).';
COMMENT ON COLUMN audit.actions.at IS 'When it was done.';
COMMENT ON COLUMN audit.actions.actor IS
    'Who did it: tenant:<name> or admin (HTTP API), operator:cli (the trainyard CLI), '
    'system:bootstrap or system:up (the control plane itself).';
COMMENT ON COLUMN audit.actions.tenant IS
    'The tenant acted on (the job''s, or the tenant''s); NULL for the admin token.';
COMMENT ON COLUMN audit.actions.action IS
    'submit, cancel, checkpoint_request, tenant_create, token_issue, token_revoke or '
    'admin_token_issue.';
COMMENT ON COLUMN audit.actions.job_id IS 'The job acted on; NULL for tenant and token actions.';
COMMENT ON COLUMN audit.actions.token_id IS
    'The token issued or revoked (its public id, never the token); NULL otherwise.';
COMMENT ON COLUMN audit.actions.reason IS 'The reason given with a cancellation; NULL otherwise.';
COMMENT ON COLUMN audit.actions.correlation_id IS
    'The request''s X-Request-ID, when the client sent one: links to request logs.';
COMMENT ON COLUMN audit.actions.trace_id IS 'The W3C trace id of the request, when it was traced.';
COMMENT ON COLUMN audit.actions.event_type IS 'The event recorded.';
COMMENT ON COLUMN audit.actions.position IS 'The event''s position in public.events.';
COMMENT ON COLUMN audit.actions.recorded_at IS 'When the database stored the event.';

-- Every restart: an attempt ended (failed, killed, its node lost or stopped) and the job went
-- back to the queue for a new one.
CREATE VIEW audit.restarts AS
SELECT t.job_id,
       t.tenant,
       t.attempt - 1 AS ended_attempt,
       t.attempt AS new_attempt,
       t.from_state,
       t.at,
       t.actor,
       t.reason,
       e.data ->> 'resume_from' AS resume_from,
       (e.data ->> 'not_before')::timestamptz AS not_before,
       t.position
FROM audit.job_transitions t
JOIN public.events e ON e.position = t.position
WHERE t.event_type = 'JobRestarted';

COMMENT ON VIEW audit.restarts IS
    'Every restart of every job (JobRestarted): the attempt that ended, why, and what the new '
    'attempt resumes from.';
COMMENT ON COLUMN audit.restarts.job_id IS 'The job.';
COMMENT ON COLUMN audit.restarts.tenant IS 'The job''s tenant.';
COMMENT ON COLUMN audit.restarts.ended_attempt IS 'The attempt that ended.';
COMMENT ON COLUMN audit.restarts.new_attempt IS 'The attempt the job was queued for.';
COMMENT ON COLUMN audit.restarts.from_state IS 'The state the ended attempt was in.';
COMMENT ON COLUMN audit.restarts.at IS 'When the job was restarted.';
COMMENT ON COLUMN audit.restarts.actor IS
    'Who restarted it: agent:<node> (its learner failed, or its agent stopped) or '
    'system:lifecycle-manager (its node was lost).';
COMMENT ON COLUMN audit.restarts.reason IS
    'Why: e.g. learner 0 killed by SIGKILL, node agent stopped, node_lost: ...';
COMMENT ON COLUMN audit.restarts.resume_from IS
    'The checkpoint the new attempt resumes from; NULL: it starts over.';
COMMENT ON COLUMN audit.restarts.not_before IS
    'Backoff: the new attempt was not claimed before this instant; NULL: no backoff.';
COMMENT ON COLUMN audit.restarts.position IS 'The event''s position in public.events.';

-- Every checkpoint a learner saved and reported.
CREATE VIEW audit.checkpoints AS
SELECT substr(e.stream_id, length('job-') + 1)::uuid AS job_id,
       s.data ->> 'tenant' AS tenant,
       (e.data ->> 'attempt')::integer AS attempt,
       (e.data ->> 'step')::bigint AS step,
       e.data ->> 'path' AS path,
       (e.data ->> 'size_bytes')::bigint AS size_bytes,
       (e.data ->> 'duration_s')::double precision AS duration_s,
       (e.data ->> 'at')::timestamptz AS at,
       e.metadata ->> 'actor' AS actor,
       e.position
FROM public.events e
JOIN public.events s ON s.stream_id = e.stream_id AND s.stream_version = 1
WHERE e.stream_id LIKE 'job-%' AND e.type = 'CheckpointSaved';

COMMENT ON VIEW audit.checkpoints IS 'Every checkpoint saved by a job''s learners (CheckpointSaved).';
COMMENT ON COLUMN audit.checkpoints.job_id IS 'The job.';
COMMENT ON COLUMN audit.checkpoints.tenant IS 'The job''s tenant.';
COMMENT ON COLUMN audit.checkpoints.attempt IS 'The attempt that saved it.';
COMMENT ON COLUMN audit.checkpoints.step IS 'The training step it holds.';
COMMENT ON COLUMN audit.checkpoints.path IS 'Where it was written, as the learner reported it.';
COMMENT ON COLUMN audit.checkpoints.size_bytes IS 'Its size in bytes.';
COMMENT ON COLUMN audit.checkpoints.duration_s IS 'Seconds it took to write.';
COMMENT ON COLUMN audit.checkpoints.at IS 'When it was saved.';
COMMENT ON COLUMN audit.checkpoints.actor IS 'The agent that reported it: agent:<node>.';
COMMENT ON COLUMN audit.checkpoints.position IS 'The event''s position in public.events.';

-- Which GPU ran which attempt, from when to when: one row per GPU of each JobDeploying event
-- (a claim: the attempt, its nodes, its GPU UUIDs and fencing epoch), up to the event that
-- ended that attempt. `allocations` is not used: its rows are released and may be cleaned up,
-- and its `released_at` (when the learners had actually stopped, up to the agent's grace period
-- after a cancellation) is not part of the record.
CREATE VIEW audit.gpu_allocations AS
WITH attempt_events AS (
    SELECT e.stream_id,
           substr(e.stream_id, length('job-') + 1)::uuid AS job_id,
           e.stream_version,
           e.type,
           e.data,
           e.position
    FROM public.events e
    WHERE e.stream_id LIKE 'job-%'
      -- A claim starts an attempt; each of the others ends the attempt running, if any.
      AND e.type IN ('JobDeploying', 'JobCompleted', 'JobFailed', 'JobCancelled', 'JobRestarted')
), attempts AS (
    -- A job is claimed only while QUEUED, and only an ending event takes it back there, so the
    -- event after a claim among these is the end of that claim's attempt.
    SELECT stream_id,
           job_id,
           type,
           data,
           position,
           lead(type) OVER stream AS end_type,
           lead(data ->> 'at') OVER stream AS end_at
    FROM attempt_events
    WINDOW stream AS (PARTITION BY job_id ORDER BY stream_version)
)
SELECT a.job_id,
       s.data ->> 'tenant' AS tenant,
       (a.data ->> 'attempt')::integer AS attempt,
       -- The claim lists its learners' GPUs in learner order, gpus_per_learner each.
       ((g.ordinal - 1) / (s.data -> 'manifest' ->> 'gpus_per_learner')::integer)::integer
           AS learner,
       g.gpu_uuid,
       ARRAY(SELECT jsonb_array_elements_text(a.data -> 'nodes')) AS nodes,
       (a.data ->> 'epoch')::bigint AS epoch,
       (a.data ->> 'at')::timestamptz AS started_at,
       a.end_at::timestamptz AS ended_at,
       CASE a.end_type
           WHEN 'JobCompleted' THEN 'completed'
           WHEN 'JobFailed' THEN 'failed'
           WHEN 'JobCancelled' THEN 'cancelled'
           WHEN 'JobRestarted' THEN 'restarted'
       END AS outcome,
       coalesce(a.end_at::timestamptz, now()) - (a.data ->> 'at')::timestamptz AS duration,
       extract(epoch FROM coalesce(a.end_at::timestamptz, now()) - (a.data ->> 'at')::timestamptz)
           / 3600 AS gpu_hours,
       a.position
FROM attempts a
JOIN public.events s ON s.stream_id = a.stream_id AND s.stream_version = 1
CROSS JOIN LATERAL jsonb_array_elements_text(a.data -> 'gpus') WITH ORDINALITY AS g (gpu_uuid, ordinal)
WHERE a.type = 'JobDeploying';

COMMENT ON VIEW audit.gpu_allocations IS
    'Which GPU ran which job attempt, from when to when: one row per GPU of each claim '
    '(JobDeploying) until the event that ended the attempt (JobCompleted, JobFailed, '
    'JobCancelled or JobRestarted).';
COMMENT ON COLUMN audit.gpu_allocations.job_id IS 'The job.';
COMMENT ON COLUMN audit.gpu_allocations.tenant IS 'The job''s tenant.';
COMMENT ON COLUMN audit.gpu_allocations.attempt IS 'The attempt the GPU was allocated to.';
COMMENT ON COLUMN audit.gpu_allocations.learner IS 'The learner of the attempt it was pinned to (from 0).';
COMMENT ON COLUMN audit.gpu_allocations.gpu_uuid IS 'The GPU''s UUID (NVML''s, or a fake one).';
COMMENT ON COLUMN audit.gpu_allocations.nodes IS 'The nodes the attempt ran on (one, today).';
COMMENT ON COLUMN audit.gpu_allocations.epoch IS
    'The claim''s fencing epoch: learners of an older epoch were stale.';
COMMENT ON COLUMN audit.gpu_allocations.started_at IS 'When the attempt was claimed (DEPLOYING).';
COMMENT ON COLUMN audit.gpu_allocations.ended_at IS
    'When the attempt ended, as recorded; NULL while it runs. After a cancellation the learners '
    'may take up to the agent''s grace period more to stop.';
COMMENT ON COLUMN audit.gpu_allocations.outcome IS
    'How the attempt ended: completed, failed, cancelled or restarted; NULL while it runs.';
COMMENT ON COLUMN audit.gpu_allocations.duration IS
    'ended_at - started_at; for a running attempt, up to now() (the querying transaction''s start).';
COMMENT ON COLUMN audit.gpu_allocations.gpu_hours IS 'duration in hours: this GPU''s GPU-hours.';
COMMENT ON COLUMN audit.gpu_allocations.position IS
    'The position of the claim (JobDeploying) in public.events.';

-- GPU-hours per tenant and calendar month (UTC): the allocations above, each split at month
-- boundaries so that an attempt running across midnight of the 1st counts in both months.
-- Computed in UTC timestamps, so neither the session's time zone nor DST changes an answer.
CREATE VIEW audit.gpu_hours_by_tenant AS
WITH spans AS (
    SELECT tenant,
           job_id,
           attempt,
           ended_at IS NULL AS running,
           started_at AT TIME ZONE 'UTC' AS started,
           -- A running attempt counts up to now; an end before its start (clock skew between
           -- hosts) counts as zero.
           greatest(coalesce(ended_at, now()), started_at) AT TIME ZONE 'UTC' AS ended
    FROM audit.gpu_allocations
)
SELECT s.tenant,
       m.month::date AS month,
       sum(extract(epoch FROM least(s.ended, m.month + interval '1 month')
                              - greatest(s.started, m.month)) / 3600) AS gpu_hours,
       count(DISTINCT s.job_id) AS jobs,
       count(DISTINCT (s.job_id, s.attempt)) AS attempts,
       bool_or(s.running) AS running
FROM spans s
CROSS JOIN LATERAL generate_series(date_trunc('month', s.started), date_trunc('month', s.ended),
                                   interval '1 month') AS m (month)
GROUP BY s.tenant, m.month;

COMMENT ON VIEW audit.gpu_hours_by_tenant IS
    'GPU-hours per tenant and calendar month (UTC), from audit.gpu_allocations split at month '
    'boundaries; running attempts count up to now(). A tenant that used no GPU in a month has '
    'no row for it.';
COMMENT ON COLUMN audit.gpu_hours_by_tenant.tenant IS 'The tenant.';
COMMENT ON COLUMN audit.gpu_hours_by_tenant.month IS 'The month (UTC), as its first day.';
COMMENT ON COLUMN audit.gpu_hours_by_tenant.gpu_hours IS
    'GPU-hours used in that month: each GPU of each attempt counts for the time it was allocated.';
COMMENT ON COLUMN audit.gpu_hours_by_tenant.jobs IS 'Jobs that held GPUs in that month.';
COMMENT ON COLUMN audit.gpu_hours_by_tenant.attempts IS 'Attempts that held GPUs in that month.';
COMMENT ON COLUMN audit.gpu_hours_by_tenant.running IS
    'Whether an attempt still runs, so that the month''s total still grows.';

-- The auditor reads these views and nothing else: no privilege on any table of `public` (the
-- views read `events` with their owner's rights). A later migration that adds a view here
-- grants it too.
GRANT USAGE ON SCHEMA audit TO trainyard_auditor;
GRANT SELECT ON ALL TABLES IN SCHEMA audit TO trainyard_auditor;

-- The connecting user (who runs migrations) must be able to act as the auditor, to check what
-- it sees: superusers always can, an owner that is not a superuser only as a member.
GRANT trainyard_auditor TO CURRENT_USER;
