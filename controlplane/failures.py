"""What a `trainyard` command's failure means, known without importing the part that failed.

The front door (`cli.main`) turns these into one line and an exit code. The classes raised
derive from them in their own modules (the database's, the agent's), which the command line
imports only when a command needs them: a user's `trainyard submit` loads no server or agent
code. The exit codes are here, at the bottom of every part, so that the commands each part
defines (the agent's, the benchmarks') return the same ones.
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4


class CommandFailed(Exception):
    """A failure that is no bug (a node's name taken, a lease lost, a migration changed, ...):
    its message is one line for the operator; exit code 1."""


class BackendUnreachable(Exception):
    """The database cannot be reached or started: exit code 3, like a server that does not
    answer."""
