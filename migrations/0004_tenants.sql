-- Tenants and their bearer tokens: the read model that authenticates every request.

-- One row per tenant: its fair-share weight and its GPU quota (NULL: no quota).
CREATE TABLE tenants (
    name       text PRIMARY KEY,
    weight     double precision NOT NULL,
    gpu_quota  integer,
    created_at timestamptz NOT NULL
);

-- Every token ever issued, by the sha256 of its text (the text itself is never stored). A
-- tenant's token names its tenant; the admin's names none.
CREATE TABLE api_tokens (
    token_sha256 text PRIMARY KEY,
    token_id     text NOT NULL UNIQUE,
    tenant       text,
    is_admin     boolean NOT NULL,
    issued_at    timestamptz NOT NULL,
    revoked_at   timestamptz,
    CHECK ((tenant IS NULL) = is_admin)
);

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON tenants, api_tokens TO trainyard_app;
