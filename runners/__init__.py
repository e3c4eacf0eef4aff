"""Code that runs inside learners: launcher, checkpointing, phases and metrics."""
