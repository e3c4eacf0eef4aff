"""The node agent's port to the control plane: what an agent asks of it (`protocol.AgentPort`),
in the words both sides share (`vocabulary`), answered by Postgres (`postgres.PostgresPort`) or
by an in-memory twin (`memory.MemoryPort`) that passes the same contract suite. `node_agent`
imports this package, `controlplane.jobs.lifecycle` and `runners.protocol`, and nothing else of
the server (tests/test_layout.py)."""
