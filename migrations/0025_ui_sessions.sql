-- The dashboard's sessions (controlplane/ui): a browser signs in with a bearer token once and
-- then sends an HttpOnly cookie, since EventSource cannot send an Authorization header. Not
-- events: a session is a short-lived credential derived from a token, not a fact about jobs,
-- tenants or models; it ends with its expiry, its sign-out or its token's revocation.

CREATE TABLE ui_sessions (
    -- The cookie's value is never stored: a leaked table gives no one a session.
    session_sha256 text PRIMARY KEY,
    -- The token it was opened with (api_tokens, a projection: no foreign key, so that a rebuild
    -- of the tenants projection keeps the sessions). A revoked token ends its sessions.
    token_sha256   text NOT NULL,
    csrf           text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    ended_at       timestamptz
);
-- Expired and ended sessions are deleted as sign-ins come.
CREATE INDEX ui_sessions_expires ON ui_sessions (expires_at);

GRANT SELECT, INSERT, UPDATE, DELETE ON ui_sessions TO trainyard_app;
