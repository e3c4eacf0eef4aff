"""Searches: hyperparameter and architecture search over many trials, each trial a job."""
