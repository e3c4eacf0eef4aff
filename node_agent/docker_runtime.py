"""Learners as Docker containers, through the engine's API (aiodocker).

Each learner is one container, configured by `containers.container_config`: labelled with its
job, attempt, learner, node and fencing epoch; its GPUs requested by UUID; limited and
isolated. Its output is followed from the engine's log (which keeps every line, also while no
agent reads it), its exit code and OOM flag come from the container's state, and the container
is removed once its lines are stored. Nothing is ever pulled: an image must be on the node, and
admitted by the node's allowlist (`TRAINYARD_IMAGES`); the container is created from the ID the
check resolved. A learner's network: none; its job's Docker network on this node
(`node_agent.networks`); or, for a job whose learners span nodes, its job's network across
them, in the job's holder here (`node_agent.container_links`).
"""

from __future__ import annotations

import asyncio
import calendar
import functools
import logging
import os
import signal
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from signal import Signals
from typing import Any, Protocol
from uuid import UUID

import aiodocker
import aiohttp
from aiodocker.exceptions import DockerError

from controlplane.agent_port.vocabulary import DEFAULT_ALLOWLIST, ImageAllowlist
from node_agent.cgroups import cpu_shares
from node_agent.container_links import ContainerLinks, linked
from node_agent.containers import LearnerLabels, container_config, container_name
from node_agent.docker_logs import log_lines
from node_agent.folders import prepare
from node_agent.images import admit, resolved_id
from node_agent.networks import FirewallError, JobNetworks, joins_network, network_name
from node_agent.runtime import (
    CpuShare,
    ExitStatus,
    FoundLearner,
    Learner,
    LearnerLine,
    LearnerSpec,
    LearnerStartError,
    Stream,
)

log = logging.getLogger(__name__)

ENGINE_ERRORS = (DockerError, aiohttp.ClientError, OSError)
"""What a refusing, failing or unreachable engine raises (aiodocker reports an engine it cannot
reach as a DockerError too)."""
Release = Callable[[], Awaitable[None]]
NOT_FOUND = 404
CONFLICT = 409
KILLED = 128 + signal.SIGKILL
"""A container's exit code when its PID 1 was SIGKILLed (from outside, by the OOM killer, or by
a stop's timeout): the launcher exits with it only when the command itself was SIGKILLed, which
is an outside kill too."""


def exit_status(code: int, *, oom_killed: bool) -> ExitStatus:
    """How a container ended, from its exit code and state."""
    if code == KILLED:
        return ExitStatus(code=None, signal=signal.SIGKILL.name, oom_killed=oom_killed)
    return ExitStatus(code=code, oom_killed=oom_killed)


class _Seen:
    """The lines read so far, as far as a second read from the last one's time needs: that
    time, and how many lines of each stream had it (times are microseconds, and several lines
    may share one)."""

    def __init__(self) -> None:
        self.last: datetime | None = None
        self._at_last: Counter[Stream] = Counter()

    def add(self, line: LearnerLine) -> None:
        if line.at != self.last:
            self.last = line.at
            self._at_last.clear()
        self._at_last[line.stream] += 1

    def is_new(self, line: LearnerLine) -> bool:
        """Whether a line of the second read was not read before (call in the log's order)."""
        if self.last is None or line.at > self.last:
            return True
        if line.at < self.last:
            return False
        if self._at_last[line.stream] == 0:
            return True
        self._at_last[line.stream] -= 1
        return False


class DockerLearner:
    """A learner's container: started by this agent, or found again by its labels."""

    def __init__(
        self,
        docker: aiodocker.Docker,
        container_id: str,
        *,
        cpus: float | None = None,
        release: Release | None = None,
    ) -> None:
        self._docker = docker
        self._container = docker.containers.container(container_id)
        self._cpus = cpus
        """Its manifest's CPUs (None for one only removed, never served)."""
        self._release = release
        """What goes with the container: its job's network, once no learner uses it."""
        self._signalling = asyncio.Lock()
        self._signals: set[asyncio.Task[None]] = set()

    @property
    def id(self) -> str:
        return self._container.id

    async def lines(self, since: datetime | None = None) -> AsyncGenerator[LearnerLine, None]:
        """Its output, from the start or from `since` (inclusive: a line written at that very
        instant comes again), until the container stops."""
        seen = _Seen()
        async for line in self._log(since, follow=True):
            seen.add(line)
            yield line
        # The engine's follow can end before the container's last message is in its log (a
        # last line without a newline is written only as the container exits; dockerd 20.10
        # drops it from `logs -f` about half the time): once the container has stopped, read
        # what the log holds from the last line on, leaving out the lines already read.
        await self._container.wait()
        async for line in self._log(seen.last or since, follow=False):
            if seen.is_new(line):
                yield line

    async def _log(self, since: datetime | None, *, follow: bool) -> AsyncIterator[LearnerLine]:
        params: dict[str, Any] = {"stdout": 1, "stderr": 1, "follow": follow, "timestamps": 1}
        if since is not None:
            # Exactly (a float's rounding could skip the line at `since`).
            seconds = calendar.timegm(since.utctimetuple())
            params["since"] = f"{seconds}.{since.microsecond:06d}"
        # The raw response, through aiodocker's request helper: its public `log()` merges
        # stdout and stderr into one stream and drops bytes that are not UTF-8, and the agent
        # needs both kept (stdout carries the launcher's reports).
        async with self._docker._query(
            f"containers/{self.id}/logs",
            params=params,
            # Followed for as long as the learner runs.
            timeout=self._docker._resolve_long_running_timeout(None),
        ) as response:
            async for line in log_lines(response.content):
                yield line

    async def wait(self) -> ExitStatus:
        """Once the container has stopped (at once if it has): how it ended."""
        result = await self._container.wait()
        state = (await self._container.show())["State"]
        return exit_status(int(result["StatusCode"]), oom_killed=bool(state["OOMKilled"]))

    async def share_cpu(self, share: CpuShare) -> None:
        """Its container's CPU quota and weight, changed by the engine's update call (as the
        process runtime changes its cgroup's). The engine takes no "no quota": a loading
        replica's is the node's every CPU, which is the same."""
        if self._cpus is None:
            return
        quota, weight = share.limits(self._cpus)
        cpus = float(os.cpu_count() or 1) if quota is None else quota
        update = {"NanoCpus": round(cpus * 1e9), "CpuShares": cpu_shares(weight)}
        try:
            await self._docker._query_json(
                f"containers/{self.id}/update", method="POST", data=update
            )
        except ENGINE_ERRORS as exc:
            # Only the order in which busy CPUs are shared suffers, never the replica (one
            # that has ended cannot be updated, and is about to go).
            log.warning("container %s: cannot change its CPU share: %s", self.id[:12], exc)

    def signal(self, sig: Signals) -> None:
        # To the container's PID 1, the launcher, which passes it on to the command.
        task = asyncio.get_running_loop().create_task(self._kill(sig))
        self._signals.add(task)
        task.add_done_callback(self._signals.discard)

    async def _kill(self, sig: Signals) -> None:
        # One at a time, in the order sent: a checkpoint request (SIGUSR1) must not be
        # overtaken by the SIGTERM after it, nor a SIGTERM by the SIGKILL after its grace.
        async with self._signalling:
            try:
                await self._container.kill(signal=sig.name)
            except DockerError as exc:
                # Gone, or no longer running: there is nothing left to signal.
                if exc.status not in (NOT_FOUND, CONFLICT):
                    log.warning("cannot send %s to container %s: %s", sig.name, self.id, exc)
            except ENGINE_ERRORS as exc:
                log.warning("cannot send %s to container %s: %s", sig.name, self.id, exc)

    async def remove(self) -> None:
        """Remove the container (killing it if it still runs). An engine that cannot is
        logged, not raised: the container keeps its labels, so it is found again later."""
        try:
            await self._container.delete(force=True)
        except DockerError as exc:
            if exc.status != NOT_FOUND:
                log.warning("cannot remove container %s: %s", self.id, exc)
                return
        except ENGINE_ERRORS as exc:
            log.warning("cannot remove container %s: %s", self.id, exc)
            return
        if self._release is not None:
            await self._release()


class ServableImageMaker(Protocol):
    async def image(self, base_id: str, requirements: Sequence[str]) -> str:
        """The ID of `base_id` with `requirements` installed; LearnerStartError if it cannot
        be made."""
        ...


class DockerRuntime:
    name = "docker"

    def __init__(
        self,
        docker: aiodocker.Docker,
        *,
        request_gpus: bool = True,
        images: ImageAllowlist = DEFAULT_ALLOWLIST,
        servables: ServableImageMaker | None = None,
    ) -> None:
        self._docker = docker
        self._servables = servables
        """Makes replicas' images with their models' requirements; None: such replicas cannot
        start here."""
        self._request_gpus = request_gpus
        self._images = images
        self._networks = JobNetworks(docker)
        self._links: dict[str, ContainerLinks | str] = {}
        """By node (an agent has one): its jobs' networks across nodes, or why it has none."""

    async def start(self, spec: LearnerSpec) -> DockerLearner:
        # The image first: a refused one leaves nothing behind on the node.
        image = await self._image(spec)
        if spec.packages:
            # A replica whose model lists requirements: the admitted image with them added.
            if self._servables is None:
                raise LearnerStartError("this node cannot build images with a model's requirements")
            image = await self._servables.image(image, spec.packages)
        spec = replace(spec, image=image)
        # Its folders made and its locations checked, on the node, now; any failure is the
        # start's (LearnerStartError), so the attempt rolls back with the reason.
        # In a thread: it walks the tenant's folders, which the tenant may have filled.
        spec = await asyncio.to_thread(prepare, spec)
        links = self._links_of(spec.node) if linked(spec) else None
        if isinstance(links, str):
            raise LearnerStartError(f"cannot give the job a network across its nodes: {links}")
        network = "none"
        if links is not None:
            network = links.network_mode(spec.job_id)
        elif joins_network(spec):
            network = network_name(spec.job_id)
        try:
            config = container_config(spec, request_gpus=self._request_gpus, network=network)
        except ValueError as exc:
            raise LearnerStartError(str(exc)) from exc
        release: Release | None = None
        if links is not None:
            # Its job's holder, linked to the job's other nodes before the container joins it.
            await links.acquire(spec)
            release = functools.partial(links.release, spec.job_id)
        elif joins_network(spec):
            # Its job's network, isolated before the container joins it: with a route out for
            # a tenant with the network, none (Docker's internal network) for the others.
            await self._networks.prepare(spec, internal=not spec.network)
            release = self._release(spec.job_id)
        try:
            container = await self._docker.containers.create(config, name=container_name(spec))
        except ENGINE_ERRORS as exc:
            if release is not None:
                await release()
            raise LearnerStartError(_create_error(spec, exc)) from exc
        learner = DockerLearner(self._docker, container.id, cpus=spec.cpus, release=release)
        try:
            await container.start()
        except ENGINE_ERRORS as exc:
            # Created but not started (its command not found in the image, say): no
            # container is left behind.
            await learner.remove()
            message = f"the Docker engine could not start it: {_message(exc)}"
            raise LearnerStartError(message) from exc
        return learner

    async def _image(self, spec: LearnerSpec) -> str:
        """The ID of the learner's image, which this node's allowlist admits (pinned: and whose
        digest it pins); LearnerStartError saying why not."""
        digests = admit(self._images, spec.image)
        try:
            inspected = await self._docker.images.inspect(spec.image)
        except ENGINE_ERRORS as exc:
            raise LearnerStartError(_create_error(spec, exc)) from exc
        return resolved_id(spec.image, digests, inspected)

    def _release(self, job_id: UUID) -> Release:
        return functools.partial(self._networks.release, job_id)

    def _links_of(self, node: str) -> ContainerLinks | str:
        if node not in self._links:
            self._links[node] = ContainerLinks.open(self._docker, node)
        return self._links[node]

    async def find(self, node: str) -> list[FoundLearner]:
        """This node's running learner containers, by their labels; first, the networks and
        rules an earlier agent left that no learner uses any more, and the holders and links
        of jobs that have no learner container running here."""
        try:
            await self._networks.sweep(node)
        except (*ENGINE_ERRORS, FirewallError) as exc:
            log.warning("cannot sweep the jobs' networks: %s", exc)
        containers = await self._docker.containers.list(
            filters={"label": [f"{LearnerLabels.NODE}={node}"], "status": ["running"]}
        )
        found = []
        for container in containers:
            try:
                labels = LearnerLabels.from_labels(container["Labels"])
            except ValueError:
                continue  # labelled by hand, or by another version: not ours to adopt
            found.append(
                FoundLearner(
                    job_id=labels.job_id,
                    attempt=labels.attempt,
                    learner=labels.learner,
                    epoch=labels.epoch,
                    handle=container.id,
                )
            )
        links = self._links_of(node)
        if isinstance(links, ContainerLinks):
            await links.sweep({learner.job_id for learner in found})
        return found

    async def adopt(self, spec: LearnerSpec, found: FoundLearner | None) -> Learner | None:
        if found is not None:
            handle = found.handle
        else:
            # Ended while no agent watched: its container stays (with its log) until its
            # lines are stored, under the name the spec gives it.
            try:
                handle = (await self._docker.containers.get(container_name(spec))).id
            except DockerError as exc:
                if exc.status == NOT_FOUND:
                    return None  # never started
                raise
        release: Release | None = None
        if linked(spec):
            links = self._links_of(spec.node)
            if isinstance(links, ContainerLinks):
                links.adopt(spec.job_id, spec.link)
                release = functools.partial(links.release, spec.job_id)
        elif joins_network(spec):
            release = self._release(spec.job_id)
        return DockerLearner(self._docker, handle, cpus=spec.cpus, release=release)

    async def kill(self, found: FoundLearner) -> None:
        release = self._release(found.job_id)
        await DockerLearner(self._docker, found.handle, release=release).remove()
        # Its job's holder here, unless a learner of the job this agent runs uses it (found
        # learners are the node's, whose links `find` made).
        for links in self._links.values():
            if isinstance(links, ContainerLinks):
                await links.discard(found.job_id)


def _message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, DockerError) else str(exc)


def _create_error(spec: LearnerSpec, exc: BaseException) -> str:
    if isinstance(exc, DockerError) and exc.status == NOT_FOUND:
        return (
            f"image {spec.image!r} is not on this node ({exc.message}); learner images are "
            "built or loaded on each node, never pulled"
        )
    return f"the Docker engine refused to create its container: {_message(exc)}"
