-- A job's `learners_per_node` (torchrun's nproc_per_node), derived from its manifest (so a
-- projection rebuild keeps it right) for the claim: a node takes exactly that many of the job's
-- learners or none (agents/queries.sql: claim_candidates). NULL: the manifest has none (every
-- job submitted before it existed too), and a node takes as many as fit, as before.
ALTER TABLE job_status ADD COLUMN learners_per_node integer GENERATED ALWAYS AS
    ((doc -> 'manifest' ->> 'learners_per_node')::integer) STORED;
