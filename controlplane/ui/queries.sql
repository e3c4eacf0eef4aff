-- The dashboard's sessions (controlplane/ui/sessions.py).

-- name: open_session
-- Sign-in: a session for the live token $2, if it is one; none for a revoked or unknown token.
-- Sessions that expired or ended a day ago go at the same time (no sweeper needed).
WITH gone AS (
    DELETE FROM ui_sessions
    WHERE coalesce(ended_at, expires_at) < now() - interval '1 day'
)
INSERT INTO ui_sessions (session_sha256, token_sha256, csrf, expires_at)
SELECT $1, t.token_sha256, $3, now() + make_interval(secs => $4)
FROM api_tokens t
WHERE t.token_sha256 = $2 AND t.revoked_at IS NULL
RETURNING expires_at;

-- name: session_principal
-- Who a session cookie stands for, and its CSRF token: only while the session has not expired
-- or ended and its token is not revoked.
SELECT t.tenant, t.is_admin, s.csrf, s.expires_at
FROM ui_sessions s
JOIN api_tokens t ON t.token_sha256 = s.token_sha256
WHERE s.session_sha256 = $1
  AND s.ended_at IS NULL
  AND s.expires_at > now()
  AND t.revoked_at IS NULL;

-- name: end_session
UPDATE ui_sessions SET ended_at = now() WHERE session_sha256 = $1 AND ended_at IS NULL;
