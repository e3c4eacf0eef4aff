-- The node agents' role: only what claims, heartbeats, log shipping and the agents' own events
-- need. An agent runs on a machine that also runs tenants' code; a compromised node must not
-- become the whole service, so this role has no rights on tokens, webhook secrets or tenants'
-- events, and may append only the agents' event types to job and node streams.
--
-- Agents log in as a role that is a member of this one only (`trainyard agent-login create`),
-- and their sessions SET ROLE to it. To give agents a new table or event type, add one line to
-- the lists marked "AGENT RIGHTS" below in a new migration (and to AGENT_RIGHTS in
-- tests/test_agent_role.py, which checks them).
DO $$
BEGIN
    CREATE ROLE trainyard_agent NOLOGIN;
EXCEPTION
    -- Roles are cluster-wide; another database of the same cluster may have created it.
    WHEN duplicate_object THEN NULL;
END
$$;

GRANT USAGE ON SCHEMA public TO trainyard_agent;
-- The owner's own agents (tests, `trainyard up`, the embedded database) SET ROLE to it.
GRANT trainyard_agent TO CURRENT_USER;

-- AGENT RIGHTS: tables. One GRANT a table; nothing on api_tokens, webhook_secrets,
-- webhook_deliveries, projection_checkpoints or the audit schema.
-- `agent` checks that the database is migrated before it starts.
GRANT SELECT ON schema_migrations TO trainyard_agent;
-- Heartbeats and registration: the node's lease and inventory.
GRANT SELECT, INSERT, UPDATE ON nodes TO trainyard_agent;
GRANT SELECT, INSERT, UPDATE, DELETE ON node_gpus TO trainyard_agent;
-- Claims: the queue (a projection, locked FOR UPDATE but never changed: see the policy below),
-- tenants' weights and quotas, room on the nodes, and the claim's allocations and epoch.
GRANT SELECT ON job_status, tenants, node_capacity TO trainyard_agent;
GRANT SELECT, INSERT, UPDATE ON allocations TO trainyard_agent;
GRANT SELECT, INSERT, DELETE ON allocated_gpus TO trainyard_agent;
GRANT USAGE ON SEQUENCE claim_epochs TO trainyard_agent;
-- Log shipping: lines are only added (COPY); the heads and series number them gap-free.
GRANT INSERT ON job_logs TO trainyard_agent;
GRANT SELECT, INSERT, UPDATE ON job_log_heads, job_log_series TO trainyard_agent;
-- Events: read (claims, reconciling, cancel and checkpoint requests) and appended, both only
-- within the policies below. Appends take positions from the identity column, which needs no
-- grant of its own; the append's NOTIFY and the listener's LISTEN need none either.
GRANT SELECT, INSERT ON events TO trainyard_agent;

-- SELECT ... FOR UPDATE (the claim's lock on its queue rows) needs UPDATE on some column; the
-- policy below refuses every actual update by an agent, so the grant only lets it lock.
GRANT UPDATE (not_before) ON job_status TO trainyard_agent;
ALTER TABLE job_status ENABLE ROW LEVEL SECURITY;
-- The table's owner is not subject to policies (no FORCE); the application sees every row.
CREATE POLICY job_status_app ON job_status TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY job_status_agent_read ON job_status FOR SELECT TO trainyard_agent USING (true);
CREATE POLICY job_status_agent_lock ON job_status FOR UPDATE TO trainyard_agent
    USING (true) WITH CHECK (false);

-- AGENT RIGHTS: event types. The (stream category, event type) pairs an agent may append:
-- one row each. Streams are `<category>-<id>` (controlplane/events/store.py).
CREATE TABLE agent_event_types (
    category text NOT NULL,
    type     text NOT NULL,
    PRIMARY KEY (category, type)
);
INSERT INTO agent_event_types (category, type) VALUES
    ('job', 'JobDeploying'),
    ('job', 'JobDownloading'),
    ('job', 'JobProcessing'),
    ('job', 'JobStoring'),
    ('job', 'JobCompleted'),
    ('job', 'JobFailed'),
    ('job', 'JobRestarted'),
    ('job', 'LearnersReachedPhase'),
    ('job', 'LearnersExited'),
    ('job', 'DeploymentRolledBack'),
    ('job', 'CheckpointSaved'),
    ('node', 'NodeRegistered'),
    ('node', 'NodeGpuUnhealthy'),
    ('node', 'NodeDeregistered');
-- The policy's subquery runs with the agent's rights; only the owner changes the list.
GRANT SELECT ON agent_event_types TO trainyard_agent;
GRANT SELECT ON agent_event_types TO trainyard_app;

ALTER TABLE events ENABLE ROW LEVEL SECURITY;
-- The application reads and appends everything (the trigger still refuses changes).
CREATE POLICY events_app ON events TO trainyard_app USING (true) WITH CHECK (true);
-- Agents read job and node streams only: tenants' and webhooks' streams are none of theirs.
CREATE POLICY events_agent_read ON events FOR SELECT TO trainyard_agent
    USING (split_part(stream_id, '-', 1) IN ('job', 'node'));
-- Agents append only their own event types, each to its category's streams (not, e.g., a
-- JobSubmitted or a TokenIssued). A refused row fails the whole append: the caller's
-- transaction rolls back and the gap-free log sees nothing of it.
CREATE POLICY events_agent_append ON events FOR INSERT TO trainyard_agent
    WITH CHECK ((split_part(stream_id, '-', 1), type)
                IN (SELECT category, type FROM agent_event_types));
