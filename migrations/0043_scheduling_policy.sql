-- The claim policy an operator chose (`trainyard scheduling set-policy FILE`): the order claims
-- take queued jobs in (fair_share, priority or fifo) and whether tenants' GPU quotas hold. The
-- `scheduling` projection keeps this one row from the scheduling stream's SchedulingPolicySet
-- events; no row (none set yet, or a rebuild under way) means the default, fair share within
-- quotas. Claims read it inside their own statement (`claim_candidates`), so a switch holds
-- from the next claim on, and the simulator replays the same policy value
-- (controlplane/scheduling/claim_order.py).
CREATE TABLE scheduling_policy (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    claim_order text NOT NULL CHECK (claim_order IN ('fair_share', 'priority', 'fifo')),
    quotas      boolean NOT NULL,
    set_by      text NOT NULL,
    set_at      timestamptz NOT NULL,
    reason      text
);
GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON scheduling_policy TO trainyard_app;
-- AGENT RIGHTS: claims read the policy.
GRANT SELECT ON scheduling_policy TO trainyard_agent;

-- Under fifo, a claim takes each tenant's queued jobs by submission time alone: one short scan
-- of this index per tenant, as job_status_tenant_queue serves the other orders (0008).
CREATE INDEX job_status_tenant_fifo ON job_status (tenant, submitted_at, job_id)
    WHERE state = 'QUEUED';

-- An operator's switch of the claim policy is a command a person gave, as a drain is: the
-- auditor finds it in audit.actions (`scheduling_policy_set`, with its reason).
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
           WHEN 'NodeDrained' THEN 'node_drain'
           WHEN 'NodeUndrained' THEN 'node_undrain'
           WHEN 'SchedulingPolicySet' THEN 'scheduling_policy_set'
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
       e.recorded_at,
       CASE WHEN e.stream_id LIKE 'node-%' THEN substr(e.stream_id, length('node-') + 1) END
           AS node
FROM public.events e
LEFT JOIN public.events s
    ON s.stream_id = e.stream_id AND s.stream_version = 1 AND e.stream_id LIKE 'job-%'
WHERE e.type IN ('JobSubmitted', 'JobCancelled', 'CheckpointRequested', 'TenantCreated',
                 'TenantUpdated', 'TenantLimitsSet', 'TokenIssued', 'TokenRevoked',
                 'AdminTokenIssued', 'ModelVersionPublished', 'ModelMetadataUpdated',
                 'ModelAliasSet', 'ModelAliasRemoved', 'ModelVersionDeprecated',
                 'ModelWebhookSet', 'ModelWebhookRemoved', 'NodeDrained', 'NodeUndrained',
                 'SchedulingPolicySet');

COMMENT ON COLUMN audit.actions.action IS
    'submit, cancel, checkpoint_request, tenant_create, tenant_update, tenant_limits_set, '
    'token_issue, token_revoke, admin_token_issue, model_publish, model_update, '
    'model_alias_set, model_alias_remove, model_deprecate, model_webhook_set, '
    'model_webhook_remove, node_drain, node_undrain or scheduling_policy_set.';
