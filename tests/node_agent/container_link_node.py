"""One node's Docker runtime, as far as its jobs' links go: run by `test_container_links` inside
a node's network namespace (`nsenter --net=/run/netns/NODE python -m
tests.node_agent.container_link_node SPEC`), where the real `DockerRuntime` starts learner
containers of jobs whose learners span nodes, with the node's `ip` and `iptables`, on the one
Docker engine of the machine.

SPEC (JSON): `work` (a folder the learners' folders go in), `node` (the node's name, its
containers' label), `addresses` (every node's address), `image`, `port`, `jobs` (each `job`,
`index`, `nodes`, `learners`: how many of its learners run here; learner i listens on `port` +
i). It prints one JSON line once every learner has started: job -> its containers' ids and its
holder's name. Then a line `release` removes the learners (the jobs' last learners here) and
prints `released`; at the end of its input without one it leaves them, as an agent that died
does. With `sweep` instead of `jobs`, it is a restarted agent: it finds the node's learners
(sweeping what no running learner uses) and prints `swept`; with `adopt` too, a restarted agent
that adopts the jobs' running learners here instead of starting them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import aiodocker

from node_agent.docker_runtime import DockerRuntime
from node_agent.job_links import DEFAULT_RANGE, AddressPlan, JobLink, job_link
from node_agent.runtime import Folder, Learner, LearnerSpec

LEARNER_UID = 200457
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


def holder_name(node: str, job: UUID) -> str:
    """`ContainerLinks.name`, for the test to check what is left."""
    return f"trainyard-c{hashlib.sha256(node.encode()).hexdigest()[:8]}-{job}"


def learner_spec(
    spec: dict[str, Any], job: dict[str, Any], learner: int, link: JobLink
) -> LearnerSpec:
    """The spec of the job's `learner`-th learner here (as an agent would make it again)."""
    node = str(spec["node"])
    job_id = UUID(job["job"])
    work = Path(str(spec["work"]))
    workdir = work / f"{node}-{job_id}-{learner}"
    return LearnerSpec(
        job_id=job_id,
        attempt=1,
        # Unique in the job, as the claim numbers them: a container's name is the engine's,
        # which both nodes share here.
        learner=job["nodes"].index(node) * 100 + learner,
        epoch=1,
        node=node,
        image=str(spec["image"]),
        command=["python3", "-c", LISTEN, str(int(spec["port"]) + learner)],
        env={},
        workdir=workdir,
        gpus=[],
        cpus=0.5,
        memory_mb=256,
        user=(LEARNER_UID, LEARNER_UID),
        folders=[Folder(work, workdir)],
        link=link,
    )


async def main(spec: dict[str, Any]) -> None:
    async with aiodocker.Docker() as docker:
        runtime = DockerRuntime(docker)
        node = str(spec["node"])
        found = await runtime.find(node) if spec.get("sweep") or spec.get("adopt") else []
        if spec.get("sweep"):
            print("swept", flush=True)
            return
        plan = AddressPlan.parse(DEFAULT_RANGE)
        learners: list[Learner] = []
        started: dict[str, dict[str, object]] = {}
        for job in spec["jobs"]:
            link = job_link(plan, job["index"], job["nodes"], node, spec["addresses"])
            ids = []
            for learner in range(job["learners"]):
                wanted = learner_spec(spec, job, learner, link)
                if spec.get("adopt"):
                    [running] = [
                        one
                        for one in found
                        if (one.job_id, one.learner) == (wanted.job_id, wanted.learner)
                    ]
                    adopted = await runtime.adopt(wanted, running)
                    assert adopted is not None
                    learners.append(adopted)
                    ids.append(running.handle)
                else:
                    started_one = await runtime.start(wanted)
                    learners.append(started_one)
                    ids.append(started_one.id)
            started[job["job"]] = {"containers": ids, "holder": holder_name(node, UUID(job["job"]))}
        print(json.dumps(started), flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() == "release":
            for learner_ in learners:
                await learner_.remove()
            print("released", flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
