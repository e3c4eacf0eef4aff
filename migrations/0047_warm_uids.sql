-- Warm uids: a learner uid held for a sandbox made before its job is known.
--
-- An agent that is root keeps a few sandboxes ready ahead of any claim (interpreter, launcher
-- and torch loaded), each made as the uid it will run the job's learners as (setpriv at exec),
-- and hands one to a newly claimed job whose learners all run on its node. So the uid is chosen
-- before the job: the node holds it under a placeholder, a job id of no job, allocated as any
-- job's is (0031's allocate_learner_uid, fleet-wide), and the job that gets the sandbox takes
-- the placeholder's uid as its own. 0031's rules hold: a placeholder is a holder like a job, so
-- no job is given its uid meanwhile; agents reach these tables only through the definer
-- functions below, each for its own node only; and release_learner_uids, which frees only the
-- uids of ended jobs (job_status), never frees a placeholder's.

-- Each node's warm uids: `placeholder` is the uid's job_id in learner_uids until a job takes it
-- (then the row goes). `uid`: the same as that row's, so that a node's warm uids read from here.
CREATE TABLE warm_uids (
    placeholder uuid PRIMARY KEY,
    node        text NOT NULL,
    uid         bigint NOT NULL,
    made_at     timestamptz NOT NULL DEFAULT now()
);
-- An agent starting again gives back all of its node's (its earlier sandboxes are gone).
CREATE INDEX warm_uids_node ON warm_uids (node);

-- A job's uid that was a warm sandbox's: a process has run as it before any folder of the job
-- was recorded, so a later adoption must not give it back as it gives back a claim's unused uid.
ALTER TABLE learner_uids ADD COLUMN adopted boolean NOT NULL DEFAULT false;
-- A job's uid that some node recorded folders under: files may be owned by it, whatever
-- becomes of the job_folders rows later (an agent may forget its own node's), so adoption never
-- gives it back. Set by the trigger below, never cleared.
ALTER TABLE learner_uids ADD COLUMN used boolean NOT NULL DEFAULT false;

CREATE FUNCTION mark_learner_uid_used() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
    UPDATE learner_uids SET used = true WHERE job_id = NEW.job_id AND NOT used;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION mark_learner_uid_used() FROM PUBLIC;
CREATE TRIGGER job_folders_mark_uid_used AFTER INSERT ON job_folders
FOR EACH ROW EXECUTE FUNCTION mark_learner_uid_used();
UPDATE learner_uids u SET used = true
WHERE EXISTS (SELECT 1 FROM job_folders f WHERE f.job_id = u.job_id);

-- Refuses an agent login acting for another node than its own (0032's agent_logins): freeing
-- or taking another node's warm uid would free a uid a sandbox there runs as, or give it to a
-- job. Unconfined sessions (the owner's, see agent_unconfined) may act for any node.
CREATE FUNCTION agent_acts_for(at_node text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
    IF NOT agent_unconfined() AND at_node IS DISTINCT FROM agent_node() THEN
        RAISE EXCEPTION 'this database login works for node %, not %',
            coalesce(quote_literal(agent_node()), 'none'), quote_literal(at_node)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;

-- A fresh placeholder holding a free uid of [first_uid, first_uid + uid_count), recorded as
-- `at_node`'s warm uid; no row when every uid there is held. The search is the claims' own
-- (allocate_learner_uid, with the placeholder as its job): placeholders and jobs never share a
-- uid, whichever allocates first.
CREATE FUNCTION hold_warm_uid(at_node text, first_uid bigint, uid_count bigint)
RETURNS SETOF warm_uids
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    made uuid := gen_random_uuid();
    chosen bigint;
    held warm_uids;
BEGIN
    PERFORM agent_acts_for(at_node);
    chosen := allocate_learner_uid(made, first_uid, uid_count);
    IF chosen IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO warm_uids (placeholder, node, uid) VALUES (made, at_node, chosen)
    RETURNING * INTO held;
    RETURN NEXT held;
END
$$;

-- Job `job` takes the uid of `at_node`'s warm placeholder `warm` as its own, and the uid its
-- claim allocated it (if any) goes back; the uid, or NULL with nothing changed (the job keeps
-- its uid, the placeholder stays warm). Only while nothing can have used the job's own uid:
-- no node has recorded folders of the job (a node records them before making them and before
-- starting learners), and every live learner of the job is on `at_node`, whose agent adopts
-- before it starts any (no other node is about to read the old uid and use it). Never a job
-- whose uid is an adopted one already: its sandbox may run as it with no folder recorded yet.
--
-- Concurrency: the placeholder's row is locked first, so that one adoption of it (or its
-- release) goes through, and the others find it gone. The job's claim-time uid is deleted only
-- if it was not adopted (a row locked by a concurrent adoption is skipped once that one commits).
-- A uid the job gains meanwhile (another adoption, or allocate_learner_uid inserting the job's
-- first uid) makes the re-keying conflict on learner_uids' UNIQUE(job_id), waiting on the other
-- transaction first: the block is undone and the job keeps that uid, one uid a job.
CREATE FUNCTION adopt_warm_uid(job uuid, at_node text, warm uuid) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    chosen bigint;
BEGIN
    PERFORM agent_acts_for(at_node);
    SELECT w.uid INTO chosen FROM warm_uids w
    WHERE w.placeholder = warm AND w.node = at_node
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- The job's live allocations held as they are until this commits: a release waits, so no
    -- other node claims the job and reads its uid between these checks and the re-keying; and
    -- its uid's row, so that no folder is recorded under it meanwhile.
    PERFORM 1 FROM allocations a WHERE a.job_id = job AND a.released_at IS NULL FOR SHARE;
    PERFORM 1 FROM learner_uids u WHERE u.job_id = job FOR UPDATE;
    IF EXISTS (SELECT 1 FROM job_folders f WHERE f.job_id = job)
       OR NOT EXISTS (SELECT 1 FROM allocations a
                      WHERE a.job_id = job AND a.released_at IS NULL)
       OR EXISTS (SELECT 1 FROM allocations a
                  WHERE a.job_id = job AND a.released_at IS NULL AND a.node <> at_node)
       OR EXISTS (SELECT 1 FROM learner_uids u
                  WHERE u.job_id = job AND (u.adopted OR u.used)) THEN
        RETURN NULL;
    END IF;
    BEGIN
        DELETE FROM learner_uids u WHERE u.job_id = job AND NOT u.adopted;
        UPDATE learner_uids u SET job_id = job, adopted = true WHERE u.job_id = warm;
    EXCEPTION WHEN unique_violation THEN
        RETURN NULL;
    END;
    DELETE FROM warm_uids w WHERE w.placeholder = warm;
    RETURN chosen;
END
$$;

-- `at_node`'s warm uids back to the range: those of `placeholders`, or all of the node's when
-- NULL (an agent starting again: its earlier sandboxes are gone); how many. Only placeholders'
-- rows go: a uid a job adopted is no longer a warm row, and goes by release_learner_uids.
CREATE FUNCTION release_warm_uids(at_node text, placeholders uuid[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    released integer;
BEGIN
    PERFORM agent_acts_for(at_node);
    WITH gone AS (
        DELETE FROM warm_uids w
        WHERE w.node = at_node AND (placeholders IS NULL OR w.placeholder = ANY (placeholders))
        RETURNING w.placeholder
    ), freed AS (
        DELETE FROM learner_uids u USING gone WHERE u.job_id = gone.placeholder
    )
    SELECT count(*) INTO released FROM gone;
    RETURN released;
END
$$;

REVOKE ALL ON FUNCTION agent_acts_for(text), hold_warm_uid(text, bigint, bigint),
    adopt_warm_uid(uuid, text, uuid), release_warm_uids(text, uuid[]) FROM PUBLIC;
-- AGENT RIGHTS: an agent that is root holds uids for its warm sandboxes, hands one to a job it
-- claimed, and gives back those it no longer keeps; only for its own node, and no right on the
-- tables themselves.
GRANT EXECUTE ON FUNCTION hold_warm_uid(text, bigint, bigint), adopt_warm_uid(uuid, text, uuid),
    release_warm_uids(text, uuid[]) TO trainyard_agent;
-- The lifecycle manager gives back the warm uids of a node it declares LOST (lost_nodes.py).
GRANT EXECUTE ON FUNCTION release_warm_uids(text, uuid[]) TO trainyard_app;
