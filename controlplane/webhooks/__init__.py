"""Webhook notifications: JobRestarted, JobFailed and JobCompleted POSTed to a job's
webhook_url through a transactional outbox, signed with its tenant's secret, at least once."""
