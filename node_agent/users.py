"""The users learners run as: a distinct unprivileged uid (and a group of the same number) for
each job on the node, from the operator's range `TRAINYARD_LEARNER_UIDS`, so that a job's code
can read neither the agent's files nor another job's.

The uids need no entry in /etc/passwd: containers and processes run under a number. The range
must hold no user of the node's own (the default starts above the usual system and login
users, at 200000, as container user-namespace ranges do).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

log = logging.getLogger(__name__)

NODE_PREFIX = b"TRAINYARD_NODE="
"""How a learner's environment names its node (see `node_agent.runtime.NODE`)."""
LEARNER_UIDS_ENV = "TRAINYARD_LEARNER_UIDS"
DEFAULT_LEARNER_UIDS = "200000:65536"


@dataclass(frozen=True, slots=True)
class UidRange:
    """`count` uids from `start` on."""

    start: int
    count: int

    @classmethod
    def parse(cls, value: str) -> UidRange:
        """From `START:COUNT`; ValueError naming the setting otherwise."""
        start, sep, count = value.partition(":")
        try:
            parsed = cls(int(start), int(count)) if sep else None
        except ValueError:
            parsed = None
        if parsed is None or parsed.start < 1 or parsed.count < 1:
            raise ValueError(
                f"{LEARNER_UIDS_ENV} must be START:COUNT with START and COUNT >= 1 (e.g. "
                f"{DEFAULT_LEARNER_UIDS}), not {value!r}"
            )
        if parsed.start + parsed.count > 2**32 - 2:
            raise ValueError(f"{LEARNER_UIDS_ENV}: {value!r} goes beyond the largest uid")
        return parsed

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> UidRange:
        env = os.environ if environ is None else environ
        return cls.parse(env.get(LEARNER_UIDS_ENV) or DEFAULT_LEARNER_UIDS)

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.start <= uid < self.start + self.count


def job_uid(job_id: UUID, uids: UidRange, taken: Set[int]) -> int:
    """The job's uid: chosen by the job's id (so that every node picks the same one, and a
    checkpoint folder shared by the nodes keeps its owner), the next free one when another
    job on this node holds it. ValueError when every uid of the range is taken."""
    first = int.from_bytes(hashlib.sha256(job_id.bytes).digest()[:8], "big") % uids.count
    for step in range(uids.count):
        uid = uids.start + (first + step) % uids.count
        if uid not in taken:
            return uid
    raise ValueError(f"all {uids.count} uids of {LEARNER_UIDS_ENV} are in use by jobs")


class Users:
    """Which uid each job on this node runs as, while it runs here."""

    def __init__(self, uids: UidRange, *, root: bool) -> None:
        self._uids = uids
        self._root = root
        self._jobs: dict[UUID, int] = {}

    @property
    def separate(self) -> bool:
        """Whether jobs get users of their own: only an agent that is root can hand them out;
        one that is not runs every learner as itself."""
        return self._root

    def of(self, job_id: UUID, owner: int | None = None) -> tuple[int, int] | None:
        """The job's uid and gid (the same for every learner of it here); None when learners
        run as the agent's user. `owner`: who owns the job's folder already, if it exists
        (an earlier agent's choice, which its running learners still use)."""
        if not self._root:
            return None
        uid = self._jobs.get(job_id)
        if uid is None:
            taken = set(self._jobs.values())
            if owner is not None and owner in self._uids and owner not in taken:
                uid = owner
            else:
                uid = job_uid(job_id, self._uids, taken)
            self._jobs[job_id] = uid
        return uid, uid

    def release(self, job_id: UUID) -> None:
        """The job's learners have ended here: its uid may go to another job."""
        self._jobs.pop(job_id, None)


def leftover_processes(uid: int, node: str | None = None, proc: str = "/proc") -> list[int]:
    """The processes running as `uid` (a job's user: all of them are the job's), but those of
    the job's learners that another agent on this machine runs for another `node` (a job
    placed on several nodes that share a machine, as in tests and demos)."""
    found = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"{proc}/{name}").st_uid != uid:
                continue
            environ = Path(proc, name, "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # ended meanwhile
        named = [item[len(NODE_PREFIX) :] for item in environ if item.startswith(NODE_PREFIX)]
        if node is None or not named or named[0].decode("utf-8", "replace") == node:
            found.append(int(name))
    return found
