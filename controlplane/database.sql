-- Statements about the database itself: is it there, is it up, how a statement is planned.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: ping
SELECT 1;

-- name: database_exists
SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1);

-- name: plan_per_call
-- For a transaction whose statement is best planned for its values (sessions plan generically).
SET LOCAL plan_cache_mode = force_custom_plan;

-- name: session_settings
-- What a session runs as and plans with: a session through pgBouncer gets them from its login
-- (ALTER ROLE ... SET), and the agent checks that it did before it works through one.
SELECT current_user::text AS role, current_setting('jit') AS jit,
       current_setting('plan_cache_mode') AS plan_cache_mode;
