-- Learner uids, one per job across the fleet, held while any folder of the job exists.
--
-- A job's learners run as a uid of their own, so that no other job's code can read or change
-- its files. Chosen by each node alone (a hash of the job id, unique only among the node's
-- running jobs), two jobs could share one, on two nodes or one after the other, and job ids
-- are predictable (uuid5 of an idempotency key): a tenant could pick a job that gets a
-- victim's uid and read its checkpoints on a shared checkpoint volume, or its folders left on
-- a node. Here the database hands each uid to one job only, and takes it back only once every
-- node has removed (or handed back) the job's folders, after the job's retention.

-- The uid of each job that has one: at most one job a uid and one uid a job. bigint: a uid
-- range may go up to 2^32 - 2, beyond integer. `allocated_at` bounds the retention's search
-- (a job ends after its uid was allocated).
CREATE TABLE learner_uids (
    uid          bigint PRIMARY KEY,
    job_id       uuid NOT NULL UNIQUE,
    allocated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX learner_uids_allocated ON learner_uids (allocated_at);

-- The job's folders on each node that made some: recorded before they are made, gone once the
-- node has removed them. `uid`: who owns them (NULL: the agent, which runs learners as itself
-- when it is not root). `checkpoints`: the job whose checkpoint folder it uses (itself, or the
-- first job of its search trial, whose later rungs resume from it). `expired`: the job's
-- retention has ended (set by the lifecycle manager); the node removes them at its next sweep.
CREATE TABLE job_folders (
    job_id      uuid NOT NULL,
    node        text NOT NULL,
    uid         bigint,
    checkpoints uuid NOT NULL,
    made_at     timestamptz NOT NULL DEFAULT now(),
    expired     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (job_id, node)
);
-- The manager's every-sweep search for ended jobs: only folders made longer than the retention
-- ago, and not yet expired, which are those of jobs running longer than the retention (few).
CREATE INDEX job_folders_unexpired ON job_folders (made_at) WHERE NOT expired;
-- An agent's sweep: its node's expired folders.
CREATE INDEX job_folders_expired ON job_folders (node) WHERE expired;
-- Whether a checkpoint folder is still used by a job that has not expired (a trial's next rung).
CREATE INDEX job_folders_checkpoints ON job_folders (checkpoints) WHERE NOT expired;

-- The job's uid: the one it holds, or a free one of [first_uid, first_uid + uid_count) taken
-- now; NULL when every uid there is held. A definer function, so that agents allocate without
-- any right on the table (they can neither read the others' uids nor give one back).
--
-- The search starts at a random uid and takes the first free one from there (wrapping to
-- `first_uid`): claims of many nodes at once rarely pick the same one, and the search stops at
-- the first gap rather than walking every held uid. Two claims that still pick the same one: the
-- second waits on the first's insert and, once it commits, looks again (ON CONFLICT); a
-- conflict on the job means another transaction gave the job its uid, read on the next turn.
CREATE FUNCTION allocate_learner_uid(job uuid, first_uid bigint, uid_count bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    chosen bigint;
    start bigint;
BEGIN
    LOOP
        SELECT uid INTO chosen FROM learner_uids WHERE job_id = job;
        IF FOUND THEN
            RETURN chosen;
        END IF;
        start := first_uid + floor(random() * uid_count)::bigint;
        -- Each branch finds the lowest free uid of its part, if any: the start itself, or one
        -- just above a held uid. Which branch answers first matters for speed only.
        chosen := (
            SELECT c FROM (
                SELECT start AS c WHERE NOT EXISTS (SELECT 1 FROM learner_uids WHERE uid = start)
                UNION ALL (
                    SELECT h.uid + 1 FROM learner_uids h
                    WHERE h.uid >= start AND h.uid + 1 < first_uid + uid_count
                      AND NOT EXISTS (SELECT 1 FROM learner_uids n WHERE n.uid = h.uid + 1)
                    ORDER BY h.uid LIMIT 1
                )
                UNION ALL
                SELECT first_uid
                WHERE NOT EXISTS (SELECT 1 FROM learner_uids WHERE uid = first_uid)
                UNION ALL (
                    SELECT h.uid + 1 FROM learner_uids h
                    WHERE h.uid >= first_uid AND h.uid + 1 < start
                      AND NOT EXISTS (SELECT 1 FROM learner_uids n WHERE n.uid = h.uid + 1)
                    ORDER BY h.uid LIMIT 1
                )
            ) free
            LIMIT 1
        );
        IF chosen IS NULL THEN
            RETURN NULL;
        END IF;
        INSERT INTO learner_uids (uid, job_id) VALUES (chosen, job) ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN chosen;
        END IF;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION allocate_learner_uid(uuid, bigint, bigint) FROM PUBLIC;
-- AGENT RIGHTS: claims allocate a job's uid, agents read it as they start its learners.
GRANT EXECUTE ON FUNCTION allocate_learner_uid(uuid, bigint, bigint) TO trainyard_agent;
-- AGENT RIGHTS: an agent records the folders it makes, reads which expired, and forgets them
-- once removed.
GRANT SELECT, INSERT, DELETE ON job_folders TO trainyard_agent;
-- The lifecycle manager expires folders and gives uids back.
GRANT SELECT, UPDATE ON job_folders TO trainyard_app;
GRANT SELECT, DELETE ON learner_uids TO trainyard_app;
