"""A job's network across nodes for learner containers (`node_agent.container_links`): two nodes
on one machine, each a network namespace this test makes (`harness.node_pair`), each with the
real `DockerRuntime` of an agent run in it (`tests.node_agent.container_link_node`), on the
machine's one Docker engine. Job J's learner containers on node A reach the port J's learner
opened on node B and back, two learners of J on one node share its address there; job K's
cannot reach J, nor J either node or anything else, even with a route a learner could not add;
a restarted agent adopts a running learner with its link as it is; and the learners' removal
(or a restarted agent's sweep) leaves no holder, namespace, veth, route or rule behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.node_pair import NODE_ADDRESSES, in_ns, node_pair, sh
from node_agent.container_links import HOLDER_ROLE, ROLE_LABEL, holder_config, linked
from node_agent.containers import LearnerLabels, container_config
from node_agent.images import LEARNER_IMAGE
from node_agent.job_links import DEFAULT_RANGE, INSIDE, AddressPlan, job_link
from node_agent.job_netns import NETNS_DIR
from node_agent.runtime import LearnerSpec, Place
from tests.cluster import learner_space
from tests.docker_engine import containers_of, remove_containers_of, require_engine
from tests.node_agent.container_link_node import holder_name

require_engine()  # or the whole module skips (on CI: fails)
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None,
        reason="two nodes in network namespaces need root, ip and iptables",
    ),
]

REPO = Path(__file__).resolve().parents[2]
PLAN = AddressPlan.parse(DEFAULT_RANGE)
PORT = 5000
MODULE = ("tests.node_agent.container_link_node",)
PROBE_S = 1.0
"""How long a probe waits for a connection (a dropped one never comes)."""
CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
        print(c.recv(2).decode())
except OSError as exc:
    print(type(exc).__name__)
"""
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


def linked_spec(**changes: Any) -> LearnerSpec:
    link = job_link(PLAN, 4, ["a", "b"], "a", NODE_ADDRESSES)
    values: dict[str, Any] = {
        "job_id": uuid.uuid4(),
        "attempt": 1,
        "learner": 0,
        "epoch": 1,
        "node": "a",
        "image": LEARNER_IMAGE,
        "command": ["python3", "-m", "runners.launch", "--", "train"],
        "env": {},
        "workdir": Path("/work"),
        "gpus": [],
        "cpus": 1.0,
        "memory_mb": 512,
        "user": (200457, 200457),
        "place": Place(0, 2, 0, 1, 0, str(link.master), 29500, 60.0, INSIDE),
        "link": link,
    }
    return LearnerSpec(**{**values, **changes})


def test_a_linked_learner_joins_its_job_s_holder_which_has_no_network_of_docker_s() -> None:
    spec = linked_spec()
    assert (
        linked(spec)
        and not linked(linked_spec(network=True))
        and not linked(linked_spec(link=None))
    )
    holder = holder_config(spec)
    assert holder["HostConfig"]["NetworkMode"] == "none"
    assert holder["HostConfig"]["CapDrop"] == ["ALL"]
    assert holder["User"] == "200457:200457" and holder["Image"] == LEARNER_IMAGE
    assert holder["Entrypoint"] == ["python3"]
    assert holder["Labels"] == {
        LearnerLabels.JOB: str(spec.job_id),
        LearnerLabels.NODE: "a",
        ROLE_LABEL: HOLDER_ROLE,
    }
    # A learner in it goes by its job's address there, not by an alias on a Docker network.
    config = container_config(spec, request_gpus=False, network="container:holder")
    assert config["HostConfig"]["NetworkMode"] == "container:holder"
    assert "NetworkingConfig" not in config


@dataclass
class Nodes:
    names: dict[str, str]
    """Node ("a", "b") -> its network namespace."""
    docker: dict[str, str]
    """Node -> its agent's node name (its containers' label; unique per test, as the engine is
    shared)."""
    work: Path

    def agent(
        self, node: str, jobs: list[tuple[uuid.UUID, int, int]], *, adopt: bool = False
    ) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        """Node's runtime with `jobs` (id, index, learners here) across both nodes, and what it
        started (`adopt`: found running, as a restarted agent), once it has."""
        spec = {
            "adopt": adopt,
            "work": str(self.work),
            "node": self.docker[node],
            "addresses": {self.docker[n]: address for n, address in NODE_ADDRESSES.items()},
            "image": LEARNER_IMAGE,
            "port": PORT,
            "jobs": [
                {
                    "job": str(job),
                    "index": index,
                    "nodes": [self.docker["a"], self.docker["b"]],
                    "learners": n,
                }
                for job, index, n in jobs
            ],
        }
        agent = subprocess.Popen(
            in_ns(self.names[node], sys.executable, "-m", *MODULE, json.dumps(spec)),
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert agent.stdout is not None
        line = agent.stdout.readline()
        assert line, f"the runtime of node {node} ended before its learners started"
        return agent, json.loads(line)

    def sweep(self, node: str) -> None:
        spec = json.dumps({"node": self.docker[node], "sweep": True})
        out = sh(*in_ns(self.names[node], sys.executable, "-m", *MODULE, spec))
        assert out.strip() == "swept"

    def leftovers(self, node: str, holders: list[str]) -> list[str]:
        """What the jobs' links left on the node: holders, their namespaces' names, routes,
        rules, veths."""
        ns = self.names[node]
        routes = sh(*in_ns(ns, "ip", "-o", "route", "show", "proto", "213")).splitlines()
        links = [line for line in sh(*in_ns(ns, "ip", "-o", "link")).splitlines() if "tyl" in line]
        rules = [
            line
            for chain in ("TRAINYARD-LINKS", "TRAINYARD-LINKS-IN", "TRAINYARD-LINKS-OUT")
            for line in sh(*in_ns(ns, "iptables", "-w", "-S", chain)).splitlines()
            if line.startswith("-A")
        ]
        named = [name for name in holders if (NETNS_DIR / name).exists()]
        return routes + links + rules + named + containers_of(self.docker[node])


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    work = learner_space() / f"links-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    work.chmod(0o711)
    docker = {node: f"test-{uuid.uuid4().hex[:8]}-{node}" for node in NODE_ADDRESSES}
    with node_pair({}) as names:
        yield Nodes(names, docker, work)
        for name in docker.values():  # what a failed test left
            remove_containers_of(name)
            prefix = holder_name(name, uuid.UUID(int=0)).removesuffix(str(uuid.UUID(int=0)))
            for entry in NETNS_DIR.iterdir():
                if entry.name.startswith(prefix):
                    subprocess.run(["ip", "netns", "delete", entry.name], check=False)
    shutil.rmtree(work, ignore_errors=True)


def probe(container: str, address: str, port: int = PORT) -> str:
    """What a process in `container` gets connecting to `address`: "hi" when it got through."""
    argv = ("docker", "exec", container, "python3", "-c", CONNECT, address, str(port), str(PROBE_S))
    return sh(*argv).strip()


def listen(ns: str) -> subprocess.Popen[str]:
    server = subprocess.Popen(
        in_ns(ns, sys.executable, "-c", LISTEN, str(PORT)), stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    assert server.stdout.readline().strip() == "listening"
    return server


def test_a_job_s_containers_reach_each_other_across_nodes_and_nothing_else(nodes: Nodes) -> None:
    j, k = uuid.uuid4(), uuid.uuid4()
    # Two of J's learners on node A (they share its address there), one on B; one of K's each.
    a, started_a = nodes.agent("a", [(j, 1, 2), (k, 2, 1)])
    b, started_b = nodes.agent("b", [(j, 1, 1), (k, 2, 1)])
    servers = [listen(name) for name in nodes.names.values()]  # the nodes' own services
    holders = [started[str(job)]["holder"] for started in (started_a, started_b) for job in (j, k)]
    try:
        j_a, j_b = (str(PLAN.address(1, rank)) for rank in (0, 1))
        k_b = str(PLAN.address(2, 1))
        [j_a0, j_a1] = started_a[str(j)]["containers"]
        [j_b0] = started_b[str(j)]["containers"]
        [k_a0] = started_a[str(k)]["containers"]

        # J's learners reach each other across the nodes, both ways, on the ports they opened;
        # both of J's learners on A are at J's address there.
        assert probe(j_a0, j_b) == "hi"
        assert probe(j_b0, j_a) == "hi"
        assert probe(j_b0, j_a, PORT + 1) == "hi"
        assert probe(j_a1, j_b) == "hi"
        assert probe(k_a0, k_b) == "hi"
        # K does not reach J; J reaches neither node, nor anything else (no route at all).
        assert probe(k_a0, j_b) != "hi"
        for address in (*NODE_ADDRESSES.values(), "10.0.0.1", "169.254.169.254", "172.17.0.1"):
            assert probe(j_a0, address) != "hi", address
        # Even with a route, which a learner cannot add (its container has no capability), the
        # firewall drops them: the node itself (INPUT), the other node, another job's address.
        for holder in (started_a[str(j)]["holder"], started_a[str(k)]["holder"]):
            sh("ip", "-n", holder, "route", "add", "default", "dev", INSIDE)
        for address in (*NODE_ADDRESSES.values(), k_b):
            assert probe(j_a0, address) != "hi", address
        assert probe(k_a0, j_b) != "hi"
        # Nothing on the nodes but J's peers opens a connection into J.
        for ns in nodes.names.values():
            assert (
                sh(*in_ns(ns, sys.executable, "-c", CONNECT, j_a, str(PORT), str(PROBE_S))).strip()
                != "hi"
            )
        # The learners cannot change their network.
        tried = subprocess.run(
            [
                "docker",
                "exec",
                j_a0,
                "python3",
                "-c",
                "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert tried.returncode != 0 and "PermissionError" in tried.stderr, tried

        for agent in (a, b):
            assert agent.stdin is not None and agent.stdout is not None
            agent.stdin.write("release\n")
            agent.stdin.flush()
            assert agent.stdout.readline().strip() == "released"
    finally:
        for process in [*servers, a, b]:
            process.kill()
            process.wait()
    assert nodes.leftovers("a", holders) == [] and nodes.leftovers("b", holders) == []


def test_a_restarted_agent_sweeps_the_holders_and_links_an_agent_that_died_left(
    nodes: Nodes,
) -> None:
    j = uuid.uuid4()
    agent, started = nodes.agent("a", [(j, 7, 1)])
    holder = started[str(j)]["holder"]
    assert agent.stdin is not None
    agent.stdin.close()  # it ends without a word, its job's learner and link left as they were
    agent.wait(timeout=10)
    assert nodes.leftovers("a", [holder]) != []
    nodes.sweep("a")  # the learner still runs: its holder and link stay
    [learner] = started[str(j)]["containers"]
    assert (NETNS_DIR / holder).exists()
    sh("docker", "rm", "--force", learner)  # it ended (or was killed) while no agent was there
    nodes.sweep("a")
    assert nodes.leftovers("a", [holder]) == []


def test_a_restarted_agent_adopts_a_linked_learner_and_its_removal_takes_the_link(
    nodes: Nodes,
) -> None:
    j = uuid.uuid4()
    died, started_a = nodes.agent("a", [(j, 5, 1)])
    b, started_b = nodes.agent("b", [(j, 5, 1)])
    holders = [started_a[str(j)]["holder"], started_b[str(j)]["holder"]]
    assert died.stdin is not None
    died.stdin.close()  # node A's agent ends without a word; its learner runs on
    died.wait(timeout=10)
    again, adopted = nodes.agent("a", [(j, 5, 1)], adopt=True)
    try:
        # The same container, still linked (its link was not made again under it).
        assert adopted == started_a
        [j_b0] = started_b[str(j)]["containers"]
        assert probe(j_b0, str(PLAN.address(5, 0))) == "hi"
        for agent in (again, b):
            assert agent.stdin is not None and agent.stdout is not None
            agent.stdin.write("release\n")
            agent.stdin.flush()
            assert agent.stdout.readline().strip() == "released"
    finally:
        for process in (again, b):
            process.kill()
            process.wait()
    assert nodes.leftovers("a", holders) == [] and nodes.leftovers("b", holders) == []
