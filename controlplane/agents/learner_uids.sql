-- Learner uids and job folders (migration 0031): which uid a job's learners run as, fleet-wide,
-- and the folders nodes keep for jobs until the jobs' retention ends.

-- name: allocate_learner_uid
-- The uid of job $1: the one it holds, or a free one of the $3 uids from $2 taken now (NULL
-- when every one is held). In a claim's transaction, so that a job is claimed with its uid or
-- not at all; as an agent starts learners, for a job claimed by a node that allocated none.
SELECT allocate_learner_uid($1, $2, $3);

-- name: record_job_folders
-- Node $2 is about to make folders for job $1 (owned by uid $3, NULL: the agent; the
-- checkpoint folder of job $4): committed first, so that no folder is ever left unrecorded,
-- and its uid is not given back while they exist. Once a node: an attempt after another
-- uses the same folders and the same uid.
INSERT INTO job_folders (job_id, node, uid, checkpoints) VALUES ($1, $2, $3, $4)
ON CONFLICT (job_id, node) DO NOTHING;

-- name: expire_job_folders
-- The lifecycle manager, each sweep: the folders of jobs that ended (final, so no attempt of
-- theirs starts again) more than $1 seconds ago, the log retention, are to go. Only folders
-- made before then can be (a job ends after its folders are made), which the partial index
-- finds without reading those of recent jobs.
UPDATE job_folders f SET expired = true
FROM job_status s
WHERE f.made_at < now() - make_interval(secs => $1) AND NOT f.expired
  AND s.job_id = f.job_id
  AND s.state IN ('COMPLETED', 'FAILED', 'CANCELLED')
  AND s.updated_at < now() - make_interval(secs => $1);

-- name: release_learner_uids
-- The lifecycle manager, each sweep: the uids of jobs that ended more than $1 seconds ago and
-- whose folders every node has removed go back to the range; how many went. A job whose
-- folders a node still holds (the node is down, say) keeps its uid until that node has swept.
WITH released AS (
    DELETE FROM learner_uids u USING job_status s
    WHERE u.allocated_at < now() - make_interval(secs => $1)
      AND s.job_id = u.job_id
      AND s.state IN ('COMPLETED', 'FAILED', 'CANCELLED')
      AND s.updated_at < now() - make_interval(secs => $1)
      AND NOT EXISTS (SELECT 1 FROM job_folders f WHERE f.job_id = u.job_id)
    RETURNING 1
)
SELECT count(*) FROM released;

-- name: expired_job_folders
-- Node $1's folders of jobs whose retention ended: whose they are, and whether the checkpoint
-- folder is still used by a job that has not expired (a later rung of the same search trial,
-- on any node: a shared checkpoint volume holds one folder for all of them).
SELECT f.job_id, f.uid, f.checkpoints,
       EXISTS (
           SELECT 1 FROM job_folders o WHERE o.checkpoints = f.checkpoints AND NOT o.expired
       ) AS checkpoints_used
FROM job_folders f
WHERE f.node = $1 AND f.expired
ORDER BY f.job_id;

-- name: forget_job_folders
-- Node $2 has removed (or handed back) job $1's folders.
DELETE FROM job_folders WHERE job_id = $1 AND node = $2;
