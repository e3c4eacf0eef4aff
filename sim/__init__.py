"""The scheduling simulator: the recorded past (submissions, cancellations, nodes joining and
leaving, each job's run times) replayed under a claim policy, in virtual time, with the claim
order (`controlplane.scheduling`) the agents use; and how the outcome compares with what really
happened.

- `workload.py`: what a replay takes (jobs, node and tenant changes) and what it gives back
  (each job's runs), as values.
- `recording.py`: a workload read from recorded events, pure; `log.py` reads them from a store
  (Postgres: in a READ ONLY transaction, never appending).
- `policy.py`: the policies to replay (named ones, `--weight`, a policy file).
- `engine.py`: the replay itself, deterministic, over `cluster.py` (nodes' room) and
  `queue.py` (the queued jobs, indexed for claims).
- `metrics.py` and `report.py`: the figures of a replay and of the recorded past, compared.
"""
