-- The direct path of a synchronous prediction (controlplane/deployments/direct.py): each replica
-- an agent offers on its serving channel (node_agent/serving_channel.py), with the channel's
-- address and the bearer token it takes (a fresh one each time the agent starts). The control
-- plane reads them to reach the replicas through their agents; no API shows them to a tenant.
-- An agent writes, reads and withdraws its own node's rows only, for its own live replicas:
-- no agent learns another node's token.
CREATE TABLE serving_channels (
    replica     uuid PRIMARY KEY,
    tenant      text NOT NULL,
    deployment  text NOT NULL,
    node        text NOT NULL,
    address     text NOT NULL,
    token       text NOT NULL,
    offered_at  timestamptz NOT NULL
);
-- The control plane's route to a deployment: its replicas' channels.
CREATE INDEX serving_channels_deployment ON serving_channels (tenant, deployment);

GRANT SELECT, DELETE ON serving_channels TO trainyard_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON serving_channels TO trainyard_agent;

ALTER TABLE serving_channels ENABLE ROW LEVEL SECURITY;
CREATE POLICY serving_channels_app ON serving_channels TO trainyard_app
    USING (true) WITH CHECK (true);
CREATE POLICY serving_channels_agent ON serving_channels TO trainyard_agent
    USING ((SELECT agent_unconfined()) OR node = (SELECT agent_node()))
    WITH CHECK ((SELECT agent_unconfined())
                OR (node = (SELECT agent_node()) AND replica IN (SELECT agent_live_jobs())));
