-- The admin now also sets a tenant's limits (TenantLimitsSet, 0016): audit.actions lists that
-- change too. The view keeps its columns, so its grants and column comments stay; only the
-- action column's comment gains the new word.

CREATE OR REPLACE VIEW audit.actions AS
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
           WHEN 'TenantUpdated' THEN 'tenant_update'
           WHEN 'TenantLimitsSet' THEN 'tenant_limits_set'
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
                 'TenantUpdated', 'TenantLimitsSet', 'TokenIssued', 'TokenRevoked',
                 'AdminTokenIssued');

COMMENT ON COLUMN audit.actions.action IS
    'submit, cancel, checkpoint_request, tenant_create, tenant_update, tenant_limits_set, '
    'token_issue, token_revoke or admin_token_issue.';
