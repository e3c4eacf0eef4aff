-- How a node's agent numbers jobs' address blocks (`--job-network` and the first of
-- TRAINYARD_LEARNER_UIDS), recorded with each registration beside its address: a job's nodes
-- link its learners across them only when all of them plan alike, since a node that planned
-- otherwise would give the job another job's addresses (node_agent/job_links.py). NULL: an
-- agent from before this was recorded, which links with no one.
ALTER TABLE nodes ADD COLUMN job_plan text;

-- AGENT RIGHTS: as for `address` (0041), its own node's row only, by the row's policies.
GRANT UPDATE (job_plan) ON nodes TO trainyard_agent;
