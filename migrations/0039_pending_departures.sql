-- Pending reasons at a claim's cost (issue 36): a job's spans end with the job's own events
-- (its claim, its start as an inference job, its end), not with an event of the recorder's per
-- claim, and the recorder appends a change of reasons a little after it shows it.

-- `recorded`: the row's reasons are in the job's pending stream. The recorder shows a change
-- at once (this row) and appends it to the stream (the history) later, with the instant the
-- change happened (`since`): a burst of new jobs is shown in one statement and recorded a
-- chunk a round; a change into `starting` alone, which the next claim ends within
-- milliseconds, is appended only if it lasts.
-- Only a queued job's row is ever not recorded: the recorder reads those rows each round.
-- `version` 0: a job whose reasons are shown, none recorded yet (its stream is empty).
ALTER TABLE pending_reasons ADD COLUMN recorded boolean NOT NULL DEFAULT true;
ALTER TABLE pending_reasons DROP CONSTRAINT pending_reasons_version_check,
    ADD CONSTRAINT pending_reasons_version_check CHECK (version >= 0);

-- The `pending` projection: when each attempt of a job left the queue, from the job's stream
-- (`attempt` 2147483647: the job ended, every attempt). A change of reasons the recorder
-- appends after that (judged before, or recorded late) holds the attempt only until then: it
-- must not open a span that nothing would end.
CREATE TABLE pending_left (
    job_id  uuid NOT NULL,
    attempt integer NOT NULL,
    left_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, attempt)
);

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON pending_left TO trainyard_app;
