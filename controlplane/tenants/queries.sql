-- Tenants' statements: the `tenants` projection, tokens, limits.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: insert_tenant
-- The `tenants` projection: one row per tenant.
INSERT INTO tenants (name, weight, gpu_quota, created_at) VALUES ($1, $2, $3, $4);

-- name: update_tenant
-- The `tenants` projection: a tenant's new weight and quota.
UPDATE tenants SET weight = $2, gpu_quota = $3 WHERE name = $1;

-- name: insert_api_token
-- The `tenants` projection: a token by the sha256 of its text (the text is never stored).
INSERT INTO api_tokens (token_sha256, token_id, tenant, is_admin, issued_at)
VALUES ($1, $2, $3, $4, $5);

-- name: revoke_api_token
UPDATE api_tokens SET revoked_at = $2 WHERE token_id = $1 AND revoked_at IS NULL;

-- name: authenticate_token
-- Who holds a live token, by the token's sha256; a revoked token authenticates no one.
SELECT tenant, is_admin FROM api_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL;

-- name: authenticate_tokens
-- The live tokens among those a process trusts (by sha256), read again in one statement every
-- quarter second (principals.REFRESH_S) so that a request with a known token never waits for
-- its lookup; a revoked one is missing from the answer.
SELECT token_sha256, tenant, is_admin FROM api_tokens
WHERE token_sha256 = ANY($1::text[]) AND revoked_at IS NULL;

-- name: list_tenants
-- Every tenant (or only the one named $1) with the ids of its live tokens, oldest first.
SELECT t.name, t.weight, t.gpu_quota, t.created_at,
       -- As text: the code's model reads it (NULL, never set: its defaults).
       coalesce(t.limits, '{}')::text AS limits,
       coalesce(array_agg(k.token_id ORDER BY k.issued_at, k.token_id)
                FILTER (WHERE k.token_id IS NOT NULL), '{}') AS active_tokens
FROM tenants t
LEFT JOIN api_tokens k ON k.tenant = t.name AND k.revoked_at IS NULL
WHERE $1::text IS NULL OR t.name = $1
GROUP BY t.name
ORDER BY t.name;

-- name: set_tenant_limits
-- The `tenants` projection: a tenant's limits from now on (TenantLimitsSet).
UPDATE tenants SET limits = $2::jsonb WHERE name = $1;

-- name: tenant_limits
-- A tenant's limits (as text; '{}': the defaults), for SSE streams; no row: no tenant.
SELECT coalesce(limits, '{}')::text FROM tenants WHERE name = $1;
