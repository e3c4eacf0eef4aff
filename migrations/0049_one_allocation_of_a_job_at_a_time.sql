-- Two allocations of one job at once (its claim's and an agent's as it starts its learners, or
-- two nodes' of a job across them) could answer it differently: the second did not see the
-- first's uncommitted row, found the range full and answered NULL, though the job then got a
-- uid. Now one allocation of a job waits for another (a transaction-scoped advisory lock on the
-- job), and reads what it gave. The function as 0031 made it otherwise.
CREATE OR REPLACE FUNCTION allocate_learner_uid(job uuid, first_uid bigint, uid_count bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    chosen bigint;
    start bigint;
BEGIN
    -- One allocation of a job at a time: another for the same job waits for this one's commit
    -- and then reads its uid, instead of missing the uncommitted row, finding the range full
    -- and answering NULL while the job gets a uid after all.
    PERFORM pg_advisory_xact_lock(hashtextextended(job::text, 0));
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
