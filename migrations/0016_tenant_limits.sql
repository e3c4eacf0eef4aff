-- A tenant's limits (TenantLimitsSet): the `tenants` projection keeps the latest, as the
-- event has them. NULL: the admin never set any, so the defaults of the running code apply
-- (they may change with an upgrade; limits once set stay as they were set).
ALTER TABLE tenants ADD COLUMN limits jsonb;
