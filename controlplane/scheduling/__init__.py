"""Scheduling: where a job's learners go (`placement`), whether a job could ever be placed
(`unschedulable`), and the order claims take queued jobs in (`claim_order`) under the claim
policy (`policy`: its order and whether quotas hold), all pure: the claim itself
(`controlplane/agents/claims.py`) and its SQL (`claim_candidates`, which reads the same policy
from its row) use these, and the simulator (`sim/`) runs them without a database. The
operator's switch of the policy is the scheduling stream's (`events`, `lifecycle`, pure), made
by `application` and kept in the `scheduling_policy` row by `projection`."""
