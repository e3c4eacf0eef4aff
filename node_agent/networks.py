"""A network of its own for each job whose tenant may use the network (`--allow-network`), or
whose learners train together (more than one learner).

Each such job gets a Docker bridge network on the node, named `ty-<hash of the job id>` (its
Linux bridge has the same name), created before its first learner's container and removed once
its last one is (or, left by an agent that died, by the sweep of the agent that comes next).
Docker's own rules keep bridges apart and let a container reach everything else; ours, in
chains of our own, narrow that to the public internet: a learner reaches the other learners of
its job, and neither the node (its addresses, the API, a Postgres on it), nor other jobs, nor
private ranges, shared address space, link-local (169.254.169.254, the clouds' metadata
service) or loopback addresses; nothing outside opens a connection into the network.

- `TRAINYARD-ISOLATE`, jumped to from the top of `DOCKER-USER` (Docker's place for an
  operator's forwarding rules): per bridge, what the learners may route to.
- `TRAINYARD-INPUT`, jumped to from the top of `INPUT`: per bridge, a drop of everything a
  learner sends to the node itself (which `FORWARD` never sees).
- The same in ip6tables where it works; the networks are IPv4 only, so a bridge's IPv6 is
  dropped whole.

The rules of a bridge are in place before any container joins it, and a failure to install
them fails the learner's start (no networked learner runs unisolated). The agent must be root
to change them.

A job of several learners whose tenant has no network gets the same, as an internal network
(Docker's `--internal`: no route out of it at all, and our rules keep the node out as well):
its learners reach each other, and rank 0 by its alias (`node_agent.rendezvous`), nothing else.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import shutil
from uuid import UUID

import aiodocker
import aiohttp
from aiodocker.exceptions import DockerError

from node_agent import commands
from node_agent.runtime import LearnerSpec, LearnerStartError

log = logging.getLogger(__name__)

PREFIX = "ty-"
FORWARD_CHAIN = "TRAINYARD-ISOLATE"
INPUT_CHAIN = "TRAINYARD-INPUT"
BLOCKED_V4 = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private
    "100.64.0.0/10",  # shared address space (carrier-grade NAT, some clouds' internal ranges)
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local, with the clouds' metadata service at 169.254.169.254
    "172.16.0.0/12",  # private, with Docker's own bridges (other jobs, the node's gateway)
    "192.168.0.0/16",  # private
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the broadcast address
)
"""Destinations no learner may route to (besides the node itself, dropped on INPUT)."""
NETWORK_LABEL_JOB = "trainyard.job"
NETWORK_LABEL_NODE = "trainyard.node"
NOT_FOUND = 404
ENGINE_ERRORS = (DockerError, aiohttp.ClientError, OSError)
"""What a refusing, failing or unreachable engine raises (as in docker_runtime)."""
_BRIDGE = re.compile(r"-i (" + re.escape(PREFIX) + r"[0-9a-f]{12})\b")
Rule = list[str]


def joins_network(spec: LearnerSpec) -> bool:
    """Whether the learner's container joins its job's network: its tenant may use the network,
    or it has peers to meet (a single learner without the network has none at all)."""
    return spec.network or (spec.place is not None and spec.place.world_size > 1)


def network_name(job_id: UUID) -> str:
    """The job's network and bridge: 15 characters at most, the limit of a Linux interface."""
    return PREFIX + hashlib.sha256(str(job_id).encode()).hexdigest()[:12]


def forward_rules(bridge: str, *, ipv6: bool) -> list[Rule]:
    """The rules of `FORWARD_CHAIN` for one job's bridge, in order."""
    rules = [["-i", bridge, "-o", bridge, "-j", "RETURN"]]  # the job's own learners
    if ipv6:
        rules.append(["-i", bridge, "-j", "DROP"])
    else:
        rules += [["-i", bridge, "-d", net, "-j", "DROP"] for net in BLOCKED_V4]
    # Into the network: only the replies to what its learners opened.
    established = ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"]
    rules += [["-o", bridge, *established], ["-o", bridge, "-j", "DROP"]]
    return rules


def input_rules(bridge: str) -> list[Rule]:
    """The rules of `INPUT_CHAIN` for one job's bridge: nothing reaches the node itself."""
    return [["-i", bridge, "-j", "DROP"]]


class FirewallError(Exception):
    """iptables refused or is missing; the message says which command and why."""


class Firewall:
    """Our chains in iptables, and in ip6tables where it works."""

    def __init__(self) -> None:
        self._programs: list[tuple[str, bool]] | None = None
        """Each program and whether it is the IPv6 one; found on first use."""
        self._lock = asyncio.Lock()

    async def isolate(self, bridge: str) -> None:
        """Install the bridge's rules (again: it is idempotent); FirewallError if it cannot."""
        async with self._lock:
            for program, ipv6 in await self._found():
                await self._chains(program)
                for chain, rules in self._rules(bridge, ipv6=ipv6):
                    for rule in rules:
                        if (await _run(program, "-C", chain, *rule))[0] != 0:
                            await _check(program, "-A", chain, *rule)

    async def release(self, bridge: str) -> None:
        """Remove the bridge's rules (those that are there)."""
        async with self._lock:
            for program, ipv6 in await self._found():
                for chain, rules in self._rules(bridge, ipv6=ipv6):
                    for rule in rules:
                        while (await _run(program, "-D", chain, *rule))[0] == 0:
                            pass  # added twice by agents racing: every copy goes

    async def bridges(self) -> set[str]:
        """The bridges our chains hold rules for."""
        found: set[str] = set()
        for program, _ in await self._found():
            for chain in (FORWARD_CHAIN, INPUT_CHAIN):
                code, out, _ = await _run(program, "-S", chain)
                if code == 0:
                    found.update(_BRIDGE.findall(out))
        return found

    def _rules(self, bridge: str, *, ipv6: bool) -> list[tuple[str, list[Rule]]]:
        return [
            (FORWARD_CHAIN, forward_rules(bridge, ipv6=ipv6)),
            (INPUT_CHAIN, input_rules(bridge)),
        ]

    async def _found(self) -> list[tuple[str, bool]]:
        if self._programs is None:
            programs = []
            for name, ipv6 in (("iptables", False), ("ip6tables", True)):
                path = shutil.which(name)
                # ip6tables "where present": installed, and working in this kernel.
                if path is not None and (ipv6 is False or (await _run(path, "-S"))[0] == 0):
                    programs.append((path, ipv6))
            if not programs or programs[0][1]:
                raise FirewallError("iptables is not installed")
            self._programs = programs
        return self._programs

    async def _chains(self, program: str) -> None:
        """Our chains, and the jumps to them at the top of DOCKER-USER and INPUT."""
        for chain, parent in ((FORWARD_CHAIN, "DOCKER-USER"), (INPUT_CHAIN, "INPUT")):
            if (await _run(program, "-S", chain))[0] != 0:
                await _check(program, "-N", chain)
            if parent == "DOCKER-USER" and (await _run(program, "-S", parent))[0] != 0:
                # An engine that manages no iptables of its own (or ip6tables, before Docker
                # 27): the same place in FORWARD.
                parent = "FORWARD"
            if (await _run(program, "-C", parent, "-j", chain))[0] != 0:
                await _check(program, "-I", parent, "1", "-j", chain)


async def _run(program: str, *args: str) -> tuple[int, str, str]:
    # -w: wait for the xtables lock, which the Docker engine takes too.
    done = await commands.run(program, "-w", *args)
    return done.code, done.out, done.err


async def _check(program: str, *args: str) -> None:
    code, _, err = await _run(program, *args)
    if code != 0:
        command = " ".join([program, *args])
        raise FirewallError(f"`{command}` failed (exit {code}): {err.strip()}")


class JobNetworks:
    """The jobs' networks on one Docker engine, and their rules."""

    def __init__(self, docker: aiodocker.Docker, firewall: Firewall | None = None) -> None:
        self._docker = docker
        self._firewall = firewall or Firewall()

    async def prepare(self, spec: LearnerSpec, *, internal: bool = False) -> str:
        """The name of the job's network, created (for its first learner here) and isolated;
        `internal`: with no route out (a tenant without the network). LearnerStartError saying
        why it cannot be (nothing is left behind then)."""
        name = network_name(spec.job_id)
        try:
            await self._create(spec, name, internal=internal)
            await self._firewall.isolate(name)
        except (*ENGINE_ERRORS, FirewallError) as exc:
            await self.release(spec.job_id)
            message = exc.message if isinstance(exc, DockerError) else str(exc)
            raise LearnerStartError(f"cannot give the job a network of its own: {message}") from exc
        return name

    async def _create(self, spec: LearnerSpec, name: str, *, internal: bool) -> None:
        try:
            await self._docker.networks.get(name)
            return  # another learner of the job made it
        except DockerError as exc:
            if exc.status != NOT_FOUND:
                raise
        await self._docker.networks.create(
            {
                "Name": name,
                "Driver": "bridge",
                "CheckDuplicate": True,
                "Internal": internal,
                "Options": {
                    "com.docker.network.bridge.name": name,
                    # The job's learners reach each other (a job's distributed training).
                    "com.docker.network.bridge.enable_icc": "true",
                },
                "Labels": {NETWORK_LABEL_JOB: str(spec.job_id), NETWORK_LABEL_NODE: spec.node},
            }
        )

    async def release(self, job_id: UUID) -> None:
        """Remove the job's network and its rules, once no container of the job is attached
        (the engine refuses while one is: the last learner's removal takes it). Logged, not
        raised: the next agent's sweep takes what is left."""
        await self._release(network_name(job_id))

    async def _release(self, name: str) -> None:
        try:
            await (await self._docker.networks.get(name)).delete()
        except DockerError as exc:
            if exc.status != NOT_FOUND:
                log.debug("network %s stays for now: %s", name, exc.message)
                return
        except ENGINE_ERRORS as exc:
            log.warning("cannot remove network %s: %s", name, exc)
            return
        try:
            await self._firewall.release(name)
        except (FirewallError, OSError) as exc:
            log.warning("cannot remove the rules of network %s: %s", name, exc)

    async def sweep(self, node: str) -> None:
        """What an earlier agent of `node` left: its jobs' networks that no container uses,
        and rules of bridges that no longer exist (whichever agent made them)."""
        # The rules first, then the networks: a network made meanwhile by another agent has
        # rules this listing cannot hold (they follow its creation), so none are taken from it.
        try:
            bridges = await self._firewall.bridges()
        except (FirewallError, OSError):
            bridges = set()  # no iptables here: no rules to sweep (nor networks to isolate)
        networks = await self._docker.networks.list(filters={"name": [PREFIX]})
        for network in networks:
            labels = network.get("Labels") or {}
            if labels.get(NETWORK_LABEL_NODE) != node or not network["Name"].startswith(PREFIX):
                continue
            detail = await (await self._docker.networks.get(network["Id"])).show()
            if not detail.get("Containers"):
                await self._release(network["Name"])
        names = {network["Name"] for network in networks}
        for bridge in bridges - names:
            await self._firewall.release(bridge)
