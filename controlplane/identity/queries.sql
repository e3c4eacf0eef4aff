-- Sessions opened by a sign-in through the OpenID Connect provider (controlplane/identity).

-- name: identity_tenant_exists
SELECT EXISTS (SELECT 1 FROM tenants WHERE name = $1);

-- name: identity_start_login
-- A browser's sign-in on its way to the provider; those older than their expiry go meanwhile.
WITH gone AS (DELETE FROM identity_logins WHERE expires_at < now())
INSERT INTO identity_logins (state, binding_sha256, verifier, nonce, expires_at, cli_redirect,
                             cli_challenge)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5), $6, $7);

-- name: identity_take_login
-- The sign-in a callback's state names, once (a replayed callback finds nothing), only for the
-- browser that started it and before it expired.
DELETE FROM identity_logins
WHERE state = $1 AND binding_sha256 = $2 AND expires_at > now()
RETURNING verifier, nonce, cli_redirect, cli_challenge;

-- name: identity_open_session
-- Sessions that expired or ended a day ago go at the same time (no sweeper needed).
WITH gone AS (
    DELETE FROM identity_sessions
    WHERE coalesce(ended_at, expires_at) < now() - interval '1 day'
)
INSERT INTO identity_sessions (session_sha256, kind, subject, email, tenant, is_admin, csrf,
                               refresh_token, provider_expires_at, expires_at, handoff_challenge)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + make_interval(secs => $10), $11)
RETURNING expires_at;

-- name: identity_session
-- A live session of kind $2, and whether its check with the provider is due (after $3 seconds,
-- or once the provider's token has expired).
SELECT tenant, is_admin, csrf, expires_at,
       checked_at + make_interval(secs => $3) <= now() OR provider_expires_at <= now() AS due
FROM identity_sessions
WHERE session_sha256 = $1 AND kind = $2 AND ended_at IS NULL AND expires_at > now()
  AND handoff_challenge IS NULL;

-- name: identity_lock_session
-- The session to check, locked: one replica, one request checks it at a time (a refresh token
-- the provider rotates is good once).
SELECT tenant, is_admin, csrf, expires_at, refresh_token, provider_expires_at <= now() AS lapsed,
       checked_at + make_interval(secs => $2) <= now() OR provider_expires_at <= now() AS due
FROM identity_sessions
WHERE session_sha256 = $1 AND ended_at IS NULL AND expires_at > now()
  AND handoff_challenge IS NULL
FOR UPDATE;

-- name: identity_checked
UPDATE identity_sessions
SET tenant = $2, is_admin = $3, refresh_token = $4, provider_expires_at = $5, checked_at = now()
WHERE session_sha256 = $1;

-- name: identity_check_failed
-- The provider could not be asked: the session lives on until its token expires, and is
-- checked again after the interval, not at every request.
UPDATE identity_sessions SET checked_at = now() WHERE session_sha256 = $1;

-- name: identity_end_session
-- The refresh token is forgotten with the session: only a sign-out revokes it at the provider
-- (it is returned for that), and an ended session has no use for it.
-- (RETURNING names the row as it was: an UPDATE's own RETURNING sees the NULL it wrote.)
UPDATE identity_sessions s SET ended_at = now(), end_reason = $2, refresh_token = NULL
FROM (
    SELECT session_sha256, refresh_token FROM identity_sessions
    WHERE session_sha256 = $1 AND ended_at IS NULL
    FOR UPDATE
) was
WHERE s.session_sha256 = was.session_sha256
RETURNING was.refresh_token;

-- name: identity_collect_handoff
-- The loopback sign-in's one-time code $1 becomes the session $2 for the CLI whose verifier
-- hashes to the challenge $3, within two minutes; a second try finds nothing.
UPDATE identity_sessions
SET session_sha256 = $2, handoff_challenge = NULL, expires_at = now() + make_interval(secs => $4)
WHERE session_sha256 = $1 AND handoff_challenge = $3 AND ended_at IS NULL
  AND created_at > now() - interval '2 minutes'
RETURNING tenant, is_admin, expires_at;
