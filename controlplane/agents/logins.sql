-- Agent logins' nodes (migrations/0032_agent_node_scope.sql): which node each login works for.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: bind_agent_login
-- The login's node, set or moved: its sessions reach that node's work from their next
-- statement on (the policies read the binding each statement), and no other node's.
INSERT INTO agent_logins (login, node) VALUES ($1, $2)
ON CONFLICT (login) DO UPDATE SET node = excluded.node, bound_at = now();

-- name: agent_login_node
SELECT node FROM agent_logins WHERE login = $1;

-- name: is_agent_login
-- A login of the agent role, and no superuser (whom no binding would confine anyway).
SELECT EXISTS (SELECT 1 FROM pg_roles r
               WHERE r.rolname = $1 AND r.rolcanlogin AND NOT r.rolsuper
                 AND pg_has_role(r.oid, 'trainyard_agent', 'MEMBER'));

-- name: session_login_node
-- The node the session's login works for, as the policies see it (NULL: none).
SELECT agent_node();
