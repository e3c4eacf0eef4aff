"""Read models built from the global event log, each with its checkpoint in one transaction."""
