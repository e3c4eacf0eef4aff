-- audit.jobs shows how a job's learners are spread over its nodes (issue 34's torchrun-style
-- placement, `learners_per_node`): an auditor reading why a job of 4 learners ran on 2 nodes
-- sees what it asked for. The view as 0010 made it, and the new column last (CREATE OR REPLACE
-- keeps the columns before it as they are).
CREATE OR REPLACE VIEW audit.jobs AS
WITH latest AS (
    SELECT DISTINCT ON (job_id) job_id, to_state, attempt, at, reason
    FROM audit.job_transitions
    ORDER BY job_id, stream_version DESC
)
SELECT l.job_id,
       s.data ->> 'tenant' AS tenant,
       s.data -> 'manifest' ->> 'name' AS name,
       (s.data ->> 'at')::timestamptz AS submitted_at,
       s.metadata ->> 'actor' AS submitted_by,
       (s.data -> 'manifest' ->> 'learners')::integer AS learners,
       (s.data -> 'manifest' ->> 'gpus_per_learner')::integer AS gpus_per_learner,
       l.to_state AS state,
       l.attempt,
       l.attempt - 1 AS restarts,
       l.at AS state_since,
       l.reason,
       (s.data -> 'manifest' ->> 'learners_per_node')::integer AS learners_per_node
FROM latest l
JOIN public.events s ON s.stream_id = 'job-' || l.job_id AND s.stream_version = 1;

COMMENT ON COLUMN audit.jobs.learners_per_node IS
    'Learners on each of its nodes, from its manifest (NULL: as many a node as fit).';
