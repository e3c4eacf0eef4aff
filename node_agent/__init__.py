"""The node agent: GPU inventory, work claims, learner runtimes, log shipping, reconciliation."""
