"""Scheduling, pure: where a job's learners go (`placement`), whether a job could ever be placed
(`unschedulable`), and the order claims take queued jobs in (`claim_order`). No I/O here: the
claim itself (`controlplane/agents/claims.py`) and its SQL (`claim_candidates`) use these, and
the simulator can run them without a database."""
