"""Scheduling, pure: where a job's learners go (`placement`), whether a job could ever be placed
(`unschedulable`), and the order claims take queued jobs in (`claim_order`), under the claim
policy's choices (`policy`: the SQL's, or another the simulator replays). No I/O here: the claim
itself (`controlplane/agents/claims.py`) and its SQL (`claim_candidates`) use these, and the
simulator (`sim/`) runs them without a database."""
