-- A restarted job waits out its backoff before agents may claim it.
ALTER TABLE job_status ADD COLUMN not_before timestamptz;
