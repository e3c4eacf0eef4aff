-- Searches (controlplane/searches): the `searches` projection of the search streams, which
-- stay the truth. One row a search and one a trial, for the API, the CLI's live table, the
-- search driver's look at what to advance, and the auditors.

CREATE TABLE searches (
    search_id    uuid PRIMARY KEY,
    tenant       text NOT NULL,
    name         text NOT NULL,
    state        text NOT NULL CHECK (state IN ('running', 'completed', 'failed', 'cancelled')),
    searcher     text NOT NULL,
    metric       text NOT NULL,
    mode         text NOT NULL CHECK (mode IN ('max', 'min')),
    max_trials   integer NOT NULL,
    rungs        integer NOT NULL CHECK (rungs >= 1),
    spec         jsonb NOT NULL,
    labels       jsonb NOT NULL,
    trials       integer NOT NULL DEFAULT 0,
    best_trial   integer,
    best_rung    integer,
    best_metric  float8,
    reason       text,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    ended_at     timestamptz
);
-- A tenant's searches, newest first (GET /v1/searches).
CREATE INDEX searches_tenant_created ON searches (tenant, created_at DESC, search_id);
-- The driver looks at the searches still running at each wake-up.
CREATE INDEX searches_running ON searches (search_id) WHERE state = 'running';

CREATE TABLE search_trials (
    search_id    uuid NOT NULL,
    number       integer NOT NULL CHECK (number >= 0),
    job_id       uuid NOT NULL,
    rung         integer NOT NULL,
    budget       integer NOT NULL,
    state        text NOT NULL
                 CHECK (state IN ('running', 'paused', 'completed', 'failed', 'pruned', 'cancelled')),
    point        jsonb NOT NULL,
    results      jsonb NOT NULL,
    metric       float8,
    parent       integer,
    reason       text NOT NULL,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (search_id, number)
);
-- The driver's question at each wake-up: which running (or cancelled) trials' jobs ended.
CREATE INDEX search_trials_live ON search_trials (search_id)
    WHERE state IN ('running', 'cancelled');

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON searches, search_trials TO trainyard_app;

CREATE VIEW audit.search_trials AS
SELECT t.search_id,
       s.tenant,
       s.name AS search,
       t.number,
       t.job_id,
       t.rung,
       t.budget,
       t.state,
       t.point,
       t.results,
       t.metric,
       t.parent,
       t.reason,
       t.created_at,
       t.updated_at
FROM public.search_trials t
JOIN public.searches s USING (search_id);

COMMENT ON VIEW audit.search_trials IS
    'Every trial of every search: its hyperparameters, its rungs'' metrics, and why the searcher did what it did.';
COMMENT ON COLUMN audit.search_trials.search_id IS 'The search.';
COMMENT ON COLUMN audit.search_trials.tenant IS 'Whose search it is.';
COMMENT ON COLUMN audit.search_trials.search IS 'The search''s name.';
COMMENT ON COLUMN audit.search_trials.number IS 'The trial''s number in its search, from 0.';
COMMENT ON COLUMN audit.search_trials.job_id IS 'The job that runs (or ran) its latest rung.';
COMMENT ON COLUMN audit.search_trials.rung IS 'Its latest rung (0 for searchers without rungs).';
COMMENT ON COLUMN audit.search_trials.budget IS 'The steps or epochs it trains to at that rung.';
COMMENT ON COLUMN audit.search_trials.state IS
    'running, paused (at a rung, waiting for a promotion), completed, failed, pruned or cancelled.';
COMMENT ON COLUMN audit.search_trials.point IS 'Its hyperparameters, as its learners got them.';
COMMENT ON COLUMN audit.search_trials.results IS 'The metric it reported at each rung it finished: [[rung, metric], ...].';
COMMENT ON COLUMN audit.search_trials.metric IS 'Its latest rung''s metric (NULL until one finished).';
COMMENT ON COLUMN audit.search_trials.parent IS 'The trial it was mutated from (evolution).';
COMMENT ON COLUMN audit.search_trials.reason IS 'Why the searcher made its latest decision about it, or why it failed.';
COMMENT ON COLUMN audit.search_trials.created_at IS 'When the searcher created it.';
COMMENT ON COLUMN audit.search_trials.updated_at IS 'When it last changed.';

GRANT SELECT ON audit.search_trials TO trainyard_auditor;
