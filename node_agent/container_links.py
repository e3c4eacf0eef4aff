"""A job's network across nodes for its learner containers (the Docker runtime): the same plan,
addresses, veth, routes and rules as the process runtime's (`node_agent.job_links`), given to a
network namespace that Docker made.

Docker has no network that spans nodes without a swarm, and no way to start a container in a
network namespace made beforehand (`ip netns add`, as `node_agent.job_netns` makes for
processes). So each job whose learners span nodes gets, on each of its nodes, a holder: a
container of the learner's image with no network (`none`: loopback alone) whose only process
waits for a signal, run as the job's uid with every capability dropped, tiny limits, no mounts.
The agent names its network namespace (`ip netns attach NAME PID`, a file under /run/netns) and
links it to the job's other nodes exactly as it links a process-runtime job's namespace
(`JobLinks.connect`); then every learner container of the job on the node joins it
(`container:HOLDER`), so they share the job's address there, as learners sharing a process
namespace do, and meet at 127.0.0.1 too. Every learner's command starts after the link is up:
no rendezvous has to outwait its own network.

The holder and the namespace's name hold the agent's tag (a hash of its node name, which its
containers' labels carry already): one Docker engine is daemon-wide, and two agents sharing it
(two nodes on one machine, as the tests run them) never take each other's. The job's last
learner here takes them as it is removed (veth, namespace name, holder, then the link's rules
and routes); a (re)starting agent's sweep takes those of jobs with no learner container running
here, and the rules and routes no veth serves any more.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
from collections import Counter
from collections.abc import Set
from typing import Any
from uuid import UUID

import aiodocker
from aiodocker.exceptions import DockerError

from node_agent import commands
from node_agent.containers import LearnerLabels, learner_user
from node_agent.job_links import INSIDE, JobLink, JobLinks, LinkError
from node_agent.job_netns import NETNS_DIR
from node_agent.networks import ENGINE_ERRORS, NOT_FOUND
from node_agent.runtime import LearnerSpec, LearnerStartError

log = logging.getLogger(__name__)

ROLE_LABEL = "trainyard.role"
"""On a holder (with `trainyard.job` and `trainyard.node`): what it is, since it is no learner."""
HOLDER_ROLE = "network"
PAUSE = "import signal; signal.pause()"
"""The holder's program, for the image's interpreter (the launcher's, so every learner image has
it): it waits, holding the namespace, until the agent removes it (SIGKILL)."""
HOLDER_MEMORY = 64 << 20
"""Ample for an interpreter that imports nothing."""
HOLDER_PIDS = 8


def linked(spec: LearnerSpec) -> bool:
    """Whether the learner's container joins its job's network across nodes (its tenant has no
    network of its own: a networked tenant's containers keep their job's Docker network)."""
    return spec.link is not None and not spec.network


def holder_config(spec: LearnerSpec) -> dict[str, Any]:
    """The body of the engine's create call for the holder of the job of `spec`, a learner of
    it (whose image, interpreter and user it takes). ValueError when the spec has no user."""
    user = learner_user(spec)
    return {
        "Image": spec.image,
        "Entrypoint": spec.command[:1],
        "Cmd": ["-c", PAUSE],
        "User": f"{user[0]}:{user[1]}",
        "WorkingDir": "/",
        "Labels": {
            LearnerLabels.JOB: str(spec.job_id),
            LearnerLabels.NODE: spec.node,
            ROLE_LABEL: HOLDER_ROLE,
        },
        "HostConfig": {
            # Loopback alone until the agent links it: nothing of Docker's, no bridge, no NAT.
            "NetworkMode": "none",
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "ReadonlyRootfs": True,
            "Memory": HOLDER_MEMORY,
            "MemorySwap": HOLDER_MEMORY,
            "PidsLimit": HOLDER_PIDS,
            "NanoCpus": 100_000_000,
            "Init": False,
            "LogConfig": {"Type": "none"},
        },
    }


class ContainerLinks:
    """One agent's holders and their links on its node, with how many of each job's learner
    containers here use them."""

    def __init__(self, docker: aiodocker.Docker, node: str, ip: str) -> None:
        owner = hashlib.sha256(node.encode()).hexdigest()[:8]
        # `c`: never a name of `job_netns` (whose tag is a hash of a work directory).
        self._prefix = f"trainyard-c{owner}-"
        self._docker = docker
        self._node = node
        self._ip = ip
        self._links = JobLinks.open(owner, ip)
        self._users: Counter[UUID] = Counter()
        self._linked: dict[UUID, JobLink] = {}
        """The link each job's holder was given (by this agent, or, adopted, by the one before)."""
        # One change at a time: a new attempt's first learner must not make the holder while
        # the last attempt's last learner removes it.
        self._lock = asyncio.Lock()

    @classmethod
    def open(cls, docker: aiodocker.Docker, node: str) -> ContainerLinks | str:
        """The node's, or why there are none (what the node lacks)."""
        ip = shutil.which("ip")
        if ip is None:
            return "ip not found: apt-get install iproute2"
        return cls(docker, node, ip)

    def name(self, job_id: UUID) -> str:
        """The job's holder container here, and its network namespace's name under /run/netns."""
        return f"{self._prefix}{job_id}"

    def network_mode(self, job_id: UUID) -> str:
        """What a learner container of the job joins: its holder's network namespace."""
        return f"container:{self.name(job_id)}"

    async def acquire(self, spec: LearnerSpec) -> None:
        """Make the job's holder (for its first learner here) and link it to the job's other
        nodes, before a learner container joins it; LearnerStartError when it cannot be (no
        learner of the job runs without its link)."""
        job_id, link = spec.job_id, spec.link
        assert link is not None, "only a linked learner acquires a holder"
        async with self._lock:
            try:
                await self._hold(spec)
                if self._linked.get(job_id) != link:
                    await self._links.connect(self.name(job_id), link)
                    self._linked[job_id] = link
            except (LinkError, ValueError, *ENGINE_ERRORS) as exc:
                if job_id not in self._users:
                    await self._delete(job_id)
                message = exc.message if isinstance(exc, DockerError) else str(exc)
                raise LearnerStartError(
                    f"cannot give the job a network across its nodes: {message}"
                ) from exc
            self._users[job_id] += 1

    async def _hold(self, spec: LearnerSpec) -> None:
        """The job's holder running, its namespace named: made now unless it is."""
        name = self.name(spec.job_id)
        try:
            state = (await self._docker.containers.get(name))["State"]
        except DockerError as exc:
            if exc.status != NOT_FOUND:
                raise
            state = None
        if state is not None and state["Running"] and (NETNS_DIR / name).exists():
            return  # another learner of the job made it (this agent, or the one before)
        if spec.job_id in self._users:
            # Its learners here are in the namespace it held: a new one would not meet them.
            raise LinkError(f"the job's holder {name} stopped under its running learners")
        if state is not None or (NETNS_DIR / name).exists():
            await self._delete(spec.job_id)  # what is left of an earlier one
        container = await self._docker.containers.create(holder_config(spec), name=name)
        await container.start()
        pid = (await container.show())["State"]["Pid"]
        await self._run("netns", "attach", name, str(pid))
        await self._run("-n", name, "link", "set", "lo", "up")

    def adopt(self, job_id: UUID, link: JobLink | None) -> None:
        """A learner container an earlier agent started in the job's holder is this agent's
        now, with the link that agent gave it (not made again for the attempt's other learners
        here, which would cut the running ones off for a moment)."""
        self._users[job_id] += 1
        if link is not None:
            self._linked[job_id] = link

    async def release(self, job_id: UUID) -> None:
        """One learner container of the job here has been removed: the last one takes the
        holder and the link."""
        async with self._lock:
            self._users[job_id] -= 1
            if self._users[job_id] > 0:
                return
            del self._users[job_id]
            await self._delete(job_id)

    async def discard(self, job_id: UUID) -> None:
        """Remove the job's holder and link if no learner here uses them (a stale learner,
        killed)."""
        async with self._lock:
            if job_id not in self._users:
                await self._delete(job_id)

    async def sweep(self, keep: Set[UUID]) -> None:
        """Remove this agent's holders and namespace names of jobs other than `keep` (those
        with a learner container running here): left by an agent that stopped or died before
        its learners were removed; then the rules and routes of veths that are gone."""
        async with self._lock:
            try:
                listed = set(self._named()) | await self._holders()
            except ENGINE_ERRORS as exc:
                log.warning("cannot list the jobs' network holders: %s", exc)
                listed = set(self._named())
            for job_id in listed:
                if job_id not in keep and job_id not in self._users:
                    await self._delete(job_id)
            await self._links.sweep()

    def _named(self) -> list[UUID]:
        """The jobs whose namespaces this agent named are on the node (a short local listing)."""
        if not NETNS_DIR.is_dir():
            return []
        return [
            job_id
            for entry in NETNS_DIR.iterdir()
            if (job_id := self._job_of(entry.name)) is not None
        ]

    async def _holders(self) -> set[UUID]:
        """The jobs this agent's holders (running or not) are on the engine for."""
        containers = await self._docker.containers.list(
            all=True,
            filters={
                "label": [f"{ROLE_LABEL}={HOLDER_ROLE}", f"{LearnerLabels.NODE}={self._node}"]
            },
        )
        jobs = set()
        for container in containers:
            for name in container["Names"]:
                if (job_id := self._job_of(name.lstrip("/"))) is not None:
                    jobs.add(job_id)
        return jobs

    def _job_of(self, name: str) -> UUID | None:
        if not name.startswith(self._prefix):
            return None
        try:
            return UUID(name.removeprefix(self._prefix))
        except ValueError:
            return None  # not a name this agent gives

    async def _delete(self, job_id: UUID) -> None:
        # Logged, not raised: what is left holds no learner (they are gone) and the next sweep
        # takes it.
        name = self.name(job_id)
        if (NETNS_DIR / name).exists():
            # The job's veth first: it would go with the namespace only once the kernel has
            # destroyed that (later), which the sweep of its rules below must not wait for.
            await commands.run(self._ip, "-n", name, "link", "del", INSIDE)
            done = await commands.run(self._ip, "netns", "delete", name)
            if done.code != 0:
                log.warning("cannot remove the network namespace %s: %s", name, done.err.strip())
        try:
            await self._docker.containers.container(name).delete(force=True)
        except DockerError as exc:
            if exc.status != NOT_FOUND:
                log.warning("cannot remove the network holder %s: %s", name, exc.message)
        except ENGINE_ERRORS as exc:
            log.warning("cannot remove the network holder %s: %s", name, exc)
        self._linked.pop(job_id, None)
        await self._links.sweep()

    async def _run(self, *args: str) -> None:
        done = await commands.run(self._ip, *args)
        if done.code != 0:
            command = " ".join(["ip", *args])
            raise LinkError(f"`{command}` failed (exit {done.code}): {done.err.strip()}")
