"""Real parts of a cluster, started for tests and benchmarks alike: control planes (`trainyard
serve`) and node agents (`trainyard agent`) as child processes, the login agents use, and a
cluster of such processes to kill."""
