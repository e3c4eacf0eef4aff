-- Webhook notifications: the tenants' signing secrets, and the outbox of deliveries that the
-- `webhook_outbox` projection fills (in the transaction that advances its checkpoint, so each
-- JobRestarted, JobFailed and JobCompleted of a job with a webhook_url gets exactly one row) and
-- the control plane's relay empties (claims with SKIP LOCKED, POSTs, records the outcome).

-- Each tenant's webhook signing secrets. The relay signs with the secret itself, so the secret
-- is stored, not a hash of it (unlike API tokens); the events record only its id, and the
-- auditor's views never read this table. A rotation retires the current secret: deliveries are
-- signed with it too for a grace period, so that receivers can switch without a gap.
CREATE TABLE webhook_secrets (
    secret_id  text PRIMARY KEY,
    tenant     text NOT NULL,
    secret     text NOT NULL,
    created_at timestamptz NOT NULL,
    retired_at timestamptz
);
-- One current secret per tenant.
CREATE UNIQUE INDEX webhook_secrets_current ON webhook_secrets (tenant) WHERE retired_at IS NULL;

-- One row per notified job event. `body` is the exact text every attempt sends (text, not
-- jsonb, which would not keep it byte for byte). `next_attempt_at` is when anyone may try it
-- next: a claim moves it past the claimant's lease, so a relay that dies mid-attempt leaves a
-- row that becomes due again on its own; `claim` fences a late outcome from an expired claim.
CREATE TABLE webhook_deliveries (
    delivery_id     uuid PRIMARY KEY,
    position        bigint NOT NULL UNIQUE,
    job_id          uuid NOT NULL,
    tenant          text NOT NULL,
    event           text NOT NULL,
    url             text NOT NULL,
    body            text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    state           text NOT NULL DEFAULT 'pending',
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claim           uuid,
    last_status     integer,
    last_error      text,
    finished_at     timestamptz,
    CHECK (state IN ('pending', 'delivered', 'failed')),
    CHECK (attempts >= 0)
);
-- What relays claim: pending rows that are due, earliest first.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX webhook_deliveries_job ON webhook_deliveries (job_id);

-- Neither table is a read model: nothing deletes from them (a rebuild of the outbox is refused).
GRANT SELECT, INSERT, UPDATE ON webhook_secrets, webhook_deliveries TO trainyard_app;

-- The outbox starts at the log's readable tail: jobs that finished before notifications existed
-- are not announced now. (Events of transactions still open commit above this point.)
INSERT INTO projection_checkpoints (name, xid, position)
SELECT 'webhook_outbox', xid, position FROM events
WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid DESC, position DESC
LIMIT 1;

-- Every attempt to deliver a notification, from the events of the `webhook-<job_id>` streams.
CREATE VIEW audit.webhook_attempts AS
SELECT substr(e.stream_id, length('webhook-') + 1)::uuid AS job_id,
       s.data ->> 'tenant' AS tenant,
       (e.data ->> 'delivery_id')::uuid AS delivery_id,
       e.data ->> 'job_event' AS job_event,
       (e.data ->> 'job_event_position')::bigint AS job_event_position,
       (e.data ->> 'attempt')::integer AS attempt,
       CASE e.type
           WHEN 'WebhookDelivered' THEN 'delivered'
           WHEN 'WebhookAttemptFailed' THEN 'retrying'
           WHEN 'WebhookFailed' THEN 'gave_up'
       END AS outcome,
       (e.data ->> 'status')::integer AS status,
       e.data ->> 'error' AS error,
       (e.data ->> 'started_at')::timestamptz AS started_at,
       (e.data ->> 'at')::timestamptz AS at,
       (e.data ->> 'retry_at')::timestamptz AS retry_at,
       e.position
FROM public.events e
JOIN public.events s
    ON s.stream_id = 'job-' || substr(e.stream_id, length('webhook-') + 1)
   AND s.stream_version = 1
WHERE e.stream_id LIKE 'webhook-%'
  AND e.type IN ('WebhookDelivered', 'WebhookAttemptFailed', 'WebhookFailed');

COMMENT ON VIEW audit.webhook_attempts IS
    'Every attempt to deliver a job''s notification (JobRestarted, JobFailed, JobCompleted) to '
    'its webhook_url: WebhookDelivered, WebhookAttemptFailed (retried later) and WebhookFailed '
    '(the last attempt; given up). The URL is not shown: it may carry a receiver''s credentials.';
COMMENT ON COLUMN audit.webhook_attempts.job_id IS 'The job notified about.';
COMMENT ON COLUMN audit.webhook_attempts.tenant IS 'The job''s tenant.';
COMMENT ON COLUMN audit.webhook_attempts.delivery_id IS
    'The delivery (one per notified event): the Trainyard-Delivery-Id header receivers dedupe on.';
COMMENT ON COLUMN audit.webhook_attempts.job_event IS
    'The event notified: JobRestarted, JobFailed or JobCompleted.';
COMMENT ON COLUMN audit.webhook_attempts.job_event_position IS
    'That event''s position in public.events.';
COMMENT ON COLUMN audit.webhook_attempts.attempt IS 'The attempt''s number, from 1.';
COMMENT ON COLUMN audit.webhook_attempts.outcome IS
    'delivered (a 2xx answer), retrying (failed; tried again at retry_at) or gave_up (failed, '
    'and it was the last attempt).';
COMMENT ON COLUMN audit.webhook_attempts.status IS
    'The receiver''s HTTP status; NULL when none came (refused, timed out, unreachable).';
COMMENT ON COLUMN audit.webhook_attempts.error IS 'Why it failed; NULL when delivered.';
COMMENT ON COLUMN audit.webhook_attempts.started_at IS 'When the attempt began.';
COMMENT ON COLUMN audit.webhook_attempts.at IS 'When the attempt ended.';
COMMENT ON COLUMN audit.webhook_attempts.retry_at IS
    'For retrying: the earliest time of the next attempt (the backoff); NULL otherwise.';
COMMENT ON COLUMN audit.webhook_attempts.position IS 'The attempt''s event in public.events.';

GRANT SELECT ON audit.webhook_attempts TO trainyard_auditor;
