"""What a node agent asks of the control plane, one method per thing it asks, grouped by concern.
Arguments and results are plain values (`vocabulary`). A method may raise one of `UNAVAILABLE`
when the control plane cannot be reached: the agent retries it (an implementation that is
always reachable never does)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol
from uuid import UUID

from controlplane.agent_port.values import (
    Allocation,
    ClaimedTask,
    ExpiredFolders,
    InferenceJob,
    JobNews,
    QueryClaim,
    TaskResults,
    WarmUid,
)
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import NodeAddress, NodeSpec, Renewal
from controlplane.jobs.lifecycle import Command, Job
from controlplane.logs.lines import LogLine, Stream
from controlplane.scheduling.claim import Claim


class Lease(Protocol):
    """A node's registration and lease: held by one live agent at a time."""

    async def register(self, node: NodeSpec, ttl_s: float) -> datetime:
        """Take the node's lease and record its inventory; NodeNameTaken if it is held."""
        ...

    async def renew(self, name: str, agent_id: UUID, ttl_s: float) -> Renewal | None:
        """Extend the lease; None when it is no longer this agent's (the node was lost). The
        renewal says whether an operator drained the node: its agent then preempts what it
        runs, and claims nothing (claims place nothing on it anyway)."""
        ...

    async def mark_unhealthy(self, name: str, gpu: GpuInfo) -> None: ...

    async def deregister(self, name: str, agent_id: UUID) -> None: ...

    async def node_addresses(self, names: Sequence[str]) -> dict[str, NodeAddress]:
        """The addresses the nodes `names` advertise on the cluster network (their agents'
        `--node-address`, recorded as they register), of those that have one, each with its
        agent's job plan: where a job's network across nodes routes to the job's addresses on
        them (`node_agent.job_links`)."""
        ...


class JobClaims(Protocol):
    """Jobs claimed for a node, and the allocations they hold there."""

    async def claim(self, node: str, *, uids: range | None) -> list[Claim]:
        """The next jobs that fit on `node` together, each DEPLOYING with its fencing epoch
        and GPUs allocated; none when none fits (see `controlplane.agents.claims.claim`)."""
        ...

    async def release(self, node: str, job_id: UUID, attempt: int) -> None:
        """Give back the attempt's allocations on `node`."""
        ...

    async def allocations(self, node: str) -> list[Allocation]:
        """The node's live allocations (for reconciling after a restart)."""
        ...


class JobCommands(Protocol):
    """A job's lifecycle as the agent drives it (`controlplane.jobs.lifecycle`)."""

    async def current(self, job_id: UUID) -> tuple[Job | None, int]:
        """The job now, and its stream's version."""
        ...

    async def execute(self, job_id: UUID, command: Command, actor: str) -> Job:
        """Apply the command to the job as `actor` ('agent:NODE'); Refused when the job's state
        does not allow it."""
        ...

    async def news(self, job_id: UUID, after: int) -> list[JobNews]:
        """The job's events after stream version `after`, in order."""
        ...

    async def secret_env(self, job_id: UUID) -> dict[str, str]:
        """The job's secret environment (empty when it has none, or it was deleted)."""
        ...


class LogWriter(Protocol):
    """Jobs' log lines."""

    async def write_lines(self, lines: Sequence[LogLine]) -> int:
        """Store the lines, leaving out any whose (series, seq) is stored already; how many
        were stored."""
        ...

    async def log_usage(self, job_id: UUID) -> tuple[int, int]:
        """The lines and UTF-8 bytes the job's log holds over all its attempts (markers
        included)."""
        ...

    async def last_seqs(self, job_id: UUID, attempt: int) -> dict[tuple[int, Stream], int]:
        """The last stored seq of each (learner, stream) of the attempt."""
        ...


class FolderRecords(Protocol):
    """The folders nodes keep for jobs, and the learner uids they hold."""

    async def record_folders(
        self, job_id: UUID, node: str, uid: int | None, checkpoints: UUID
    ) -> None: ...

    async def expired_folders(self, node: str) -> list[ExpiredFolders]: ...

    async def forget_folders(self, job_id: UUID, node: str) -> None:
        """The node's folders of the job are gone: once no node keeps any, its uid is free."""
        ...

    async def allocate_uid(self, job_id: UUID, uids: range) -> int | None:
        """The job's learner uid, allocated from `uids` if it held none; None when every uid
        of the range is held."""
        ...

    async def hold_warm_uid(self, node: str, uids: range) -> WarmUid | None:
        """A free uid of `uids`, held for a sandbox `node` makes before its job is known, under a
        fresh placeholder: no job is given it meanwhile. None when every uid is held."""
        ...

    async def adopt_warm_uid(
        self, job_id: UUID, node: str, placeholder: UUID, checkpoints: UUID
    ) -> int | None:
        """The job takes the uid of `node`'s warm `placeholder` as its own (returned), and the uid
        its claim allocated it goes back; `node`'s folders of the job are recorded under it in
        the same step (as `record_folders(job_id, node, uid, checkpoints)`). Only while no node
        has recorded folders of the job, all its live learners are on `node`, and its uid is
        not an adopted one already; otherwise, or for a placeholder that is not `node`'s warm
        one, None and nothing changes."""
        ...

    async def release_warm_uids(self, node: str, placeholders: Sequence[UUID] | None = None) -> int:
        """`node`'s warm uids given back: those of `placeholders`, or all of the node's when None
        (an agent starting again: its earlier sandboxes are gone); how many. A uid a job adopted
        is the job's, and goes as its uid does."""
        ...


class ServingQueue(Protocol):
    """Deployments' tasks, taken by their replicas in batches."""

    async def claim_tasks(
        self,
        tenant: str,
        deployment: str,
        most_items: int,
        claim: UUID,
        replica: UUID,
        known: Sequence[UUID],
    ) -> list[ClaimedTask]:
        """Tasks taken under `claim`: those it holds besides `known` (a try whose answer was
        lost took them), else new ones, of `most_items` items at most."""
        ...

    async def finish_tasks(self, results: TaskResults) -> int:
        """Record the batch's results, fenced by its claim; how many tasks were recorded."""
        ...

    async def requeue_replica(self, replica: UUID) -> None:
        """Give back what the replica held: its deployment's tasks, or its job's queries."""
        ...


class ServingChannels(Protocol):
    """A node's replicas offered on its agent's serving channel (the control plane's direct path
    for synchronous predictions: node_agent/serving_channel.py)."""

    async def offer_channel(
        self, replica: UUID, tenant: str, deployment: str, node: str, address: str, token: str
    ) -> None:
        """Record that `replica` is reached at `address` with the bearer `token`."""
        ...

    async def withdraw_channel(self, replica: UUID) -> None:
        """`replica` is no longer reached on its agent's channel."""
        ...


class QueryQueue(Protocol):
    """An inference job's queries, taken by its replicas one at a time."""

    async def inference_job(self, job_id: UUID) -> InferenceJob | None: ...

    async def claim_query(
        self, job_id: UUID, replica: UUID, claim: UUID, node: str, present_s: float
    ) -> QueryClaim:
        """The job's next query for `replica` under `claim` (see `claim_query` in
        controlplane/inference/queries.sql); 'wait' while the job has no row yet."""
        ...

    async def finish_query(
        self,
        job_id: UUID,
        index: int,
        output: str | None,
        error: str | None,
        inference_ms: float | None,
        claim: UUID,
    ) -> int:
        """Record a query's result, fenced by its claim; 1 when recorded, 0 when the claim
        no longer held it (given back meanwhile)."""
        ...

    async def replica_present(self, job_id: UUID, replica: UUID) -> None: ...

    async def record_load_error(self, job_id: UUID, error: str) -> None: ...


class AgentPort(
    Lease,
    JobClaims,
    JobCommands,
    LogWriter,
    FolderRecords,
    ServingQueue,
    ServingChannels,
    QueryQueue,
    Protocol,
):
    """Everything a node agent asks of the control plane."""
