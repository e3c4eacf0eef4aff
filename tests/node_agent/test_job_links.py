"""A job's network across nodes: two agents on one machine act as two nodes, each in a network
namespace this test makes (joined by a veth pair on a test subnet, their "cluster network"), and
the real `JobNamespaces` of each (`tests.node_agent.link_node`, run in its node's network
namespace, `tests.node_agent.node_pair`)
links two jobs' namespaces across them. A process in job J's namespace on node A reaches a port
opened in J's namespace on node B and back; job K's cannot, nor can J reach either node or
anything else, even with routes a learner could not add; no capability-less learner can change
its address; and the jobs' ends (or a restarted agent's sweep) leave no namespace, veth, route or
rule behind.

The address plan and the rules are pure, and are tested without root here too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from controlplane.agent_port.vocabulary import NodeAddress
from harness.node_pair import NODE_ADDRESSES, in_ns, node_pair, sh
from node_agent.job_links import (
    DEFAULT_RANGE,
    INSIDE,
    AddressPlan,
    JobLink,
    LinkError,
    Peer,
    forward_rules,
    job_link,
    unlinked_because,
    veth_name,
)
from node_agent.job_netns import NETNS_DIR, JobNamespaces

REPO = Path(__file__).resolve().parents[2]
PLAN = AddressPlan.parse(DEFAULT_RANGE)
PORT = 5000
MODULE = ("tests.node_agent.link_node",)
PROBE_S = 1.0
"""How long a probe waits for a connection (a dropped one never comes)."""

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
RECEIVE = """
import socket, sys
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind(("0.0.0.0", int(sys.argv[1])))
print("listening", flush=True)
while True:
    print(server.recv(100).decode(), flush=True)
"""
SEND = """
import socket, sys
sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sender.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
"""
CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
        print(c.recv(2).decode())
except OSError as exc:
    print(type(exc).__name__)
"""


# The plan and the rules (no root needed).


def test_a_job_s_block_is_numbered_by_its_index_and_its_node_rank_is_its_host() -> None:
    assert PLAN.blocks == 65536
    assert PLAN.block(0) == IPv4Network("10.224.0.0/27")
    assert PLAN.block(9) == IPv4Network("10.224.1.32/27")
    assert PLAN.block(65535) == IPv4Network("10.255.255.224/27")
    assert PLAN.address(9, 0) == IPv4Address("10.224.1.33")
    assert PLAN.address(9, 29) == IPv4Address("10.224.1.62")
    with pytest.raises(LinkError, match="outside the 65536 blocks"):
        PLAN.block(65536)
    with pytest.raises(LinkError, match="at most 30 nodes"):
        PLAN.address(9, 30)
    with pytest.raises(ValueError, match="smaller than one job's block"):
        AddressPlan.parse("10.224.0.0/28")


def test_a_node_s_link_has_the_job_s_address_there_and_its_peers_via_their_nodes() -> None:
    link = job_link(PLAN, 3, ["n0", "n1", "n2"], "n1", {"n0": "192.0.2.7", "n2": "192.0.2.9"})
    assert link.address == IPv4Address("10.224.0.98")
    assert link.peers == (
        Peer(IPv4Address("10.224.0.97"), IPv4Address("192.0.2.7")),
        Peer(IPv4Address("10.224.0.99"), IPv4Address("192.0.2.9")),
    )
    with pytest.raises(LinkError, match="node n2 has no address recorded"):
        job_link(PLAN, 3, ["n0", "n1", "n2"], "n1", {"n0": "192.0.2.7"})
    with pytest.raises(LinkError, match="is not IPv4"):
        job_link(PLAN, 3, ["n0", "n1"], "n1", {"n0": "fe80::1"})


def test_a_job_is_linked_only_across_nodes_that_gave_an_address_and_plan_alike() -> None:
    """A node that numbered jobs' blocks otherwise (another --job-network, or learner uids from
    elsewhere) would give the job another running job's addresses: no node of the job links it."""
    key = PLAN.key(200000)
    assert key == "10.224.0.0/11 from uid 200000"
    alike = {"n0": NodeAddress("192.0.2.7", key), "n1": NodeAddress("192.0.2.8", key)}
    assert unlinked_because(["n0", "n1"], alike, key) is None
    reason = unlinked_because(["n0", "n1", "n2"], alike, key)
    assert reason is not None and "want of the address of n2" in reason
    other = {**alike, "n1": NodeAddress("192.0.2.8", AddressPlan.parse("10.96.0.0/11").key(200000))}
    reason = unlinked_because(["n0", "n1"], other, key)
    assert reason is not None and "n1 (10.96.0.0/11 from uid 200000)" in reason
    shifted = {**alike, "n0": NodeAddress("192.0.2.7", PLAN.key(300000))}
    reason = unlinked_because(["n0", "n1"], shifted, key)
    assert reason is not None and "n0 (10.224.0.0/11 from uid 300000)" in reason
    before = {**alike, "n0": NodeAddress("192.0.2.7", None)}  # an agent from before plans
    reason = unlinked_because(["n0", "n1"], before, key)
    assert reason is not None and "n0 (unknown)" in reason


def test_the_veth_passes_the_job_s_own_address_to_its_peers_and_nothing_else() -> None:
    link = JobLink(
        index=3,
        block=PLAN.block(3),
        address=IPv4Address("10.224.0.98"),
        peers=(Peer(IPv4Address("10.224.0.97"), IPv4Address("192.0.2.7")),),
    )
    veth = veth_name("0123456789", 3)
    assert veth == "tyl012345670003" and len(veth) == 15
    assert forward_rules(veth, link) == [
        ["-i", veth, "-s", "10.224.0.98/32", "-d", "10.224.0.97/32", "-j", "ACCEPT"],
        ["-i", veth, "-j", "DROP"],
        ["-o", veth, "-s", "10.224.0.97/32", "-d", "10.224.0.98/32", "-j", "ACCEPT"],
        ["-o", veth, "-j", "DROP"],
    ]


# Two nodes on one machine (root, iproute2, iptables).

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None,
    reason="two nodes in network namespaces need root, ip and iptables",
)


@dataclass
class Nodes:
    names: dict[str, str]
    """Node ("a", "b") -> its network namespace."""
    work: dict[str, Path]
    """Node -> its agent's work directory."""

    def agent(self, node: str, jobs: list[tuple[uuid.UUID, int]]) -> subprocess.Popen[str]:
        """Node's agent with `jobs` (id, index) linked across both nodes, once it says so."""
        spec = {
            "work": str(self.work[node]),
            "node": node,
            "addresses": NODE_ADDRESSES,
            "jobs": [{"job": str(job), "index": index, "nodes": ["a", "b"]} for job, index in jobs],
        }
        agent = subprocess.Popen(
            in_ns(self.names[node], sys.executable, "-m", *MODULE, json.dumps(spec)),
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert agent.stdout is not None
        assert agent.stdout.readline().strip() == "ready"
        return agent

    def sweep(self, node: str) -> None:
        spec = json.dumps({"work": str(self.work[node]), "sweep": True})
        out = sh(*in_ns(self.names[node], sys.executable, "-m", *MODULE, spec))
        assert out.strip() == "swept"

    def job_ns(self, node: str, job: uuid.UUID) -> str:
        made = JobNamespaces.open(self.work[node])
        assert isinstance(made, JobNamespaces)
        return made.name(job)

    def leftovers(self, node: str) -> list[str]:
        """What the jobs' links left on the node: routes, rules, veths."""
        ns = self.names[node]
        routes = sh(*in_ns(ns, "ip", "-o", "route", "show", "proto", "213")).splitlines()
        links = [line for line in sh(*in_ns(ns, "ip", "-o", "link")).splitlines() if "tyl" in line]
        rules = [
            line
            for chain in ("TRAINYARD-LINKS", "TRAINYARD-LINKS-IN", "TRAINYARD-LINKS-OUT")
            for line in sh(*in_ns(ns, "iptables", "-w", "-S", chain)).splitlines()
            if line.startswith("-A")
        ]
        return routes + links + rules


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    work = {node: tmp_path / node for node in NODE_ADDRESSES}
    for folder in work.values():
        folder.mkdir()
    with node_pair(work) as names:
        yield Nodes(names, work)


def listen(ns: str) -> subprocess.Popen[str]:
    server = subprocess.Popen(
        in_ns(ns, sys.executable, "-c", LISTEN, str(PORT)), stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    assert server.stdout.readline().strip() == "listening"
    return server


def probe(ns: str, address: str) -> str:
    """What a process in `ns` gets connecting to `address`: "hi" when it got through."""
    argv = in_ns(ns, sys.executable, "-c", CONNECT, address, str(PORT), str(PROBE_S))
    return sh(*argv).strip()


@needs_root
def test_a_job_s_learners_reach_each_other_across_nodes_and_nothing_else(nodes: Nodes) -> None:
    j, k = uuid.uuid4(), uuid.uuid4()
    agents = [nodes.agent(node, [(j, 1), (k, 2)]) for node in ("a", "b")]
    servers = []
    try:
        j_a, j_b = (str(PLAN.address(1, rank)) for rank in (0, 1))
        k_b = str(PLAN.address(2, 1))
        ns = {(job, node): nodes.job_ns(node, job) for job in (j, k) for node in ("a", "b")}
        servers = [listen(name) for name in ns.values()]
        servers += [listen(name) for name in nodes.names.values()]  # the nodes' own services

        # J's learners reach each other across the nodes, both ways, on the port they opened.
        assert probe(ns[j, "a"], j_b) == "hi"
        assert probe(ns[j, "b"], j_a) == "hi"
        assert probe(ns[k, "a"], k_b) == "hi"
        # K does not reach J; J reaches neither node, nor anything else (no route at all).
        assert probe(ns[k, "a"], j_b) != "hi"  # no route to J's block
        for address in (*NODE_ADDRESSES.values(), "10.0.0.1", "169.254.169.254"):
            assert probe(ns[j, "a"], address) != "hi", address
        # Even with a route, which a learner cannot add (below), the firewall drops them: the
        # node itself (INPUT), the other node and another job's address (FORWARD).
        sh(*in_ns(ns[j, "a"], "ip", "route", "add", "default", "dev", INSIDE))
        sh(*in_ns(ns[k, "a"], "ip", "route", "add", "default", "dev", INSIDE))
        for address in (*NODE_ADDRESSES.values(), k_b):
            assert probe(ns[j, "a"], address) != "hi", address
        assert probe(ns[k, "a"], j_b) != "hi"
        # Nothing on the nodes but J's peers opens a connection into J: not node A's own
        # processes (OUTPUT), not node B's (FORWARD on A).
        assert probe(nodes.names["a"], j_a) != "hi"
        assert probe(nodes.names["b"], j_a) != "hi"
        # No IPv6 on either end of J's veth: no path to the node's IPv6 stack.
        assert sh(*in_ns(ns[j, "a"], "ip", "-6", "-o", "addr", "show", "dev", INSIDE)) == ""
        host_end = veth_name(ns[j, "a"].split("-")[1], 1)  # trainyard-OWNER-JOB
        assert sh(*in_ns(nodes.names["a"], "ip", "-6", "-o", "addr", "show", "dev", host_end)) == ""
        # A learner (its job's uid, no capabilities) can change none of it.
        drop = ("setpriv", "--reuid=200790", "--regid=200790", "--clear-groups")
        drop += ("--inh-caps=-all", "--bounding-set=-all", "--no-new-privs")
        for change in (
            ("ip", "addr", "add", "10.224.0.40/32", "dev", INSIDE),
            ("ip", "route", "add", "default", "dev", INSIDE),
            ("ip", "link", "set", INSIDE, "down"),
        ):
            tried = subprocess.run(
                in_ns(ns[j, "b"], *drop, *change), capture_output=True, text=True, check=False
            )
            assert tried.returncode != 0 and "Operation not permitted" in tried.stderr, tried

        for server in servers:  # the learners end: their jobs' last learners here
            server.kill()
            server.wait()
        for agent in agents:
            assert agent.stdin is not None and agent.stdout is not None
            agent.stdin.write("release\n")
            agent.stdin.flush()
            assert agent.stdout.readline().strip() == "released"
    finally:
        for process in [*servers, *agents]:
            process.kill()
            process.wait()
    assert not any((NETNS_DIR / name).exists() for name in ns.values())
    assert nodes.leftovers("a") == [] and nodes.leftovers("b") == []


@needs_root
def test_a_restarted_agent_sweeps_the_links_an_agent_that_died_left(nodes: Nodes) -> None:
    j = uuid.uuid4()
    agent = nodes.agent("a", [(j, 7)])
    assert agent.stdin is not None
    agent.stdin.close()  # it ends without a word, its jobs' links left as they were
    agent.wait(timeout=10)
    assert nodes.leftovers("a") != []
    nodes.sweep("a")
    assert not (NETNS_DIR / nodes.job_ns("a", j)).exists()
    assert nodes.leftovers("a") == []


@needs_root
def test_the_rules_hold_when_docker_puts_its_jumps_back_above_them(nodes: Nodes) -> None:
    a = nodes.names["a"]
    sh(*in_ns(a, "iptables", "-w", "-N", "DOCKER-USER"))  # node A runs a Docker engine
    j = uuid.uuid4()
    agents = [nodes.agent(node, [(j, 3)]) for node in ("a", "b")]
    # One way is enough to harm (J's replies have no route back to a node): datagrams.
    server = subprocess.Popen(
        in_ns(nodes.job_ns("a", j), sys.executable, "-c", RECEIVE, str(PORT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        j_a = str(PLAN.address(3, 0))
        # What the engine does as it starts or makes a network: its jumps back at the top of
        # FORWARD, then the accepting of what its bridges send (here: everything).
        sh(*in_ns(a, "iptables", "-w", "-I", "FORWARD", "1", "-j", "ACCEPT"))
        sh(*in_ns(a, "iptables", "-w", "-I", "FORWARD", "1", "-j", "DOCKER-USER"))
        send = (sys.executable, "-c", SEND, j_a, str(PORT))
        sh(*in_ns(nodes.names["b"], *send, "from node b"))  # not J's: dropped
        sh(*in_ns(nodes.job_ns("b", j), *send, "from j"))  # J's peer: through
        assert server.stdout.readline().strip() == "from j"
    finally:
        for process in [server, *agents]:
            process.kill()
            process.wait()
