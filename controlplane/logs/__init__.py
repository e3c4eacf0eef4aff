"""Learner logs: every stdout/stderr line of every learner, stored in batches (one COPY each)
and read back in one order per job, with a cursor that resumes exactly after a line."""
