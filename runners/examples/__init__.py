"""Example training jobs that show how a training script uses the runner's helpers."""
