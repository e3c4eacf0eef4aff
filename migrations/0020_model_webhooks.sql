-- Models' webhooks: a model's events (a version published, updated or deprecated, an alias
-- set or removed) are notified to the URL its tenant set (ModelWebhookSet), through the same
-- outbox, relay, signing and retries as a job's.

-- A delivery notifies an event of a job or of a model; `stream` is the stream its attempts'
-- events go to (webhook-<job_id>, or webhook-model-<tenant>.<name>), named by the outbox.
ALTER TABLE webhook_deliveries ADD COLUMN stream text;
UPDATE webhook_deliveries SET stream = 'webhook-' || job_id;
ALTER TABLE webhook_deliveries ALTER COLUMN stream SET NOT NULL;
ALTER TABLE webhook_deliveries ALTER COLUMN job_id DROP NOT NULL;

-- Attempts at a model's notifications as well as a job's: job_id is NULL for a model's, and
-- the new last column names the model. The tenant comes from the notified stream's first event
-- (a job's submission, a model's first publication: both record it).
CREATE OR REPLACE VIEW audit.webhook_attempts AS
SELECT CASE WHEN e.stream_id NOT LIKE 'webhook-model-%'
            THEN substr(e.stream_id, length('webhook-') + 1)::uuid END AS job_id,
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
       e.position,
       CASE WHEN e.stream_id LIKE 'webhook-model-%'
            THEN (s.data ->> 'tenant') || '/' || (s.data ->> 'name') END AS model
FROM public.events e
JOIN public.events s
    ON s.stream_id = CASE WHEN e.stream_id LIKE 'webhook-model-%'
                          THEN substr(e.stream_id, length('webhook-') + 1)
                          ELSE 'job-' || substr(e.stream_id, length('webhook-') + 1) END
   AND s.stream_version = 1
WHERE e.stream_id LIKE 'webhook-%'
  AND e.type IN ('WebhookDelivered', 'WebhookAttemptFailed', 'WebhookFailed');

COMMENT ON VIEW audit.webhook_attempts IS
    'Every attempt to deliver a notification to a webhook: a job''s (JobRestarted, JobFailed, '
    'JobCompleted, to its webhook_url) or a model''s (its versions'' and aliases'' events, to '
    'the URL its tenant set): WebhookDelivered, WebhookAttemptFailed (retried later) and '
    'WebhookFailed (the last attempt; given up). The URL is not shown: it may carry a '
    'receiver''s credentials.';
COMMENT ON COLUMN audit.webhook_attempts.job_id IS 'The job notified about; NULL for a model.';
COMMENT ON COLUMN audit.webhook_attempts.tenant IS 'The job''s or the model''s tenant.';
COMMENT ON COLUMN audit.webhook_attempts.job_event IS
    'The event notified: JobRestarted, JobFailed or JobCompleted; for a model, '
    'ModelVersionPublished, ModelMetadataUpdated, ModelAliasSet, ModelAliasRemoved or '
    'ModelVersionDeprecated.';
COMMENT ON COLUMN audit.webhook_attempts.model IS
    'The model notified about, as tenant/name; NULL for a job.';

-- Setting and removing a model's webhook are commands a person gave.
CREATE OR REPLACE VIEW audit.actions AS
SELECT (e.data ->> 'at')::timestamptz AS at,
       e.metadata ->> 'actor' AS actor,
       CASE
           -- A job's tenant is named by its submission, the stream's first event.
           WHEN e.stream_id LIKE 'job-%' THEN s.data ->> 'tenant'
           WHEN e.stream_id LIKE 'tenant-%' THEN substr(e.stream_id, length('tenant-') + 1)
           -- model-<tenant>.<name>: tenant names hold no '.'.
           WHEN e.stream_id LIKE 'model-%'
               THEN split_part(substr(e.stream_id, length('model-') + 1), '.', 1)
       END AS tenant,
       CASE e.type
           WHEN 'JobSubmitted' THEN 'submit'
           WHEN 'JobCancelled' THEN 'cancel'
           WHEN 'CheckpointRequested' THEN 'checkpoint_request'
           WHEN 'TenantCreated' THEN 'tenant_create'
           WHEN 'TenantUpdated' THEN 'tenant_update'
           WHEN 'TenantLimitsSet' THEN 'tenant_limits_set'
           WHEN 'TokenIssued' THEN 'token_issue'
           WHEN 'TokenRevoked' THEN 'token_revoke'
           WHEN 'AdminTokenIssued' THEN 'admin_token_issue'
           WHEN 'ModelVersionPublished' THEN 'model_publish'
           WHEN 'ModelMetadataUpdated' THEN 'model_update'
           WHEN 'ModelAliasSet' THEN 'model_alias_set'
           WHEN 'ModelAliasRemoved' THEN 'model_alias_remove'
           WHEN 'ModelVersionDeprecated' THEN 'model_deprecate'
           WHEN 'ModelWebhookSet' THEN 'model_webhook_set'
           WHEN 'ModelWebhookRemoved' THEN 'model_webhook_remove'
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
                 'TenantUpdated', 'TenantLimitsSet', 'TokenIssued', 'TokenRevoked',
                 'AdminTokenIssued', 'ModelVersionPublished', 'ModelMetadataUpdated',
                 'ModelAliasSet', 'ModelAliasRemoved', 'ModelVersionDeprecated',
                 'ModelWebhookSet', 'ModelWebhookRemoved');

COMMENT ON COLUMN audit.actions.action IS
    'submit, cancel, checkpoint_request, tenant_create, tenant_update, tenant_limits_set, '
    'token_issue, token_revoke, admin_token_issue, model_publish, model_update, '
    'model_alias_set, model_alias_remove, model_deprecate, model_webhook_set or '
    'model_webhook_remove.';
