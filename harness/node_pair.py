"""Two nodes on one machine: two network namespaces, joined by a veth pair on a test subnet (their
"cluster network"), for the tests and the benchmark of a job's network across nodes (each agent
runs in one, `in_ns`). What the agents' jobs leave in `/run/netns` under the given work
directories is removed with them."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from node_agent.job_netns import NETNS_DIR, JobNamespaces

NODE_ADDRESSES = {"a": "192.0.2.1", "b": "192.0.2.2"}
"""The two nodes' addresses on their cluster network (TEST-NET-1: no real network's)."""


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout


def in_ns(name: str, *argv: str) -> list[str]:
    """`argv` in the network namespace `name` (nsenter: `ip netns exec` would also give it a
    mount namespace of its own, in which the namespaces an agent makes are not seen outside)."""
    return ["nsenter", f"--net={NETNS_DIR / name}", *argv]


@contextmanager
def node_pair(work: Mapping[str, Path]) -> Iterator[dict[str, str]]:
    """Node ("a", "b") -> its network namespace; `work`: the agents' work directories, whose
    jobs' namespaces go too."""
    tag = uuid.uuid4().hex[:6]
    names = {node: f"tyt-{tag}-{node}" for node in NODE_ADDRESSES}
    try:
        for name in names.values():
            sh("ip", "netns", "add", name)
            sh("ip", "-n", name, "link", "set", "lo", "up")
        a, b = names["a"], names["b"]
        sh("ip", "-n", a, "link", "add", "cluster0", "type", "veth", "peer", "cluster0", "netns", b)
        for node, name in names.items():
            sh("ip", "-n", name, "addr", "add", f"{NODE_ADDRESSES[node]}/24", "dev", "cluster0")
            sh("ip", "-n", name, "link", "set", "cluster0", "up")
        yield names
    finally:
        prefixes = []
        for folder in work.values():
            made = JobNamespaces.open(folder)
            assert isinstance(made, JobNamespaces), made
            prefixes.append(made.name(uuid.UUID(int=0)).removesuffix(str(uuid.UUID(int=0))))
        for entry in NETNS_DIR.iterdir():  # what a failed test left of its jobs
            if entry.name.startswith(tuple(prefixes)):
                subprocess.run(["ip", "netns", "delete", entry.name], check=False)
        for name in names.values():
            subprocess.run(["ip", "netns", "delete", name], check=False)
