"""The users learners run as: a distinct unprivileged uid (and a group of the same number) for
each job, unique across the fleet while any file of the job's may exist, from the operator's
range `TRAINYARD_LEARNER_UIDS` (the same on every node), so that a job's code can read neither
the agent's files nor another job's (see docs/learner-uids.md).

The uids need no entry in /etc/passwd: containers and processes run under a number. The range
must hold no user of the node's own (the default starts above the usual system and login
users, at 200000, as container user-namespace ranges do).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from uuid import UUID

from controlplane.agent_port.protocol import FolderRecords
from controlplane.agent_port.vocabulary import WarmUid, uids_exhausted

log = logging.getLogger(__name__)

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

    @property
    def uids(self) -> range:
        return range(self.start, self.start + self.count)


class NoUid(Exception):
    """The job has no uid this node can run its learners as."""


class Users:
    """Which uid each job's learners run as: one of its own across the fleet, allocated in the
    database (`allocate_learner_uid`) as the job is claimed, and held until every node has
    removed the job's folders (`node_agent.folders.JobFolders`). No two jobs share a uid while
    a file of either may exist: not on two nodes at once, and not one after the other."""

    def __init__(self, port: FolderRecords, uids: UidRange, *, root: bool) -> None:
        self._port = port
        self._uids = uids
        self._root = root

    @property
    def claimed(self) -> range | None:
        """The uids this node's claims allocate from. None: jobs get no users of their own, as
        only an agent that is root can hand them out; one that is not runs every learner as
        itself."""
        return self._uids.uids if self._root else None

    async def of(self, job_id: UUID) -> tuple[int, int] | None:
        """The job's uid and gid (the same for every learner of it, on every node); None when
        learners run as the agent's user. Allocated now when the job's claim did not (a node
        that is not root claimed it). NoUid when every uid of the range is held, or the job
        holds one outside this node's range (the fleet's nodes disagree on the range)."""
        if not self._root:
            return None
        uid = await self._port.allocate_uid(job_id, self._uids.uids)
        if uid is None:
            raise NoUid(uids_exhausted(self._uids.uids))
        if uid not in self._uids:
            raise NoUid(
                f"the job's uid {uid} is outside this node's {LEARNER_UIDS_ENV} "
                f"({self._uids.start}:{self._uids.count}): every node must have the same range"
            )
        return uid, uid

    async def hold_warm(self, node: str) -> WarmUid | None:
        """A uid of the range held for a warm sandbox of `node`, made before its job is known,
        under a placeholder that no job is given meanwhile. None when the agent is not root (it
        makes no sandbox as another user) or every uid of the range is held."""
        if not self._root:
            return None
        return await self._port.hold_warm_uid(node, self._uids.uids)

    async def adopt_warm(
        self, job_id: UUID, node: str, placeholder: UUID, checkpoints: UUID
    ) -> int | None:
        """The job, just claimed with all its learners on `node`, takes the warm sandbox's uid as
        its own (its claim's goes back), its folders on `node` recorded under it (`checkpoints`:
        whose checkpoint folder it uses); None when it cannot (see
        `FolderRecords.adopt_warm_uid`): the job keeps its uid, and the sandbox stays warm."""
        if not self._root:
            return None
        return await self._port.adopt_warm_uid(job_id, node, placeholder, checkpoints)

    async def release_warm(self, node: str, placeholders: Sequence[UUID] | None = None) -> int:
        """`node`'s warm uids given back: those of `placeholders`, or all of them when None (the
        agent starting again: its earlier sandboxes are gone); how many."""
        if not self._root:
            return 0
        return await self._port.release_warm_uids(node, placeholders)
