"""A job whose learner containers train together across nodes: two real agents with the Docker
runtime on one machine act as two nodes, each a `trainyard agent` process in a network namespace
of its own (`harness.node_pair`), on one Postgres and the machine's one Docker engine. Two jobs
of two learners, one learner of each on each agent: each job's learners meet across the nodes
through the job's network alone (`node_agent.container_links`) and sum a tensor with gloo's
all_reduce; a learner reaches its peer on the port it opened, but not the other job's learner,
nor either node, nor the machine's own services (where the control plane would be); and the
jobs' ends leave no holder, namespace name, veth, route or rule on either node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from controlplane.jobs.lifecycle import Job, JobStatus
from harness.agent_process import AgentProcess
from harness.node_pair import NODE_ADDRESSES, in_ns, node_pair, sh
from node_agent.images import LEARNER_IMAGE
from node_agent.job_netns import NETNS_DIR
from node_agent.learners import learner_dir
from tests.cluster import Plane, learner_space
from tests.docker_engine import containers_of, remove_containers_of, require_engine
from tests.node_agent.container_link_node import holder_name
from tests.polling import eventually

require_engine()  # or the whole module skips (on CI: fails)
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None,
        reason="two agents as two nodes need root, ip and iptables",
    ),
]

PORT = 7000
"""Where each learner listens (in its job's network: the jobs' own, so both can)."""
SERVICE_PORT = 7100
"""Where the nodes' and the machine's own services listen."""
SERVE = f"""
import socket, threading
def serve():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", {PORT}))
    server.listen()
    while True:
        connection, _ = server.accept()
        connection.sendall(b"hi")
        connection.close()
threading.Thread(target=serve, daemon=True).start()
"""
TOGETHER = """
import datetime, os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print("sum", int(total.item()), "at", os.environ["MASTER_ADDR"], flush=True)
"""
OTHER_JOB = (
    SERVE
    + TOGETHER
    + """
while not os.path.exists("stop"):  # the test's word, in its working directory
    time.sleep(0.1)
dist.barrier()
"""
)
PROBING_JOB = (
    SERVE
    + TOGETHER
    + """
import json, socket, sys
for name, host, port in [("peer", os.environ["MASTER_ADDR"], 7000), *json.loads(sys.argv[1])]:
    try:
        socket.create_connection((host, port), timeout=1).close()
        print("reached", name, flush=True)
    except OSError:
        print("blocked", name, flush=True)
dist.barrier()
"""
)
LISTEN = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(sys.argv[1])))
server.listen()
print("listening", flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(b"hi")
    connection.close()
"""


def ended(job: Job) -> bool:
    return job.state in (JobStatus.COMPLETED, JobStatus.FAILED)


def listen(*prefix: str) -> subprocess.Popen[str]:
    server = subprocess.Popen(
        [*prefix, sys.executable, "-c", LISTEN, str(SERVICE_PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    assert server.stdout.readline().strip() == "listening"
    return server


def machine_address() -> str:
    """The machine's own address (outside the nodes' namespaces), where a control plane on it
    listens."""
    return sh("hostname", "-I").split()[0]


def leftovers(ns: str, node: str, jobs: list[uuid.UUID]) -> list[str]:
    routes = sh(*in_ns(ns, "ip", "-o", "route", "show", "proto", "213")).splitlines()
    links = [line for line in sh(*in_ns(ns, "ip", "-o", "link")).splitlines() if "tyl" in line]
    rules = [
        line
        for chain in ("TRAINYARD-LINKS", "TRAINYARD-LINKS-IN", "TRAINYARD-LINKS-OUT")
        for line in sh(*in_ns(ns, "iptables", "-w", "-S", chain)).splitlines()
        if line.startswith("-A")
    ]
    named = [str(job) for job in jobs if (NETNS_DIR / holder_name(node, job)).exists()]
    return routes + links + rules + named + containers_of(node)


@pytest.fixture
def node_names() -> Iterator[dict[str, str]]:
    """Node ("a", "b") -> its agent's name: the test's own, as the engine is shared."""
    tag = uuid.uuid4().hex[:8]
    names = {node: f"dx-{tag}-{node}" for node in NODE_ADDRESSES}
    yield names
    for name in names.values():  # what a failed test left
        remove_containers_of(name)
        prefix = holder_name(name, uuid.UUID(int=0)).removesuffix(str(uuid.UUID(int=0)))
        for entry in NETNS_DIR.iterdir():
            if entry.name.startswith(prefix):
                subprocess.run(["ip", "netns", "delete", entry.name], check=False)


async def test_two_jobs_learner_containers_meet_across_two_agents_and_reach_nothing_else(
    plane: Plane, db_url: str, node_names: dict[str, str]
) -> None:
    space = learner_space()
    work = {node: space / node for node in NODE_ADDRESSES}
    with node_pair(work) as names:
        agents = [
            AgentProcess(
                db_url,
                work[node],
                node_names[node],
                runtime="docker",
                fake_gpus=0,
                prefix=tuple(in_ns(names[node])),
                options=("--node-address", address, "--cpus", "2", "--poll", "0.2"),
            )
            for node, address in NODE_ADDRESSES.items()
        ]
        # The nodes' own services, and the machine's (where a control plane on it listens).
        services = [listen(*in_ns(ns)) for ns in names.values()] + [listen()]
        try:
            for agent in agents:
                await agent.start(plane.pool)
            shape = {"learners": 2, "learners_per_node": 1, "gpus_per_learner": 0, "cpus": 1}
            other = await plane.submit(["python3", "-c", OTHER_JOB], image=LEARNER_IMAGE, **shape)

            async def other_met() -> bool:
                job = await plane.until(other, lambda _: True)
                assert not ended(job), (job.failure_reason, await plane.log_text(other))
                return any(line.startswith("sum") for line in await plane.log_text(other))

            await eventually(other_met, seconds=120)
            met = [line for line in await plane.log_text(other) if line.startswith("sum")]
            other_master = met[0].split()[-1]
            targets = [
                ("other job", other_master, PORT),
                *(
                    (f"node {node}", address, SERVICE_PORT)
                    for node, address in NODE_ADDRESSES.items()
                ),
                ("machine", machine_address(), SERVICE_PORT),
                ("metadata", "169.254.169.254", 80),
            ]
            probing = await plane.submit(
                ["python3", "-c", PROBING_JOB, json.dumps(targets)], image=LEARNER_IMAGE, **shape
            )
            done = await plane.until(probing, ended, seconds=120)
            lines = await plane.log_text(probing)
            assert done.state is JobStatus.COMPLETED, (done.failure_reason, lines)
            running = await plane.until(other, lambda _: True)
            for index in (0, 1):
                for folder in work.values():
                    found = learner_dir(folder, other, running.attempt, index)
                    if found.exists():
                        (found / "stop").touch()
            finished = await plane.until(other, ended, seconds=60)
            assert finished.state is JobStatus.COMPLETED, finished.failure_reason

            # Both of each job's learners summed 1 + 2, across the nodes.
            assert set(done.nodes) == set(node_names.values())
            assert sorted(line.split()[1] for line in lines if line.startswith("sum")) == ["3", "3"]
            # Each reached its peer (on the other node, or itself for rank 0), nothing else.
            probes = sorted(line for line in lines if line.startswith(("reached", "blocked")))
            assert probes == sorted(
                ["reached peer"] * 2 + [f"blocked {name}" for name, _, _ in targets] * 2
            ), lines

            async def clean() -> bool:
                return not any(
                    leftovers(names[node], node_names[node], [other, probing])
                    for node in NODE_ADDRESSES
                )

            await eventually(clean)
        finally:
            for agent in agents:
                await agent.stop()
            for service in services:
                service.kill()
                service.wait()
