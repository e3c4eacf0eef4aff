-- A replica's direct requests (node_agent/serving_channel.py) are run at once when the replica
-- has no call in flight: a batch then leaves with what is there, neither full nor after
-- max_wait_ms, and `serving_batches` records that as 'idle' (the queue's batches still leave
-- 'full' or at 'timeout').
ALTER TABLE serving_batches DROP CONSTRAINT serving_batches_reason_check,
    ADD CONSTRAINT serving_batches_reason_check CHECK (reason IN ('full', 'timeout', 'idle'));
