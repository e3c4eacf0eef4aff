-- Model serving (controlplane/deployments/): deployments and pipelines are event-sourced
-- (`deployment-<tenant>.<name>`, `pipeline-<tenant>.<name>`) with these read models; tasks are
-- a queue table, claimed by node agents with FOR UPDATE SKIP LOCKED (the architecture's task
-- queue: DLHub's ZeroMQ queue), with the batches that ran them and the memoized results.

CREATE TABLE deployments (
    tenant           text NOT NULL,
    name             text NOT NULL,
    model_tenant     text NOT NULL,
    model_name       text NOT NULL,
    reference        text NOT NULL,
    version          integer NOT NULL,
    artifact_sha256  text NOT NULL,
    entry_point      text NOT NULL,
    -- The deployment's settings as created (resources, batching, memoization, timeouts).
    spec             jsonb NOT NULL,
    replicas         integer NOT NULL,
    -- The replica jobs that serve it now (started and not retired).
    replica_jobs     uuid[] NOT NULL,
    deleted          boolean NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant, name)
);
-- The lifecycle manager reconciles the deployments not deleted, and those deleted that still
-- have replicas to stop.
CREATE INDEX deployments_live ON deployments (tenant, name)
    WHERE NOT deleted OR cardinality(replica_jobs) > 0;

CREATE TABLE pipelines (
    tenant      text NOT NULL,
    name        text NOT NULL,
    steps       text[] NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, name)
);

CREATE TABLE serving_tasks (
    task_id       uuid PRIMARY KEY,
    tenant        text NOT NULL,
    -- The pipeline it runs, or NULL for one deployment's task.
    pipeline      text,
    -- The deployments it passes through, in order (one for a plain task), and where it is.
    steps         text[] NOT NULL CHECK (cardinality(steps) >= 1),
    step          integer NOT NULL DEFAULT 0,
    deployment    text NOT NULL,
    items         integer NOT NULL CHECK (items >= 1),
    -- The current step's input: the request's at the first step, then each step's output.
    input         jsonb NOT NULL,
    state         text NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed')),
    output        jsonb,
    error         text,
    memo          text NOT NULL CHECK (memo IN ('hit', 'miss', 'off')),
    -- sha256 of the model version and the input bytes, when the result is to be memoized.
    memo_key      bytea,
    -- The claim that runs it now: a fresh token each claim, so that a replica that lost it
    -- (timed out, requeued) cannot record a result (fencing).
    claim         uuid,
    replica       uuid,
    claimed_at    timestamptz,
    tries         integer NOT NULL DEFAULT 0,
    submitted_at  timestamptz NOT NULL,
    finished_at   timestamptz,
    -- One object per step run: deployment, replica, batch, invocation_ms, inference_ms.
    step_times    jsonb NOT NULL DEFAULT '[]'
);
-- What replicas claim: a deployment's queued tasks, oldest first.
CREATE INDEX serving_tasks_queued ON serving_tasks (tenant, deployment, submitted_at)
    WHERE state = 'queued';
-- What the lifecycle manager checks for replicas that stopped answering.
CREATE INDEX serving_tasks_running ON serving_tasks (claimed_at) WHERE state = 'running';
-- A deployment's figures over the tasks kept.
CREATE INDEX serving_tasks_deployment ON serving_tasks (tenant, deployment, submitted_at);
CREATE INDEX serving_tasks_finished ON serving_tasks (finished_at);

CREATE TABLE serving_batches (
    batch_id      uuid PRIMARY KEY,
    tenant        text NOT NULL,
    deployment    text NOT NULL,
    replica       uuid NOT NULL,
    tasks         integer NOT NULL,
    items         integer NOT NULL,
    -- Why it left: it was full (max_batch_size items), or its oldest task waited max_wait_ms.
    reason        text NOT NULL CHECK (reason IN ('full', 'timeout')),
    outcome       text NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
    invocation_ms double precision NOT NULL,
    inference_ms  double precision,
    at            timestamptz NOT NULL
);
CREATE INDEX serving_batches_deployment ON serving_batches (tenant, deployment, at);

CREATE TABLE serving_memo (
    tenant      text NOT NULL,
    deployment  text NOT NULL,
    key         bytea NOT NULL,
    output      jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    used_at     timestamptz NOT NULL,
    PRIMARY KEY (tenant, deployment, key)
);
-- Eviction keeps each deployment's most recently used entries.
CREATE INDEX serving_memo_used ON serving_memo (tenant, deployment, used_at);

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON deployments, pipelines TO trainyard_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON serving_tasks, serving_batches, serving_memo
    TO trainyard_app;
-- Agents claim tasks and record what their replicas answered (a replica job's manifest holds
-- all they need of its deployment): the batch, and the results to memoize.
GRANT SELECT, UPDATE ON serving_tasks TO trainyard_agent;
GRANT INSERT ON serving_batches TO trainyard_agent;
GRANT INSERT ON serving_memo TO trainyard_agent;
