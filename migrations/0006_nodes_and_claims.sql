-- Nodes, their GPUs, and the allocations that claims make.
--
-- These tables are operational state, written directly by agents and claims: a lease renewed
-- every two seconds is no event. What matters to the record (a node registered, deregistered
-- or lost; a job deployed with its GPUs and fencing epoch) is also appended as an event.

CREATE TABLE nodes (
    name          text PRIMARY KEY,
    agent_id      uuid NOT NULL,
    state         text NOT NULL CHECK (state IN ('READY', 'GONE', 'LOST')),
    lease_until   timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    registered_at timestamptz NOT NULL,
    runtime       text NOT NULL,
    cpus          double precision NOT NULL CHECK (cpus > 0),
    memory_mb     bigint NOT NULL CHECK (memory_mb > 0)
);

CREATE TABLE node_gpus (
    node          text NOT NULL REFERENCES nodes (name) ON DELETE CASCADE,
    index         integer NOT NULL,
    uuid          text NOT NULL UNIQUE,
    model         text NOT NULL,
    memory_mb     bigint NOT NULL,
    healthy       boolean NOT NULL,
    health_reason text,
    PRIMARY KEY (node, index)
);

-- Fencing tokens: every claim takes the next one; a learner of an older epoch is stale.
CREATE SEQUENCE claim_epochs;

-- One row per learner of a claimed attempt; released when the learner has ended.
CREATE TABLE allocations (
    job_id       uuid NOT NULL,
    attempt      integer NOT NULL,
    learner      integer NOT NULL,
    tenant       text NOT NULL,
    node         text NOT NULL,
    epoch        bigint NOT NULL,
    gpus         text[] NOT NULL,
    cpus         double precision NOT NULL,
    memory_mb    bigint NOT NULL,
    allocated_at timestamptz NOT NULL DEFAULT now(),
    released_at  timestamptz,
    PRIMARY KEY (job_id, attempt, learner)
);
CREATE INDEX allocations_active_node ON allocations (node) WHERE released_at IS NULL;
CREATE INDEX allocations_active_tenant ON allocations (tenant) WHERE released_at IS NULL;

-- A row exists only while its GPU is allocated: the primary key is what guarantees that two
-- learners never share a GPU, whatever races the claims run into.
CREATE TABLE allocated_gpus (
    gpu_uuid text PRIMARY KEY,
    job_id   uuid NOT NULL,
    attempt  integer NOT NULL,
    learner  integer NOT NULL
);

-- What a queued job needs, derived from its manifest (so a projection rebuild keeps it right).
ALTER TABLE job_status
    ADD COLUMN learners integer GENERATED ALWAYS AS
        ((doc -> 'manifest' ->> 'learners')::integer) STORED,
    ADD COLUMN gpus_per_learner integer GENERATED ALWAYS AS
        ((doc -> 'manifest' ->> 'gpus_per_learner')::integer) STORED,
    ADD COLUMN cpus_per_learner double precision GENERATED ALWAYS AS
        ((doc -> 'manifest' ->> 'cpus')::double precision) STORED,
    ADD COLUMN memory_mb_per_learner bigint GENERATED ALWAYS AS
        ((doc -> 'manifest' ->> 'memory_mb')::bigint) STORED;
CREATE INDEX job_status_queue ON job_status (priority DESC, submitted_at) WHERE state = 'QUEUED';

GRANT SELECT, INSERT, UPDATE, DELETE ON nodes, node_gpus, allocations, allocated_gpus
    TO trainyard_app;
GRANT USAGE ON SEQUENCE claim_epochs TO trainyard_app;
