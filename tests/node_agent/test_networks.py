"""Networked learners (their tenant is allowed the network) on a real engine: each job gets a
bridge of its own, whose learners reach each other and the internet but not the node, other
jobs, private or link-local addresses; the network and its rules go with the job's last
container, or with the sweep of the agent that comes after one that died."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import aiodocker
import pytest
from aiodocker.exceptions import DockerError

from controlplane.jobs.lifecycle import JobStatus
from node_agent.docker_runtime import DockerLearner, DockerRuntime
from node_agent.images import LEARNER_IMAGE
from node_agent.networks import (
    BLOCKED_V4,
    FORWARD_CHAIN,
    INPUT_CHAIN,
    JobNetworks,
    forward_rules,
    network_name,
)
from node_agent.rendezvous import rank_alias
from node_agent.runtime import Folder, LearnerSpec, LearnerStartError, Place
from tests.cluster import Plane, RunningAgent
from tests.docker_engine import Engine, containers_of, docker_agent_config, require_engine

require_engine()  # or the whole module skips (on CI: fails)
pytestmark = pytest.mark.docker
if os.geteuid() != 0:
    pytest.skip("the jobs' network rules need root (iptables)", allow_module_level=True)

PORT = 8000
SERVER = f"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", {PORT}))
s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hi")
    c.close()
"""
PROBE = """
import json, socket, sys
for host, port in json.loads(sys.argv[1]):
    try:
        with socket.create_connection((host, port), timeout=2) as c:
            print(host, "reached", flush=True)
    except OSError as e:
        print(host, "blocked", type(e).__name__, flush=True)
"""


LEARNER_UID = 200456


def learner(
    tmp_path: Path, node: str, command: list[str], job_id: UUID, index: int = 0
) -> LearnerSpec:
    return LearnerSpec(
        job_id=job_id,
        attempt=1,
        learner=index,
        epoch=1,
        node=node,
        image=LEARNER_IMAGE,
        command=command,
        env={},
        workdir=tmp_path / str(job_id) / str(index),
        gpus=[],
        cpus=0.5,
        memory_mb=256,
        network=True,
        user=(LEARNER_UID, LEARNER_UID),
        folders=[Folder(tmp_path, tmp_path / str(job_id) / str(index))],
    )


def iptables(*args: str, program: str = "iptables") -> str:
    return subprocess.run([program, "-w", *args], capture_output=True, text=True).stdout


def rules_of(bridge: str, program: str = "iptables") -> list[str]:
    return [
        line
        for chain in (FORWARD_CHAIN, INPUT_CHAIN)
        for line in iptables("-S", chain, program=program).splitlines()
        if f" {bridge} " in f"{line} "
    ]


IP6TABLES = subprocess.run(["ip6tables", "-w", "-S"], capture_output=True).returncode == 0
"""Whether ip6tables works here (the rules go there too, where it does)."""


async def network_exists(docker: aiodocker.Docker, name: str) -> bool:
    try:
        await docker.networks.get(name)
        return True
    except DockerError as exc:
        if exc.status == 404:
            return False
        raise


async def address(docker: aiodocker.Docker, started: DockerLearner, network: str) -> str:
    shown = await docker.containers.container(started.id).show()
    return str(shown["NetworkSettings"]["Networks"][network]["IPAddress"])


async def gateway(docker: aiodocker.Docker, network: str) -> str:
    shown = await (await docker.networks.get(network)).show()
    return str(shown["IPAM"]["Config"][0]["Gateway"])


def host_addresses() -> list[str]:
    """The node's own IPv4 addresses other than loopback and Docker's bridges."""
    words = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return [w for w in words if "." in w and not w.startswith(("127.", "172.17."))][:2]


def routable_public() -> bool:
    """Whether the node itself reaches a public address (there is no internet in CI)."""
    try:
        with socket.create_connection(("1.1.1.1", 53), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
async def host_server() -> AsyncIterator[int]:
    """A TCP server on every address of the node (as a Postgres or the API would be)."""

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hi")
        writer.close()

    server = await asyncio.start_server(answer, "0.0.0.0", 0)
    port = int(server.sockets[0].getsockname()[1])
    async with server:
        yield port


async def first_line(started: DockerLearner) -> str:
    async for line in started.lines():
        return line.text
    raise AssertionError("no output")


async def probe(
    runtime: DockerRuntime, spec: LearnerSpec, targets: list[tuple[str, int]]
) -> dict[str, str]:
    command = ["python3", "-c", PROBE, json.dumps(targets)]
    started = await runtime.start(replace(spec, command=command))
    lines = [line.text async for line in started.lines()]
    assert (await started.wait()).succeeded, lines
    await started.remove()
    return {line.split()[0]: line.split()[1] for line in lines}


def test_a_job_s_network_name_is_a_valid_interface_name() -> None:
    name = network_name(UUID(int=1))
    assert name.startswith("ty-") and len(name) <= 15
    assert name == network_name(UUID(int=1)) != network_name(UUID(int=2))
    rules = forward_rules(name, ipv6=False)
    assert rules[0] == ["-i", name, "-o", name, "-j", "RETURN"]
    assert {r[3] for r in rules if "-d" in r} == set(BLOCKED_V4)
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"} <= set(BLOCKED_V4)
    assert {"169.254.0.0/16", "127.0.0.0/8"} <= set(BLOCKED_V4)


async def test_a_networked_learner_reaches_its_job_but_not_the_node_other_jobs_or_private_addresses(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path, host_server: int
) -> None:
    runtime = DockerRuntime(docker)
    mine, other = uuid4(), uuid4()
    server_spec = learner(tmp_path, docker_node, ["python3", "-c", SERVER], other)
    servers = [
        await runtime.start(server_spec),
        await runtime.start(learner(tmp_path, docker_node, ["python3", "-c", SERVER], mine, 1)),
    ]
    try:
        assert [await first_line(s) for s in servers] == ["listening", "listening"]
        net = network_name(mine)
        assert net != network_name(other)
        shown = await docker.containers.container(servers[1].id).show()
        assert shown["HostConfig"]["NetworkMode"] == net
        # Our rules are in place for both bridges, and the bridges are the jobs' own.
        for bridge in (net, network_name(other)):
            assert any("DROP" in rule for rule in rules_of(bridge)), iptables("-S", FORWARD_CHAIN)
            if IP6TABLES:
                assert f"-A {FORWARD_CHAIN} -i {bridge} -j DROP" in rules_of(bridge, "ip6tables")
        other_job = await address(docker, servers[0], network_name(other))
        same_job = await address(docker, servers[1], net)
        node = [await gateway(docker, net), *host_addresses()]
        targets = [
            (same_job, PORT),
            (other_job, PORT),
            ("169.254.169.254", 80),
            *[(a, host_server) for a in node],
        ]
        public = routable_public()
        if public:
            targets.append(("1.1.1.1", 53))
        outcome = await probe(runtime, learner(tmp_path, docker_node, [], mine, 0), targets)
    finally:
        for started in servers:
            await started.remove()
    assert outcome.pop(same_job) == "reached"
    if public:
        assert outcome.pop("1.1.1.1") == "reached"
    assert outcome == dict.fromkeys([other_job, "169.254.169.254", *node], "blocked")
    # The last container of each job took its network and rules with it.
    for job in (mine, other):
        assert not await network_exists(docker, network_name(job))
        assert rules_of(network_name(job)) == []
        assert rules_of(network_name(job), "ip6tables") == []
    assert containers_of(docker_node) == []


async def test_without_its_rule_the_node_would_be_reached(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path, host_server: int
) -> None:
    """The probe itself works: a container on the job's bridge without our INPUT rule reaches
    the node's server (as one on Docker's own bridge, what networked learners used to get,
    does); a learner started there puts the rule back before it joins."""
    job = uuid4()
    net = network_name(job)
    networks = JobNetworks(docker)
    await networks.prepare(learner(tmp_path, docker_node, [], job))
    try:
        target = [(await gateway(docker, net), host_server)]
        drop = ["iptables", "-w", "-D", INPUT_CHAIN, "-i", net, "-j", "DROP"]
        await asyncio.to_thread(subprocess.run, drop, check=True)
        bare_run = ["docker", "run", "--rm", "--network", net, LEARNER_IMAGE]
        bare_run += ["python3", "-c", PROBE, json.dumps(target)]
        bare = await asyncio.to_thread(subprocess.run, bare_run, capture_output=True, text=True)
        assert bare.stdout.split()[:2] == [target[0][0], "reached"], bare
        outcome = await probe(
            DockerRuntime(docker), learner(tmp_path, docker_node, [], job), target
        )
        assert set(outcome.values()) == {"blocked"}
    finally:
        await networks.release(job)
    assert not await network_exists(docker, net)


async def test_the_sweep_removes_what_a_dead_agent_left(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path
) -> None:
    job = uuid4()
    net = network_name(job)
    await JobNetworks(docker).prepare(learner(tmp_path, docker_node, [], job))
    assert await network_exists(docker, net) and rules_of(net)
    # An agent of another node leaves it alone; the next agent of this node takes it.
    await DockerRuntime(docker).find("some-other-node")
    assert await network_exists(docker, net)
    await DockerRuntime(docker).find(docker_node)
    assert not await network_exists(docker, net)
    assert rules_of(net) == []


async def test_a_learner_without_the_network_has_none(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path
) -> None:
    spec = replace(learner(tmp_path, docker_node, ["true"], uuid4()), network=False)
    started = await DockerRuntime(docker).start(spec)
    shown: dict[str, Any] = await docker.containers.container(started.id).show()
    assert shown["HostConfig"]["NetworkMode"] == "none"
    await started.wait()
    await started.remove()
    assert not await network_exists(docker, network_name(spec.job_id))


async def test_an_agent_runs_a_networked_tenant_s_job_on_its_own_network_and_removes_it(
    plane: Plane, tmp_path: Path, docker_engine: Engine, docker_node: str, host_server: int
) -> None:
    config = replace(
        docker_agent_config(tmp_path, docker_engine, name=docker_node),
        network_tenants=frozenset({"acme"}),
    )
    running = await RunningAgent(plane.url, config, fake_gpus=2).started()
    try:
        # The node's address on Docker's own bridge: where a learner on that bridge (what
        # networked learners used to get) reaches the node.
        docker0 = (await docker_bridge_gateway()) or "172.17.0.1"
        targets = [(docker0, host_server), ("169.254.169.254", 80)]
        job_id = await plane.submit(
            ["python3", "-c", PROBE, json.dumps(targets)], image=LEARNER_IMAGE
        )
        job = await plane.state(job_id, JobStatus.COMPLETED, JobStatus.FAILED)
        assert job.state is JobStatus.COMPLETED, job.failure_reason
        lines = await plane.log_text(job_id)
        assert f"{docker0} blocked" in " ".join(lines), lines
        assert "169.254.169.254 blocked" in " ".join(lines), lines
    finally:
        await asyncio.wait_for(running.finish(), 60)
    assert not await network_exists_now(network_name(job_id))
    assert rules_of(network_name(job_id)) == []


async def docker_bridge_gateway() -> str | None:
    async with aiodocker.Docker() as docker:
        shown = await (await docker.networks.get("bridge")).show()
    config = shown["IPAM"]["Config"]
    return str(config[0]["Gateway"]) if config and "Gateway" in config[0] else None


async def network_exists_now(name: str) -> bool:
    async with aiodocker.Docker() as docker:
        return await network_exists(docker, name)


async def test_a_learner_whose_network_cannot_be_isolated_does_not_start_and_leaves_nothing(
    docker: aiodocker.Docker,
    docker_node: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent that is not root, say: iptables refuses, so the learner fails to start (its
    attempt is rolled back with the reason) instead of running on an open network."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    refusing = bin_dir / "iptables"
    refusing.write_text("#!/bin/sh\necho 'Permission denied (you must be root)' >&2\nexit 4\n")
    refusing.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    spec = learner(tmp_path, docker_node, ["true"], uuid4())
    with pytest.raises(LearnerStartError, match=r"network of its own: .*you must be root"):
        await DockerRuntime(docker).start(spec)
    assert not await network_exists(docker, network_name(spec.job_id))
    assert containers_of(docker_node) == []


async def test_learners_of_a_job_without_the_network_meet_on_an_internal_one_and_reach_nothing_else(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path, host_server: int
) -> None:
    runtime = DockerRuntime(docker)
    mine, other = uuid4(), uuid4()

    def ranked(command: list[str], job_id: UUID, index: int) -> LearnerSpec:
        # A learner of a two-learner job: its place names rank 0 by its alias on the network.
        place = Place(index, 2, index, 2, 0, rank_alias(1, 0), PORT, 30.0)
        spec = learner(tmp_path, docker_node, command, job_id, index)
        return replace(spec, network=False, place=place)

    chief = await runtime.start(ranked(["python3", "-c", SERVER], mine, 0))
    strangers = await runtime.start(ranked(["python3", "-c", SERVER], other, 0))
    try:
        assert [await first_line(s) for s in (chief, strangers)] == ["listening", "listening"]
        net = network_name(mine)
        shown = await (await docker.networks.get(net)).show()
        assert shown["Internal"] is True
        other_rank_0 = await address(docker, strangers, network_name(other))
        node = [await gateway(docker, net), *host_addresses()]
        targets = [
            (rank_alias(1, 0), PORT),  # MASTER_ADDR, as the agent sets it
            (other_rank_0, PORT),
            ("169.254.169.254", 80),
            ("1.1.1.1", 53),
            *[(a, host_server) for a in node],
        ]
        outcome = await probe(runtime, ranked([], mine, 1), targets)
    finally:
        for started in (chief, strangers):
            await started.remove()
    assert outcome.pop(rank_alias(1, 0)) == "reached"
    assert outcome == dict.fromkeys([other_rank_0, "169.254.169.254", "1.1.1.1", *node], "blocked")
    for job in (mine, other):
        assert not await network_exists(docker, network_name(job))
