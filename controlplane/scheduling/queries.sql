-- The claim policy's row (`scheduling_policy`), kept by the `scheduling` projection. Claims read
-- it in their own statement (agents/queries.sql, `claim_candidates`). Loaded by
-- `controlplane.queries` with every other .sql file.

-- name: set_scheduling_policy
-- The `scheduling` projection: the policy from now on (order $1, quotas $2), set by $3 at $4,
-- with reason $5.
INSERT INTO scheduling_policy AS p (one, claim_order, quotas, set_by, set_at, reason)
VALUES (true, $1, $2, $3, $4, $5)
ON CONFLICT (one) DO UPDATE
SET claim_order = excluded.claim_order, quotas = excluded.quotas, set_by = excluded.set_by,
    set_at = excluded.set_at, reason = excluded.reason;

-- name: scheduling_policy
-- The policy in force: no row while none was set (the default holds).
SELECT claim_order, quotas, set_by, set_at, reason FROM scheduling_policy;
