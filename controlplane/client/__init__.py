"""The user commands of the `trainyard` CLI, talking to a control plane over its HTTP API."""
