"""The replay on pasts written by hand (in memory): each policy starts the jobs it should, when
it should; quotas, restarts, cancellations, lost nodes and failed GPUs are honoured; and the
same past and policy always give the same report."""

from __future__ import annotations

import random
from uuid import UUID

from controlplane.scheduling.policy import ClaimPolicy
from sim.engine import simulate
from sim.policy import NAMED, Policy, named
from sim.report import dumps, report
from sim.workload import Outcome, Run, Workload
from tests.sim.past import Past, fair_share_past

CURRENT, FIFO, PRIORITY = named("current", {}), NAMED["fifo"], NAMED["priority"]


def starts(workload: Workload, policy: Policy) -> dict[UUID, float | None]:
    return {o.job_id: o.start for o in simulate(workload, policy)}


def runs(workload: Workload, policy: Policy) -> dict[UUID, tuple[Run, ...]]:
    return {o.job_id: o.runs for o in simulate(workload, policy)}


def claimed_in_order(outcomes: tuple[Outcome, ...]) -> list[UUID]:
    return [o.job_id for o in sorted(outcomes, key=lambda o: (o.order is None, o.order))]


async def test_fair_share_reproduces_its_past_and_fifo_starts_other_jobs_first() -> None:
    # As a GPU comes free, fair share gives it to the tenant holding fewer GPUs (b once a
    # holds one), FIFO to the oldest job. The past is what fair share did.
    past = Past()
    a1, a2, a3, a4, b1, b2 = await fair_share_past(past)
    workload = await past.workload()
    assert workload.release_delay_s == 0.0  # each GPU was claimed again as it came free

    fair = simulate(workload, CURRENT)
    assert claimed_in_order(fair) == [a1, a2, b1, a3, b2, a4]
    assert {o.job_id: o.start for o in fair} == {a1: 0, a2: 1, b1: 10, a3: 11, b2: 20, a4: 21}
    replayed = report(workload, CURRENT, fair).comparison
    assert (replayed.start_order_agreement, replayed.start_time_error) == (1.0, 0.0)

    fifo = simulate(workload, FIFO)
    assert claimed_in_order(fifo) == [a1, a2, a3, a4, b1, b2]
    assert {o.job_id: o.start for o in fifo} == {a1: 0, a2: 1, a3: 10, a4: 11, b1: 20, b2: 21}
    # Of the 15 pairs, FIFO swaps (b1, a3), (b1, a4), (b2, a4).
    assert report(workload, FIFO, fifo).comparison.start_order_agreement == 1 - 3 / 15


async def test_priority_alone_overtakes_fair_share() -> None:
    # a holds a GPU when the other comes free; b's job waits as long as a's priority-9 job.
    past = Past()
    await past.tenant("a")
    await past.tenant("b")
    await past.node("n", gpus=2)
    a1, a2 = await past.submit("a", 0), await past.submit("a", 1)
    b1 = await past.submit("b", 2)
    a3 = await past.submit("a", 3, priority=9)
    for job, start, gpu in ((a1, 0, 0), (a2, 1, 1), (b1, 10, 0), (a3, 11, 1)):
        await past.run(job, start, start + 10, "n", gpu)
    workload = await past.workload()
    assert starts(workload, CURRENT) == {a1: 0, a2: 1, b1: 10, a3: 11}
    assert starts(workload, PRIORITY) == {a1: 0, a2: 1, a3: 10, b1: 11}


async def test_other_weights_change_whose_job_runs_next() -> None:
    # Three GPUs; a and b each hold one for long, the third goes round. Equal weights: the
    # tie goes to the older job. b at weight 2 holds half a share with its one GPU: b first.
    past = Past()
    await past.tenant("a")
    await past.tenant("b")
    await past.node("n", gpus=3)
    long_a, long_b = await past.submit("a", 0), await past.submit("b", 0.5)
    await past.run(long_a, 0, 100, "n", 0)
    await past.run(long_b, 0.5, 100.5, "n", 1)
    first = await past.submit("a", 0.7)
    await past.run(first, 0.7, 10.7, "n", 2)
    a3, b2, a4, b3 = [
        await past.submit(tenant, s) for tenant, s in (("a", 1), ("b", 2), ("a", 3), ("b", 4))
    ]
    for job, start in ((a3, 10.7), (b2, 20.7), (a4, 30.7), (b3, 40.7)):
        await past.run(job, start, start + 10, "n", 2)
    workload = await past.workload()

    def order(policy: Policy) -> list[UUID]:
        return claimed_in_order(simulate(workload, policy))[3:]

    assert order(CURRENT) == [a3, b2, a4, b3]
    assert order(named("fair_share", {"b": 2.0})) == [b2, b3, a3, a4]


async def test_a_tenants_quota_holds_unless_the_policy_drops_quotas() -> None:
    past = Past()
    await past.tenant("a", quota=1)
    await past.tenant("b")
    await past.node("n", gpus=2)
    a1, a2 = await past.submit("a", 0), await past.submit("a", 0)
    b1 = await past.submit("b", 5)
    for job, start, gpu in ((a1, 0, 0), (b1, 5, 1), (a2, 10, 0)):
        await past.run(job, start, start + 10, "n", gpu)
    workload = await past.workload()
    assert starts(workload, CURRENT) == {a1: 0, a2: 10, b1: 5}
    # Never more than one of a's at once.
    held = runs(workload, CURRENT)
    assert held[a1][0].end <= held[a2][0].start
    unbound = Policy("no quotas", ClaimPolicy(quotas=False))
    assert starts(workload, unbound) == {a1: 0, a2: 0, b1: 10}


async def test_a_node_lost_in_the_replay_restarts_what_the_replay_ran_there() -> None:
    # Recorded (as FIFO had it): x on n1 for 10 s; y on n2 until n2 was lost at 4 s, then on
    # n1 for 6 s more. The current policy gives y (priority 1) n1 and x n2: n2's loss restarts
    # x, which runs its remaining 6 s once n1 is free, after y's second attempt.
    past = Past()
    await past.tenant("a")
    await past.tenant("b")
    await past.node("n1", gpus=1)
    await past.node("n2", gpus=1)
    x = await past.submit("a", 0)
    y = await past.submit("b", 0, priority=1)
    await past.run(x, 0, 10, "n1", 0)
    await past.claim(y, 0, "n2", 0)
    await past.lose("n2", 4)
    await past.restart(y, 4)
    await past.claim(y, 10, "n1", 0, attempt=2)
    await past.complete(y, 16, attempt=2)
    workload = await past.workload()

    assert runs(workload, FIFO) == {x: (Run(0, 10),), y: (Run(0, 4), Run(10, 16))}
    assert runs(workload, CURRENT) == {y: (Run(0, 4), Run(4, 10)), x: (Run(0, 4), Run(10, 16))}


async def test_a_restart_waits_out_its_recorded_backoff() -> None:
    # j1 failed after 4 s and waited 3 s; j2 took the GPU meanwhile. Without the backoff the
    # older j1 would have gone first.
    past = Past()
    await past.tenant("a")
    await past.node("n", gpus=1)
    j1, j2 = await past.submit("a", 0), await past.submit("a", 1)
    await past.claim(j1, 0, "n", 0)
    await past.restart(j1, 4, backoff_s=3)
    await past.run(j2, 4, 9, "n", 0)
    await past.claim(j1, 9, "n", 0, attempt=2)
    await past.complete(j1, 12, attempt=2)
    workload = await past.workload()
    assert runs(workload, FIFO) == {j1: (Run(0, 4), Run(9, 12)), j2: (Run(4, 9),)}


async def test_cancelled_jobs_leave_the_queue_or_run_until_their_cancellation() -> None:
    past = Past()
    await past.tenant("a")
    await past.node("n", gpus=1)
    first = await past.submit("a", 0)
    dropped = await past.submit("a", 1)
    later = await past.submit("a", 2)
    urgent = await past.submit("a", 3, priority=5)
    await past.run(first, 0, 10, "n", 0)
    await past.cancel(dropped, 5)  # while queued
    await past.run(later, 10, 20, "n", 0)
    await past.claim(urgent, 20, "n", 0)
    await past.cancel(urgent, 25)  # 5 s into its run
    workload = await past.workload()
    fifo = {o.job_id: o for o in simulate(workload, FIFO)}
    assert (fifo[dropped].runs, fifo[dropped].end) == ((), 5)
    assert fifo[later].runs == (Run(10, 20),)
    assert (fifo[urgent].runs, fifo[urgent].end) == ((Run(20, 25),), 25)
    # Started earlier, it still runs until the instant it was cancelled.
    early = {o.job_id: o for o in simulate(workload, PRIORITY)}
    assert early[urgent].runs == (Run(10, 25),)
    assert early[later].runs == (Run(25, 35),)


async def test_a_job_of_two_learners_waits_for_room_on_two_nodes() -> None:
    past = Past()
    await past.tenant("a")
    await past.node("n1", gpus=1)
    await past.node("n2", gpus=1)
    busy = await past.submit("a", 0)
    gang = await past.submit("a", 1, learners=2)
    small = await past.submit("a", 2)
    await past.run(busy, 0, 10, "n1", 0)
    await past.run(small, 2, 12, "n2", 0)
    await past.claim(gang, 12, "n1", 0, also=("n2", 0))
    await past.complete(gang, 22)
    workload = await past.workload()
    # The small job fits n2 at once; the gang only once both nodes are free.
    assert starts(workload, FIFO) == {busy: 0, gang: 12, small: 2}


async def test_a_failed_gpu_takes_no_new_work() -> None:
    past = Past()
    await past.tenant("a")
    await past.node("n", gpus=2)
    jobs = [await past.submit("a", s) for s in (0, 0.5, 2, 3)]
    await past.gpu_fails("n", 1, 1)
    for job, start, gpu in zip(jobs, (0, 0.5, 10, 20), (0, 1, 0, 0), strict=True):
        await past.run(job, start, start + 10, "n", gpu)
    workload = await past.workload()
    # The second job keeps its GPU after the failure; nothing runs there again.
    assert list(starts(workload, FIFO).values()) == [0, 0.5, 10, 20]


async def test_the_same_past_gives_the_same_bytes() -> None:
    async def random_past() -> Past:
        rng = random.Random(5)
        past = Past()
        for tenant, weight in (("a", 1.0), ("b", 2.0), ("c", 0.5)):
            await past.tenant(tenant, weight, quota=rng.choice([None, 3]))
        for name in ("n1", "n2", "n3"):
            await past.node(name, gpus=rng.randint(1, 4))
        gpus = [(name, 0) for name in ("n1", "n2", "n3")]
        t = 0.0
        for k in range(120):
            t += rng.expovariate(2)
            job = await past.submit(
                rng.choice("abc"), t, gpus=rng.choice([0, 1, 1, 2]), priority=rng.randint(0, 2)
            )
            node, gpu = gpus[k % 3]
            start = t + rng.uniform(0, 5)
            if rng.random() < 0.1:
                await past.cancel(job, start)
                continue
            await past.run(job, start, start + rng.uniform(0.5, 8), node, gpu)
        await past.lose("n3", t / 2)
        return past

    first, second = await (await random_past()).workload(), await (await random_past()).workload()
    for policy in (*NAMED.values(), named("fair_share", {"c": 4.0})):
        once = dumps(report(first, policy, simulate(first, policy)))
        assert once == dumps(report(second, policy, simulate(second, policy)))
        assert once == dumps(report(first, policy, simulate(first, policy)))
