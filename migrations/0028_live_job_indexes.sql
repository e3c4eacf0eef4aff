-- Indexes for what the control plane reads every second, so that its cost follows the live
-- work, not the history (measured on 100,000 finished jobs; 10 times that at 1,000,000).

-- Jobs on nodes now: the lifecycle manager's sweep asks for the DEPLOYING ones
-- (`stalled_deployments`) every second. Queued jobs are left out: claims find theirs by tenant
-- in queue order (`job_status_tenant_queue`), and an index of every queued job by state alone
-- drew the claim's planner into reading and sorting the whole queue (90 ms a claim, not 2,
-- with 8,000 jobs queued).
CREATE INDEX job_status_running ON job_status (state)
    WHERE state IN ('DEPLOYING', 'DOWNLOADING', 'PROCESSING', 'STORING');

-- Inference jobs not ended: the manager's `live_inference_jobs`, every second. Without it that
-- read every job ever run: 75 ms a sweep, then 0.02 ms.
CREATE INDEX job_status_live_inference ON job_status (job_id)
    WHERE inference AND state NOT IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- Recently ended learners: the pending reasons' typical run times (`pending_durations`) look at
-- the last week's first learners only, not every allocation ever made (45 ms, then 20).
CREATE INDEX allocations_released ON allocations (released_at) WHERE learner = 0;
