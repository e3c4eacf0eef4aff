-- Read models of jobs: their current status, and every event of their history.

-- One row per job: what `GET /v1/jobs` lists and filters. `doc` is the whole folded state.
CREATE TABLE job_status (
    job_id        uuid PRIMARY KEY,
    tenant        text NOT NULL,
    name          text NOT NULL,
    state         text NOT NULL,
    attempt       integer NOT NULL,
    restarts      integer NOT NULL,
    priority      integer NOT NULL,
    labels        jsonb NOT NULL,
    submitted_at  timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    version       integer NOT NULL,
    doc           jsonb NOT NULL
);
-- Listing newest first per tenant, with a (submitted_at, job_id) cursor.
CREATE INDEX job_status_tenant_order ON job_status (tenant, submitted_at DESC, job_id DESC);
CREATE INDEX job_status_order ON job_status (submitted_at DESC, job_id DESC);
CREATE INDEX job_status_labels ON job_status USING gin (labels jsonb_path_ops);

-- Every event of every job with the state it left the job in, its time, actor and reason.
CREATE TABLE job_history (
    job_id    uuid NOT NULL,
    version   integer NOT NULL,
    position  bigint NOT NULL,
    event     text NOT NULL,
    state     text NOT NULL,
    attempt   integer NOT NULL,
    at        timestamptz NOT NULL,
    actor     text NOT NULL,
    reason    text,
    PRIMARY KEY (job_id, version)
);

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON job_status, job_history TO trainyard_app;
