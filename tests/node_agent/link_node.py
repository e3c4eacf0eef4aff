"""One node's agent, as far as its jobs' links go: run by `test_job_links` inside a node's
network namespace (`nsenter --net=/run/netns/NODE python -m tests.node_agent.link_node SPEC`),
where the
real `JobNamespaces` makes the jobs' namespaces and links with the node's `ip` and `iptables`.

SPEC (JSON): `work` (the agent's work directory), `node`, `addresses` (every node's address),
`jobs` (each `job`, `index`, `nodes`). It prints `ready` once every job's namespace is linked,
then on a line `release` gives them back (the jobs' last learners here ended) and prints
`released`; at the end of its input without one it leaves them, as an agent that died does.
With `sweep` instead of `jobs`, it is a restarted agent: it sweeps and prints `swept`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from uuid import UUID

from node_agent.job_links import DEFAULT_RANGE, AddressPlan, job_link
from node_agent.job_netns import Hold, JobNamespaces


async def main(spec: dict[str, object]) -> None:
    made = JobNamespaces.open(Path(str(spec["work"])))
    assert isinstance(made, JobNamespaces), made
    if spec.get("sweep"):
        await made.sweep(set())
        print("swept", flush=True)
        return
    plan = AddressPlan.parse(DEFAULT_RANGE)
    addresses = dict(spec["addresses"])  # type: ignore[call-overload]
    holds: list[Hold] = []
    for job in spec["jobs"]:  # type: ignore[attr-defined]
        link = job_link(plan, job["index"], job["nodes"], str(spec["node"]), addresses)
        holds.append(await made.acquire(UUID(job["job"]), link))
    print("ready", flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    if line.strip() == "release":
        for hold in holds:
            await hold.release()
        print("released", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
