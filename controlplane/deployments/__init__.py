"""Model serving: deployments of model versions on replicas (jobs the agents run), pipelines of
deployments, and the task queue their replicas pull from."""
