-- Sign-in through an OpenID Connect provider (controlplane/identity, docs/sign-in.md). Not
-- events, like ui_sessions (0025): a session is a short-lived credential derived from the
-- provider's tokens, not a fact about jobs, tenants or models.

-- A person signed in through the provider: the dashboard's cookie (kind 'browser') or the
-- bearer token `trainyard login` saved (kind 'cli'). Only the credential's sha256 is stored.
CREATE TABLE identity_sessions (
    session_sha256 text PRIMARY KEY,
    kind           text NOT NULL CHECK (kind IN ('browser', 'cli')),
    subject        text NOT NULL,
    email          text,
    -- Who the provider's groups mapped to when last checked: a tenant, or the admin.
    tenant         text,
    is_admin       boolean NOT NULL,
    csrf           text,
    -- The provider's refresh token: used at every check, which ends the session when the
    -- provider refuses it (revoked, expired, the person's groups no longer mapped).
    refresh_token  text,
    -- Until when the provider vouches for the person without another check (its token's
    -- expiry); a check is due after checked_at + the configured interval.
    provider_expires_at timestamptz NOT NULL,
    checked_at     timestamptz NOT NULL DEFAULT now(),
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    ended_at       timestamptz,
    end_reason     text,
    -- A `trainyard login --sso` through the loopback redirect, not yet collected: the row's
    -- hash is the one-time code's, and it becomes a session only for the CLI that proves the
    -- PKCE verifier of this S256 challenge (within two minutes).
    handoff_challenge text,
    CHECK ((tenant IS NULL) = is_admin)
);
CREATE INDEX identity_sessions_expires ON identity_sessions (expires_at);

-- A browser's sign-in between the redirect to the provider and its return: the PKCE verifier
-- and the nonce never leave the server; `binding_sha256` is the hash of a cookie of the browser
-- that started it, so that a callback carried to another browser signs no one in.
CREATE TABLE identity_logins (
    state          text PRIMARY KEY,
    binding_sha256 text NOT NULL,
    verifier       text NOT NULL,
    nonce          text NOT NULL,
    -- For `trainyard login --sso` without a device flow: its loopback address and challenge.
    cli_redirect   text,
    cli_challenge  text,
    expires_at     timestamptz NOT NULL
);

GRANT SELECT, INSERT, UPDATE, DELETE ON identity_sessions, identity_logins TO trainyard_app;
