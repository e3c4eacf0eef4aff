-- Webhooks' statements: the outbox projection, the relay's deliveries, tenants' signing secrets.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: job_submissions
-- The first event (the submission) of some job streams.
SELECT stream_id, type, schema_version, data FROM events
WHERE stream_id = ANY($1::text[]) AND stream_version = 1;

-- name: insert_webhook_deliveries
-- The `webhook_outbox` projection: a batch's deliveries as arrays, one per column. No ON
-- CONFLICT: the checkpoint moves in the same transaction, so an event never comes twice, and
-- the unique position would refuse it if it did.
INSERT INTO webhook_deliveries (delivery_id, position, stream, job_id, tenant, event, url, body)
SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::uuid[], $5::text[], $6::text[],
                     $7::text[], $8::text[]);

-- name: model_webhook_changes
-- The webhook changes of some model streams, in stream order: which URL (if any) each of the
-- model's events is notified to follows from them.
SELECT stream_id, stream_version, type, schema_version, data FROM events
WHERE stream_id = ANY($1::text[]) AND type IN ('ModelWebhookSet', 'ModelWebhookRemoved')
ORDER BY stream_id, stream_version;

-- name: notify_webhooks
-- Wake the relays (the channel is controlplane.webhooks.outbox.CHANNEL); a hint, no payload.
SELECT pg_notify('trainyard_webhooks', '');

-- name: claim_webhook_deliveries
-- Take up to $1 due deliveries for one attempt each, under claim $2: the attempt is counted,
-- and the row is not due again until the claim's lease ($3 seconds) has passed, so a relay
-- that dies mid-attempt leaves it for another. SKIP LOCKED: concurrent relays each take other
-- rows instead of queueing on the same ones. The row locks last only for this statement, never
-- across the POST. With the tenant's signing secrets: the current one first, then those
-- retired less than $4 seconds ago (a rotation's grace period).
UPDATE webhook_deliveries d
SET attempts = d.attempts + 1, claim = $2, next_attempt_at = now() + make_interval(secs => $3)
FROM (
    SELECT delivery_id FROM webhook_deliveries
    WHERE state = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
) due
WHERE d.delivery_id = due.delivery_id
RETURNING d.delivery_id, d.stream, d.tenant, d.event, d.position, d.url, d.body, d.attempts,
          coalesce((SELECT array_agg(s.secret ORDER BY s.retired_at DESC NULLS FIRST)
                    FROM webhook_secrets s
                    WHERE s.tenant = d.tenant
                      AND (s.retired_at IS NULL
                           OR s.retired_at > now() - make_interval(secs => $4))),
                   '{}') AS secrets;

-- name: webhook_next_due
-- Seconds until the next pending delivery is due (negative: overdue); NULL when none is pending.
SELECT extract(epoch FROM min(next_attempt_at) - now())::float8
FROM webhook_deliveries WHERE state = 'pending';

-- name: lock_webhook_stream
-- Writers of one webhook stream (a job's or a model's deliveries) take turns. Taken before the transaction writes anything
-- (so before it has an xid): the stream's head was then always written by an older transaction,
-- as the event store's ordering rule requires, and the next version is never taken meanwhile.
SELECT pg_advisory_xact_lock(hashtextextended('trainyard.webhook-stream:' || $1, 0));

-- name: finish_webhook_attempt
-- Record an attempt's outcome, only under the claim it was made with: nothing comes back when
-- the claim lapsed and another relay claimed the delivery since. State $3; for 'pending', the
-- next attempt is due at $4.
UPDATE webhook_deliveries
SET state = $3, next_attempt_at = coalesce($4, next_attempt_at), claim = NULL,
    last_status = $5, last_error = $6,
    finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE $7::timestamptz END
WHERE delivery_id = $1 AND claim = $2
RETURNING attempts;

-- name: lock_webhook_secrets
-- Rotations of one tenant's webhook secret take turns (each retires what the one before issued).
SELECT pg_advisory_xact_lock(hashtextextended('trainyard.webhook-secret:' || $1, 0));

-- name: has_webhook_secret
SELECT EXISTS (SELECT 1 FROM webhook_secrets WHERE tenant = $1 AND retired_at IS NULL);

-- name: retire_webhook_secret
-- Nothing comes back when the tenant had no current secret.
UPDATE webhook_secrets SET retired_at = $2 WHERE tenant = $1 AND retired_at IS NULL
RETURNING secret_id;

-- name: insert_webhook_secret
INSERT INTO webhook_secrets (secret_id, tenant, secret, created_at) VALUES ($1, $2, $3, $4);

-- name: webhook_signing_secrets
-- A tenant's secrets that deliveries are signed with: the current one first, then those
-- retired less than $2 seconds ago.
SELECT secret_id, secret, created_at, retired_at FROM webhook_secrets
WHERE tenant = $1 AND (retired_at IS NULL OR retired_at > now() - make_interval(secs => $2))
ORDER BY retired_at DESC NULLS FIRST;
