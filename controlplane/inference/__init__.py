"""Inference jobs: fair time between jobs sharing replicas, exact query statistics."""
