-- Canaries (controlplane/deployments/canary.py): another version of a deployment's model beside
-- its own, on replicas of its own, taking `canary_weight`% of its requests. The projection keeps
-- which of its replica jobs are the canary's (`canary_jobs`, also in `replica_jobs`, so that a
-- deleted deployment's reconcile still finds them) and the canary's version.
ALTER TABLE deployments
    ADD COLUMN canary_version integer,
    ADD COLUMN canary_weight  integer CHECK (canary_weight BETWEEN 0 AND 100),
    ADD COLUMN canary_jobs    uuid[] NOT NULL DEFAULT '{}';

-- The model version a task was sent to, chosen by the canary's weight at the API: only that
-- version's replicas claim it (claim_tasks). NULL: the deployment's own version (tasks queued
-- before canaries, and a pipeline's, which follow each step's own version).
ALTER TABLE serving_tasks ADD COLUMN version integer;

-- The canary's rollback rule (canary.Rollback; NULL: only by command) and when it started: its
-- error rate counts only its own requests, not an earlier canary's of the same version.
ALTER TABLE deployments
    ADD COLUMN canary_rollback   jsonb,
    ADD COLUMN canary_started_at timestamptz;

-- The model versions a replica's claims take (claim_tasks): the deployment's own, and the one
-- the replica serves (the canary's, for a canary replica; NULL for one retired, which takes
-- nothing: the old version's replicas, being stopped after a promotion, must not run the new
-- version's tasks). No row: the deployment's row is not there yet (its projection lags), and
-- the claim takes any of its tasks, as before canaries.
-- SECURITY DEFINER: an agent reads no deployments row; it learns only these two numbers, and
-- only for a replica running on its node.
CREATE FUNCTION replica_version(p_tenant text, p_deployment text, p_replica uuid)
RETURNS TABLE (own integer, mine integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT d.version,
           CASE WHEN p_replica = ANY (d.canary_jobs) THEN d.canary_version
                WHEN p_replica = ANY (d.replica_jobs) THEN d.version END
    FROM deployments d
    WHERE d.tenant = p_tenant AND d.name = p_deployment
      AND (agent_unconfined() OR p_replica IN (SELECT agent_live_jobs()))
$$;
REVOKE ALL ON FUNCTION replica_version(text, text, uuid) FROM PUBLIC;
-- AGENT RIGHTS: claims call it.
GRANT EXECUTE ON FUNCTION replica_version(text, text, uuid) TO trainyard_agent, trainyard_app;
