-- The autoscaler reads each deployment's latest finish however long ago (its idle time runs from
-- it, for as long as the scale-down delay): by this index, the last entry of the deployment's,
-- rather than every finish within the delay (60 s by default) that a sweep would otherwise scan.
CREATE INDEX serving_tasks_deployment_finished ON serving_tasks (tenant, deployment, finished_at);
