"""Webhook notifications: JobRestarted, JobFailed and JobCompleted POSTed to a job's
webhook_url through a transactional outbox, signed with its tenant's secret, at least once."""

# Importing any part of the package registers its event types: a process that reads the whole
# log (the `streams` projection, which the catalog brings along with the outbox) decodes them.
from controlplane.webhooks import events as events
