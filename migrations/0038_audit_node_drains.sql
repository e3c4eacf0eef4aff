-- An operator's drain and undrain of a node are commands a person gave, as a cancel is: the
-- auditor finds them in audit.actions, with the node they named (a new column at the end, as
-- CREATE OR REPLACE VIEW allows; NULL for every other action, whose stream is not a node's).
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
                 'ModelWebhookSet', 'ModelWebhookRemoved', 'NodeDrained', 'NodeUndrained');

COMMENT ON COLUMN audit.actions.action IS
    'submit, cancel, checkpoint_request, tenant_create, tenant_update, tenant_limits_set, '
    'token_issue, token_revoke, admin_token_issue, model_publish, model_update, '
    'model_alias_set, model_alias_remove, model_deprecate, model_webhook_set, '
    'model_webhook_remove, node_drain or node_undrain.';
COMMENT ON COLUMN audit.actions.node IS
    'The node a node_drain or node_undrain named; NULL for every other action.';
