-- Warm uids (migration 0047): learner uids a node holds for sandboxes it makes before their
-- jobs are known, each under a placeholder until the job that gets the sandbox adopts it. Only
-- through the definer functions, each for the session's own node: agents have no right on
-- warm_uids or learner_uids.

-- name: hold_warm_uid
-- A fresh placeholder holding a free uid of the $3 uids from $2, as node $1's warm uid: no row
-- when every uid is held. The claims' own search, so no job is given it while it is held.
SELECT placeholder, uid FROM hold_warm_uid($1, $2, $3);

-- name: adopt_warm_uid
-- Job $1 takes the uid of node $2's warm placeholder $3 as its own, and its claim's unused uid
-- goes back; NULL, nothing changed, unless no node has recorded folders of the job, its live
-- learners are all on $2 and its uid is not an adopted one (see the function for why each).
-- Adopted, $2's folders of the job (its checkpoint folder's job $4) are recorded under that uid
-- in the same statement, as `record_job_folders` would next: a warm start pays one round trip
-- for both, and the check on recorded folders is the function's, before this insert.
WITH adopted AS (SELECT adopt_warm_uid($1, $2, $3) AS uid),
recorded AS (
    INSERT INTO job_folders (job_id, node, uid, checkpoints)
    SELECT $1, $2, uid, $4 FROM adopted WHERE uid IS NOT NULL
    ON CONFLICT (job_id, node) DO NOTHING
)
SELECT uid FROM adopted;

-- name: release_warm_uids
-- Node $1's warm uids back to the range: those of placeholders $2, or every one of the node's
-- when $2 is NULL (the agent starting again: its earlier sandboxes are gone); how many.
SELECT release_warm_uids($1, $2);

-- name: release_lost_node_warm_uids
-- Node $1 was declared LOST: its warm sandboxes are gone, or removed as its agent finds itself
-- fenced (they hold nothing: no job, no file, no secret), so their uids go back now, not when
-- (if ever) an agent of that name starts again.
SELECT release_warm_uids($1, NULL);
