-- Claims take each tenant's next queued job from this index (one short index scan per tenant)
-- instead of sorting the whole queue on every claim.
DROP INDEX job_status_queue;
CREATE INDEX job_status_tenant_queue ON job_status (tenant, priority DESC, submitted_at, job_id)
    WHERE state = 'QUEUED';
