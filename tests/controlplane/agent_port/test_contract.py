"""The contract of every agent port (`AgentPort`): Postgres and the in-memory twin pass the same
tests. What only the claim's SQL does beyond them (fair share across tenants by weight, quotas,
concurrent agents) is tested in tests/controlplane/agents/test_claims.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest

from controlplane.agent_port.protocol import AgentPort
from controlplane.agent_port.vocabulary import (
    GpuInfo,
    JobCancelled,
    LogLine,
    NodeAddress,
    NodeNameTaken,
    NodeSpec,
    Stream,
    TaskResults,
)
from controlplane.clock import SYSTEM_CLOCK
from controlplane.jobs.lifecycle import Cancel, Complete, EnterPhase, JobStatus, Refused
from controlplane.jobs.manifest import JobManifest
from controlplane.scheduling.policy import ClaimPolicy, Order
from tests.controlplane.agent_port.conftest import Control
from tests.polling import eventually

AGENT = "agent:n1"


def manifest(
    gpus: int = 1, learners: int = 1, learners_per_node: int | None = None, priority: int = 0
) -> JobManifest:
    return JobManifest.model_validate(
        {
            "name": "job",
            "priority": priority,
            "image": "img",
            "command": ["train"],
            "gpus_per_learner": gpus,
            "learners": learners,
            "learners_per_node": learners_per_node,
            "cpus": 1,
            "memory_mb": 1024,
        }
    )


def node(name: str, gpus: int, agent_id: UUID | None = None) -> NodeSpec:
    inventory = [
        GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model="fake", memory_mb=80_000, healthy=True)
        for i in range(gpus)
    ]
    return NodeSpec(name, agent_id or uuid4(), "process", 64, 1 << 20, inventory)


def line(job_id: UUID, seq: int, text: str = "x", attempt: int = 1) -> LogLine:
    return LogLine(job_id, attempt, 0, Stream.STDOUT, seq, datetime.now(UTC), text)


async def test_a_live_lease_is_held_by_one_agent(port: AgentPort) -> None:
    first = node("n1", 1)
    lease = await port.register(first, ttl_s=60)
    assert lease > SYSTEM_CLOCK.now()
    with pytest.raises(NodeNameTaken):
        await port.register(node("n1", 1), ttl_s=60)
    assert await port.register(first, ttl_s=60) >= lease  # its own agent again: renewed
    assert await port.renew("n1", first.agent_id, ttl_s=60) is not None
    assert await port.renew("n1", uuid4(), ttl_s=60) is None
    await port.deregister("n1", first.agent_id)
    assert await port.renew("n1", first.agent_id, ttl_s=60) is None
    second = node("n1", 1)
    assert await port.register(second, ttl_s=60) > SYSTEM_CLOCK.now()  # free again


async def test_a_claim_deploys_jobs_on_free_gpus_and_never_twice(
    port: AgentPort, control: Control
) -> None:
    await port.register(node("n1", 2), ttl_s=60)
    jobs = [await control.submit(manifest()) for _ in range(3)]
    won = await port.claim("n1", uids=None)
    assert len(won) == 2  # two GPUs, one job each
    assert {c.job.job_id for c in won} < set(jobs)
    assert all(c.job.state is JobStatus.DEPLOYING and c.job.nodes == ["n1"] for c in won)
    gpus = [gpu for c in won for learner in c.learners for gpu in learner.gpus]
    assert sorted(gpus) == ["GPU-n1-0", "GPU-n1-1"]
    assert len({c.epoch for c in won}) == 2
    assert all(c.job.epoch == c.epoch for c in won)
    assert await port.claim("n1", uids=None) == []  # no GPU left, and no job claimed twice
    held = await port.allocations("n1")
    assert sorted((a.job_id, a.learner) for a in held) == sorted((c.job.job_id, 0) for c in won)
    for c in won:
        _, version = await port.current(c.job.job_id)
        assert version == c.version

    first = won[0]
    await control.cancel(first.job.job_id)
    await port.release("n1", first.job.job_id, first.attempt)
    assert [a.job_id for a in await port.allocations("n1")] == [won[1].job.job_id]
    (last,) = await port.claim("n1", uids=None)
    assert last.job.job_id not in {c.job.job_id for c in won}
    assert last.learners[0].gpus == first.learners[0].gpus
    assert last.epoch > max(c.epoch for c in won)


@pytest.mark.parametrize(
    ("order", "first"), [(Order.FIFO, "low"), (Order.PRIORITY, "high")], ids=["fifo", "priority"]
)
async def test_claims_follow_the_policy_in_force(
    port: AgentPort, control: Control, order: Order, first: str
) -> None:
    await control.set_policy(ClaimPolicy(order=order))
    await port.register(node("n1", 1), ttl_s=60)
    jobs = {"low": await control.submit(manifest(priority=0))}
    jobs["high"] = await control.submit(manifest(priority=5))
    (won,) = await port.claim("n1", uids=None)  # one GPU: one job, the policy's first
    assert won.job.job_id == jobs[first]


async def test_a_job_of_several_learners_is_placed_on_other_nodes_too(
    port: AgentPort, control: Control
) -> None:
    await port.register(node("n1", 1), ttl_s=60)
    await port.register(node("n2", 1), ttl_s=60)
    job_id = await control.submit(manifest(learners=2))
    (won,) = await port.claim("n1", uids=None)
    assert won.job.job_id == job_id
    assert [(learner.node, learner.gpus) for learner in won.learners] == [
        ("n1", ["GPU-n1-0"]),
        ("n2", ["GPU-n2-0"]),
    ]
    assert [a.learner for a in await port.allocations("n2")] == [1]
    await port.release("n1", job_id, won.attempt)
    assert await port.allocations("n1") == []
    assert [a.learner for a in await port.allocations("n2")] == [1]  # n2 gives back its own


async def test_a_job_with_learners_per_node_takes_that_many_on_each_node_or_waits(
    port: AgentPort, control: Control
) -> None:
    await port.register(node("n1", 3), ttl_s=60)
    await port.register(node("n2", 1), ttl_s=60)
    # Two a node: n2's room for one holds none, so the job does not go 3 + 1; it waits.
    job_id = await control.submit(manifest(learners=4, learners_per_node=2))
    assert await port.claim("n1", uids=None) == []
    await port.register(node("n3", 2), ttl_s=60)
    (won,) = await port.claim("n1", uids=None)
    assert won.job.job_id == job_id
    assert [learner.node for learner in won.learners] == ["n1", "n1", "n3", "n3"]
    assert [a.learner for a in await port.allocations("n3")] == [2, 3]


async def test_nodes_advertise_their_cluster_addresses_with_their_registration(
    port: AgentPort,
) -> None:
    n1 = node("n1", 0)
    plan = "10.224.0.0/11 from uid 200000"
    await port.register(replace(n1, address="192.0.2.7", job_plan=plan), ttl_s=60)
    await port.register(node("n2", 0), ttl_s=60)  # an agent that gave none
    assert await port.node_addresses(["n1", "n2", "n3"]) == {"n1": NodeAddress("192.0.2.7", plan)}
    # Its agent restarted with another address and range: the latest registration holds.
    replan = "10.96.0.0/11 from uid 200000"
    await port.register(replace(n1, address="192.0.2.8", job_plan=replan), ttl_s=60)
    assert await port.node_addresses(["n1"]) == {"n1": NodeAddress("192.0.2.8", replan)}


async def test_an_unhealthy_gpu_is_not_claimed(port: AgentPort, control: Control) -> None:
    spec = node("n1", 2)
    await port.register(spec, ttl_s=60)
    sick = spec.gpus[0].model_copy(update={"healthy": False, "health_reason": "XID 79"})
    await port.mark_unhealthy("n1", sick)
    await control.submit(manifest())
    await control.submit(manifest())
    (won,) = await port.claim("n1", uids=None)
    assert won.learners[0].gpus == ["GPU-n1-1"]


async def test_a_drained_node_is_given_no_work_and_its_renewals_say_so(
    port: AgentPort, control: Control
) -> None:
    drained = node("n1", 1)
    await port.register(drained, ttl_s=60)
    await port.register(node("n2", 1), ttl_s=60)
    renewal = await port.renew("n1", drained.agent_id, ttl_s=60)
    assert renewal is not None and not renewal.draining
    await control.drain("n1")
    renewal = await port.renew("n1", drained.agent_id, ttl_s=60)
    assert renewal is not None and renewal.draining
    assert renewal.lease_until > SYSTEM_CLOCK.now()  # it keeps its lease

    pair = await control.submit(manifest(learners=2))
    assert await port.claim("n1", uids=None) == []  # its GPU is free, but it takes no work
    assert await port.claim("n2", uids=None) == []  # nor does another node's claim place any
    await port.register(drained, ttl_s=60)  # its agent restarted: still draining
    renewal = await port.renew("n1", drained.agent_id, ttl_s=60)
    assert renewal is not None and renewal.draining

    await control.drain("n1", draining=False)
    renewal = await port.renew("n1", drained.agent_id, ttl_s=60)
    assert renewal is not None and not renewal.draining
    (won,) = await port.claim("n1", uids=None)
    assert won.job.job_id == pair
    assert [learner.node for learner in won.learners] == ["n1", "n2"]


async def test_a_job_waits_for_a_learner_uid_and_holds_the_same_one(
    port: AgentPort, control: Control
) -> None:
    await port.register(node("n1", 2), ttl_s=60)
    uids = range(5000, 5001)
    first = await control.submit(manifest())
    second = await control.submit(manifest())
    (won,) = await port.claim("n1", uids=uids)
    assert await port.allocate_uid(won.job.job_id, uids) == 5000
    assert await port.allocate_uid(won.job.job_id, range(6000, 6010)) == 5000  # its own
    waiting = second if won.job.job_id == first else first
    assert await port.allocate_uid(waiting, uids) is None  # every uid held
    assert (await control.job(waiting)) is not None
    assert (await port.current(waiting))[0].state is JobStatus.QUEUED  # type: ignore[union-attr]


async def test_commands_follow_the_lifecycle_and_their_news_is_read_in_order(
    port: AgentPort, control: Control
) -> None:
    await port.register(node("n1", 1), ttl_s=60)
    job_id = await control.submit(manifest())
    (won,) = await port.claim("n1", uids=None)
    now = SYSTEM_CLOCK.now()
    running = await port.execute(job_id, EnterPhase(JobStatus.PROCESSING, now), AGENT)
    assert running.state is JobStatus.PROCESSING
    await control.cancel(job_id)
    news = await port.news(job_id, won.version)
    assert [n.version for n in news] == list(range(won.version + 1, won.version + 1 + len(news)))
    assert isinstance(news[-1].event, JobCancelled)
    assert await port.news(job_id, news[-1].version) == []
    with pytest.raises(Refused):
        await port.execute(job_id, Complete([0], now), AGENT)
    job, version = await port.current(job_id)
    assert job is not None and job.state is JobStatus.CANCELLED
    assert version == news[-1].version
    assert await port.current(uuid4()) == (None, 0)
    with pytest.raises(Refused):
        await port.execute(uuid4(), Cancel(reason="no such job", at=now), AGENT)


async def test_a_job_s_secret_env_is_its_own(port: AgentPort, control: Control) -> None:
    secret = await control.submit(manifest(), secret_env={"TOKEN": "s3cr3t"})
    plain = await control.submit(manifest())
    assert await port.secret_env(secret) == {"TOKEN": "s3cr3t"}
    assert await port.secret_env(plain) == {}


async def test_lines_are_stored_once_per_seq_and_counted(port: AgentPort, control: Control) -> None:
    job_id = await control.submit(manifest())
    assert await port.log_usage(job_id) == (0, 0)
    assert await port.write_lines([line(job_id, 1, "a"), line(job_id, 2, "bé")]) == 2
    assert await port.write_lines([line(job_id, 1, "a", attempt=2)]) == 1
    assert await port.log_usage(job_id) == (3, 1 + 3 + 1)
    # A batch written again (its commit went unacknowledged), and one line more: only that
    # one is stored (the lines' count is of ids reserved, a line sent again takes one more).
    batch = [line(job_id, 1, "a"), line(job_id, 2, "bé"), line(job_id, 3, "c")]
    assert await port.write_lines(batch) == 1
    assert (await port.log_usage(job_id))[1] == 1 + 3 + 1 + 1
    assert await port.last_seqs(job_id, 1) == {(0, Stream.STDOUT): 3}
    assert await port.last_seqs(job_id, 3) == {}
    with pytest.raises(ValueError, match="must increase"):
        await port.write_lines([line(job_id, 5), line(job_id, 4)])


async def test_uids_are_one_per_job_until_none_is_free(port: AgentPort) -> None:
    uids = range(7000, 7002)
    a, b, c = uuid4(), uuid4(), uuid4()
    first = await port.allocate_uid(a, uids)
    second = await port.allocate_uid(b, uids)
    assert {first, second} == {7000, 7001}
    assert await port.allocate_uid(a, uids) == first
    assert await port.allocate_uid(c, uids) is None


async def test_folders_expire_and_are_forgotten_node_by_node(
    port: AgentPort, control: Control
) -> None:
    old, later = await control.submit(manifest()), await control.submit(manifest())
    await port.record_folders(old, "n1", 7000, old)
    await port.record_folders(old, "n2", 7000, old)
    await port.record_folders(later, "n1", None, old)  # a later rung resumes from its folder
    assert await port.expired_folders("n1") == []
    await control.expire_folders(old)
    (expired,) = await port.expired_folders("n1")
    assert (expired.job_id, expired.uid, expired.checkpoints) == (old, 7000, old)
    assert expired.checkpoints_used  # by `later`, which has not expired
    await port.forget_folders(old, "n1")
    assert await port.expired_folders("n1") == []
    assert [f.job_id for f in await port.expired_folders("n2")] == [old]


async def test_a_warm_uid_is_held_from_jobs_until_given_back(port: AgentPort) -> None:
    uids = range(8000, 8002)
    warm = await port.hold_warm_uid("n1", uids)
    assert warm is not None and warm.uid in uids
    first, waiting = uuid4(), uuid4()
    assert await port.allocate_uid(first, uids) == ({*uids} - {warm.uid}).pop()
    assert await port.allocate_uid(waiting, uids) is None  # the placeholder holds the other
    assert await port.hold_warm_uid("n1", uids) is None
    assert await port.release_warm_uids("n1", [warm.placeholder]) == 1
    assert await port.allocate_uid(waiting, uids) == warm.uid


async def test_a_job_adopts_a_warm_uid_and_its_claim_s_uid_goes_back(
    port: AgentPort, control: Control
) -> None:
    await port.register(node("n1", 1), ttl_s=60)
    uids = range(8100, 8102)
    warm = await port.hold_warm_uid("n1", uids)
    assert warm is not None
    job_id = await control.submit(manifest())
    (won,) = await port.claim("n1", uids=uids)
    claimed = await port.allocate_uid(job_id, uids)
    assert claimed is not None and claimed != warm.uid
    other = uuid4()
    assert await port.allocate_uid(other, uids) is None  # both held

    resumes_from = uuid4()  # the checkpoint folder of another job (an earlier rung's)
    assert await port.adopt_warm_uid(job_id, "n1", warm.placeholder, resumes_from) == warm.uid
    assert await port.allocate_uid(job_id, uids) == warm.uid  # the job's own now
    assert await port.allocate_uid(other, uids) == claimed  # nothing had used it: it is free
    assert await port.release_warm_uids("n1") == 0  # the job's, no longer a warm one

    # Its folders on n1 recorded with the adoption, under that uid, before any is made.
    await control.expire_folders(job_id)
    (recorded,) = await port.expired_folders("n1")
    assert (recorded.job_id, recorded.uid, recorded.checkpoints) == (job_id, warm.uid, resumes_from)
    # The normal path then: held while a folder of the job is recorded, free once none is.
    await control.cancel(job_id)
    await port.release("n1", job_id, won.attempt)
    await port.forget_folders(job_id, "n1")

    async def released() -> bool:
        return await control.release_uids() == 1  # once the job's end is projected

    await eventually(released)
    assert await port.allocate_uid(uuid4(), uids) == warm.uid


async def test_an_adoption_refused_changes_nothing(port: AgentPort, control: Control) -> None:
    await port.register(node("n1", 1), ttl_s=60)
    await port.register(node("n2", 1), ttl_s=60)
    uids = range(8200, 8210)
    job_id = await control.submit(manifest())
    await port.claim("n1", uids=uids)
    claimed = await port.allocate_uid(job_id, uids)
    mine, theirs = await port.hold_warm_uid("n1", uids), await port.hold_warm_uid("n2", uids)
    assert mine is not None and theirs is not None

    assert await port.adopt_warm_uid(job_id, "n1", theirs.placeholder, job_id) is None  # n2's
    assert await port.adopt_warm_uid(job_id, "n2", theirs.placeholder, job_id) is None  # not on n2
    assert await port.adopt_warm_uid(job_id, "n1", uuid4(), job_id) is None  # no such placeholder
    await port.record_folders(job_id, "n2", claimed, job_id)  # its uid may be in use there
    assert await port.adopt_warm_uid(job_id, "n1", mine.placeholder, job_id) is None
    assert await port.allocate_uid(job_id, uids) == claimed

    # Folders were recorded under its uid once: files may be owned by it, whatever becomes of
    # the record (an agent may forget its own node's), so its uid is never given back.
    await port.forget_folders(job_id, "n2")
    assert await port.adopt_warm_uid(job_id, "n1", mine.placeholder, job_id) is None
    assert await port.allocate_uid(job_id, uids) == claimed
    assert await port.release_warm_uids("n1") == 1  # `mine`, still warm
    assert await port.release_warm_uids("n2") == 1


async def test_a_job_adopts_a_warm_uid_once_only(port: AgentPort, control: Control) -> None:
    await port.register(node("n1", 1), ttl_s=60)
    uids = range(8300, 8310)
    job_id = await control.submit(manifest())
    await port.claim("n1", uids=uids)
    first, second = await port.hold_warm_uid("n1", uids), await port.hold_warm_uid("n1", uids)
    assert first is not None and second is not None
    assert await port.adopt_warm_uid(job_id, "n1", first.placeholder, job_id) == first.uid
    # Its sandbox may run as that uid before any folder is recorded: never given back.
    assert await port.adopt_warm_uid(job_id, "n1", second.placeholder, job_id) is None
    assert await port.allocate_uid(job_id, uids) == first.uid
    assert await port.release_warm_uids("n1") == 1  # `second`, still warm


async def test_a_job_with_learners_on_another_node_adopts_no_warm_uid(
    port: AgentPort, control: Control
) -> None:
    await port.register(node("n1", 1), ttl_s=60)
    await port.register(node("n2", 1), ttl_s=60)
    uids = range(8300, 8310)
    job_id = await control.submit(manifest(learners=2))
    (won,) = await port.claim("n1", uids=uids)
    assert [learner.node for learner in won.learners] == ["n1", "n2"]
    claimed = await port.allocate_uid(job_id, uids)
    warm = await port.hold_warm_uid("n1", uids)
    assert warm is not None
    assert await port.adopt_warm_uid(job_id, "n1", warm.placeholder, job_id) is None
    assert await port.allocate_uid(job_id, uids) == claimed
    unclaimed = await control.submit(manifest())  # no learner anywhere yet
    assert await port.adopt_warm_uid(unclaimed, "n1", warm.placeholder, unclaimed) is None


async def test_warm_uids_are_given_back_by_placeholder_or_all_of_a_node_s(
    port: AgentPort,
) -> None:
    uids = range(8400, 8404)
    held = [await port.hold_warm_uid("n1", uids) for _ in range(3)]
    theirs = await port.hold_warm_uid("n2", uids)
    assert theirs is not None and all(warm is not None for warm in held)
    placeholders = [warm.placeholder for warm in held if warm is not None]
    assert await port.release_warm_uids("n1", [placeholders[0], theirs.placeholder]) == 1
    assert await port.release_warm_uids("n1", [placeholders[0]]) == 0  # given back already
    assert await port.release_warm_uids("n1") == 2
    assert await port.release_warm_uids("n1") == 0
    jobs = [uuid4() for _ in range(4)]
    assert [await port.allocate_uid(job, uids) is not None for job in jobs] == [
        True,
        True,
        True,
        False,  # n2's is still held
    ]
    assert await port.release_warm_uids("n2", [theirs.placeholder]) == 1
    assert await port.allocate_uid(jobs[3], uids) == theirs.uid


async def test_tasks_are_claimed_in_batches_fenced_by_their_claim(
    port: AgentPort, control: Control
) -> None:
    tasks = [await control.queue_task("dep", [n, n]) for n in range(3)]
    replica, claim = uuid4(), uuid4()
    taken = await port.claim_tasks("acme", "dep", 4, claim, replica, [])
    assert [t.task_id for t in taken] == tasks[:2]  # four items at most
    # The same claim asked again (its answer lost) gets what it holds, nothing new.
    again = await port.claim_tasks("acme", "dep", 4, claim, replica, [])
    assert [t.task_id for t in again] == tasks[:2]
    assert await port.claim_tasks("acme", "dep", 4, claim, replica, tasks[:2]) != []
    results = TaskResults(
        claim=claim,
        task_ids=tasks[:2],
        outputs=['["a", "a"]', None],
        errors=[None, "it broke"],
        tenant="acme",
        deployment="dep",
        replica=replica,
        items=4,
        reason="full",
        invocation_ms=1.0,
        inference_ms=0.5,
    )
    assert await port.finish_tasks(results) == 2
    assert (await control.task(tasks[0]))[:3] == ("succeeded", '["a", "a"]', None)
    assert (await control.task(tasks[1]))[0] == "failed"
    assert await port.finish_tasks(results) == 0  # recorded once


async def test_a_lost_replica_gives_its_tasks_back_and_they_then_run_alone(
    port: AgentPort, control: Control
) -> None:
    first = await control.queue_task("dep", [1])
    second = await control.queue_task("dep", [2])
    replica, claim = uuid4(), uuid4()
    assert len(await port.claim_tasks("acme", "dep", 8, claim, replica, [])) == 2
    await port.requeue_replica(replica)
    assert (await control.task(first))[0] == "queued"
    assert (await control.task(first))[3] == 1  # its try counted
    late = TaskResults(claim, [first], ["[1]"], [None], "acme", "dep", replica, 1, "full", 1, None)
    assert await port.finish_tasks(late) == 0  # its claim is gone
    retry = await port.claim_tasks("acme", "dep", 8, uuid4(), uuid4(), [])
    assert [t.task_id for t in retry] == [first]  # tried before: alone
    assert (await control.task(second))[0] == "queued"


async def test_an_inference_job_s_queries_are_claimed_one_by_one_and_finish(
    port: AgentPort, control: Control
) -> None:
    job_id = uuid4()
    assert await port.inference_job(job_id) is None
    early = await port.claim_query(job_id, uuid4(), uuid4(), "n1", 3.0)
    assert (early.index, early.outcome) == (None, "wait")  # no row yet
    await control.start_inference(job_id, [1, 2, 3, 4], batch_size=2, queries=2)
    row = await port.inference_job(job_id)
    assert row is not None and row.batch_size == 2
    replica = uuid4()
    claims = [uuid4(), uuid4(), uuid4()]
    first = await port.claim_query(job_id, replica, claims[0], "n1", 3.0)
    assert first is not None and (first.index, first.outcome) == (0, "claimed")
    # Its answer lost: the same claim gets the same query.
    again = await port.claim_query(job_id, replica, claims[0], "n1", 3.0)
    assert again is not None and again.index == 0
    await port.replica_present(job_id, replica)
    second = await port.claim_query(job_id, uuid4(), claims[1], "n1", 3.0)
    assert second is not None and second.index == 1
    assert await port.finish_query(job_id, 0, "[1, 2]", None, 1.0, claims[0]) == 1
    assert await port.finish_query(job_id, 0, "[1, 2]", None, 1.0, claims[0]) == 0
    waiting = await port.claim_query(job_id, replica, claims[2], "n1", 3.0)
    assert waiting is not None and waiting.outcome == "wait"  # query 1 still runs
    assert await port.finish_query(job_id, 1, None, "boom", None, claims[1]) == 1
    done = await port.claim_query(job_id, replica, uuid4(), "n1", 3.0)
    assert done is not None and done.outcome == "done"
    await port.record_load_error(job_id, "no model")
    await port.record_load_error(job_id, "the second word")
    assert await control.load_error(job_id) == "no model"  # the first is kept


async def test_a_query_given_back_is_taken_first_and_its_tries_counted(
    port: AgentPort, control: Control
) -> None:
    job_id = uuid4()
    await control.start_inference(job_id, [1, 2], batch_size=1, queries=2)
    lost = uuid4()
    taken = await port.claim_query(job_id, lost, uuid4(), "n1", 3.0)
    assert taken is not None and taken.index == 0
    await port.requeue_replica(lost)
    claim = uuid4()
    retried = await port.claim_query(job_id, uuid4(), claim, "n2", 3.0)
    assert retried is not None and (retried.index, retried.outcome) == (0, "claimed")
    assert await port.finish_query(job_id, 0, "[1]", None, 1.0, claim) == 1
