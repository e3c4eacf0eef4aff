"""Real parts of a cluster, started for tests and benchmarks alike: control planes (`trainyard
serve`), node agents (`trainyard agent`) and the logins they use, each a child process."""
