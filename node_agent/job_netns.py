"""A network of its own for each job's sandboxed learners on this node (the process runtime).

Each learner's bubblewrap used to make a network namespace of its own, holding only loopback:
safe, but two learners of one job could not reach each other. Now the agent makes one network
namespace per job on the node (`ip netns add`, loopback up, nothing else: no interface, no
route), and every learner of the job whose tenant has no network starts its bubblewrap inside
it (`nsenter --net=`), without a namespace of its own. Ranks of one job on one node meet at
127.0.0.1 (`node_agent.rendezvous`); nothing else is reachable from there: not other jobs (each
has its own namespace, its own loopback), not the node, not the control plane. A job whose
learners span nodes also gets a link to its namespaces on the other nodes, and nothing else
(`node_agent.job_links`).

A namespace made with `ip netns` is a file under /run/netns, which outlives the agent, as its
learners do: a restarted agent's learners are still in it. Its name holds the agent (a hash of
its work directory: two agents on one machine never share or sweep each other's) and the job.
The job's last learner here takes it as it is removed (and the job's link with it); a
(re)starting agent sweeps its namespaces of jobs that have no learner running here any more,
and the links' rules and routes that no namespace serves.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
from collections import Counter
from collections.abc import Set
from pathlib import Path
from uuid import UUID

from node_agent import commands
from node_agent.job_links import INSIDE, JobLink, JobLinks, LinkError
from node_agent.runtime import LearnerStartError

log = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")
"""Where `ip netns` keeps a namespace's file (and nsenter finds it)."""


class NamespaceError(Exception):
    """`ip` refused to make or remove a namespace."""


class Hold:
    """One learner's use of its job's namespace, given back once (as the learner ends, or is
    removed, whichever comes first)."""

    def __init__(self, namespaces: JobNamespaces, job_id: UUID) -> None:
        self._namespaces = namespaces
        self.job_id = job_id
        self.path = namespaces.path(job_id)
        self._held = True

    async def release(self) -> None:
        if self._held:
            self._held = False
            await self._namespaces.release(self.job_id)


class JobNamespaces:
    """The network namespaces of one agent's jobs, with how many of each job's learners here
    use it."""

    def __init__(self, work_dir: Path, ip: str) -> None:
        owner = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:8]
        self._prefix = f"trainyard-{owner}-"
        self._ip = ip
        self._users: Counter[UUID] = Counter()
        self._links = JobLinks.open(owner, ip)
        self._linked: dict[UUID, JobLink] = {}
        """The link each job's namespace was given (by this agent, or, adopted, by the agent
        before it, as its learners' specs say)."""
        # One change at a time: a new attempt's first learner must not make the namespace
        # while the last attempt's last learner removes it.
        self._lock = asyncio.Lock()

    @classmethod
    def open(cls, work_dir: Path) -> JobNamespaces | str:
        """This node's, or why there are none (what the node lacks)."""
        ip = shutil.which("ip")
        if ip is None:
            return "ip not found: apt-get install iproute2"
        return cls(work_dir, ip)

    def name(self, job_id: UUID) -> str:
        return f"{self._prefix}{job_id}"

    def path(self, job_id: UUID) -> Path:
        return NETNS_DIR / self.name(job_id)

    async def acquire(self, job_id: UUID, link: JobLink | None = None) -> Hold:
        """A learner's hold on the job's namespace, made for its first learner here, with
        `link` to the job's other nodes when its learners span nodes; LearnerStartError when
        it cannot be (no learner of the job runs without one)."""
        async with self._lock:
            path = self.path(job_id)
            try:
                if not path.exists():
                    await _ip(self._ip, "netns", "add", self.name(job_id))
                    await _ip(self._ip, "-n", self.name(job_id), "link", "set", "lo", "up")
                if link is not None and self._linked.get(job_id) != link:
                    await self._links.connect(self.name(job_id), link)
                    self._linked[job_id] = link
            except (NamespaceError, LinkError) as exc:
                if job_id not in self._users:
                    await self._delete(job_id)
                raise LearnerStartError(f"cannot give the job a network of its own: {exc}") from exc
            self._users[job_id] += 1
            return Hold(self, job_id)

    def adopt(self, job_id: UUID, link: JobLink | None = None) -> Hold:
        """A learner an earlier agent started in the job's namespace is this agent's now, with
        the link that agent gave it (not made again for the attempt's other learners here,
        which would cut the running ones off for a moment)."""
        self._users[job_id] += 1
        if link is not None:
            self._linked[job_id] = link
        return Hold(self, job_id)

    async def release(self, job_id: UUID) -> None:
        """One learner of the job here has been removed: the last one takes the namespace."""
        async with self._lock:
            self._users[job_id] -= 1
            if self._users[job_id] > 0:
                return
            del self._users[job_id]
            await self._delete(job_id)

    async def discard(self, job_id: UUID) -> None:
        """Remove the job's namespace if no learner here uses it (a stale learner, killed)."""
        async with self._lock:
            if job_id not in self._users:
                await self._delete(job_id)

    async def sweep(self, keep: Set[UUID]) -> None:
        """Remove this agent's namespaces of jobs other than `keep` (those with a learner
        running here): left by an agent that stopped or died before its learners were removed."""
        async with self._lock:
            for job_id in self._listed():
                if job_id not in keep and job_id not in self._users:
                    await self._delete(job_id)
            await self._links.sweep()

    def _listed(self) -> list[UUID]:
        """The jobs whose namespaces of this agent's are on the node (a short local listing)."""
        if not NETNS_DIR.is_dir():
            return []
        jobs = []
        for entry in NETNS_DIR.iterdir():
            if entry.name.startswith(self._prefix):
                try:
                    jobs.append(UUID(entry.name.removeprefix(self._prefix)))
                except ValueError:
                    continue  # not a name this agent gives
        return jobs

    async def _delete(self, job_id: UUID) -> None:
        # Logged, not raised: a namespace left behind holds no process (its learners ended)
        # and the next sweep takes it.
        if not self.path(job_id).exists():
            return
        # The job's veth first, if it has one: it would go with the namespace only once the
        # kernel has destroyed that (later, and never while a process holds it), which the
        # sweep of its rules below must not wait for.
        await commands.run(self._ip, "-n", self.name(job_id), "link", "del", INSIDE)
        try:
            await _ip(self._ip, "netns", "delete", self.name(job_id))
        except NamespaceError as exc:
            log.warning("cannot remove the network namespace of job %s: %s", job_id, exc)
            return
        # Its veth went with it; its rules and routes go now (also an adopted job's, whose
        # link this agent did not make).
        self._linked.pop(job_id, None)
        await self._links.sweep()


async def _ip(program: str, *args: str) -> None:
    done = await commands.run(program, *args)
    if done.code != 0:
        command = " ".join(["ip", *args])
        raise NamespaceError(f"`{command}` failed (exit {done.code}): {done.err}")
