"""Why queued jobs wait: each job's reasons now and, recorded, every span a reason held it."""
