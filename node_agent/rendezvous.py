"""Where a job's learners meet: each learner's place in its job's process group (torch's
`env://` contract, `runtime.Place`), a pure function of the claim.

Rank 0 keeps torch's TCP store at MASTER_ADDR:MASTER_PORT; every rank connects to it. On one
node the job's learners share a network of their own (a network namespace for processes, see
`node_agent.job_netns`; a Docker network for containers, see `node_agent.networks`), so rank 0
is reachable at a name the agent knows before any learner starts: 127.0.0.1 for processes, its
container's alias on the job's network for containers. A job whose sandboxed processes or
containers span nodes has a network across them (`node_agent.job_links`,
`node_agent.container_links`): rank 0 is at the job's address on its node, which every node
computes from the job's uid alone. Other jobs across nodes (a networked tenant's processes or
containers, an agent that is not root) have no such network yet: they get rank 0's local
address too, and fail their rendezvous within the manifest's timeout, with the reason.
"""

from __future__ import annotations

import hashlib
from uuid import UUID

from controlplane.agent_port.vocabulary import Claim
from node_agent.job_links import INSIDE, JobLink
from node_agent.runtime import Place

PORTS = range(29500, 31500)
"""MASTER_PORT's range: torchrun's default and above, below Linux's ephemeral ports (32768
on): no port the node's own services listen on, nor one the kernel hands a connection, and the
same for every rank without a word between them. The job's network already keeps other jobs
away; a new attempt gets another port, so its rank 0 never meets a rank of the last one that is
still dying."""
LOCAL_ADDRESS = "127.0.0.1"


def master_port(job_id: UUID, attempt: int) -> int:
    """The rendezvous port of the job's attempt, the same on every node that runs a learner."""
    digest = hashlib.sha256(f"{job_id}:{attempt}".encode()).digest()
    return PORTS[int.from_bytes(digest[:8], "big") % len(PORTS)]


def rank_alias(attempt: int, learner: int) -> str:
    """A learner container's name on its job's network (one attempt's rank 0 is never another
    attempt's, which may still be stopping on it)."""
    return f"learner-{learner}-attempt-{attempt}"


def places(
    claim: Claim, node: str, *, container: bool, link: JobLink | None = None
) -> dict[int, Place]:
    """The places of `node`'s learners of the claim, by learner index; `container`: whether
    they run as containers (rank 0 is then its container, by its alias); `link`: the job's
    network across nodes, where rank 0 is at the job's address on its node. A rank is its
    learner's index: the claim places a node's learners at consecutive indices, so under
    `learners_per_node` RANK is NODE_RANK * learners_per_node + LOCAL_RANK."""
    here = sorted(allocation.index for allocation in claim.on(node))
    address = rank_alias(claim.attempt, 0) if container else LOCAL_ADDRESS
    if link is not None:
        address = str(link.master)
    return {
        index: Place(
            rank=index,
            world_size=len(claim.learners),
            local_rank=here.index(index),
            local_world_size=len(here),
            node_rank=claim.nodes.index(node),
            master_addr=address,
            master_port=master_port(claim.job.job_id, claim.attempt),
            timeout_s=claim.job.manifest.rendezvous_timeout_s,
            interface=None if link is None else INSIDE,
        )
        for index in here
    }
