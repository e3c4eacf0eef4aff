"""Reading a workload from recorded events: each job's attempts, backoffs and stops as they
happened, the window and where its replay starts, and the GPUs' release delay."""

from __future__ import annotations

from sim.workload import Attempt, JobSpec, Outcome, Run
from tests.sim.past import Past, at


async def test_attempts_backoffs_and_stops_are_read_as_they_happened() -> None:
    past = Past()
    await past.tenant("a")
    await past.node("n", gpus=4)
    restarted = await past.submit("a", 0)
    await past.claim(restarted, 0, "n", 0)
    await past.restart(restarted, 4, backoff_s=3)
    await past.claim(restarted, 9, "n", 0, attempt=2)
    await past.complete(restarted, 12, attempt=2)
    queued_then_cancelled = await past.submit("a", 1)
    await past.cancel(queued_then_cancelled, 5)
    cancelled_running = await past.submit("a", 2)
    await past.claim(cancelled_running, 6, "n", 1)
    await past.cancel(cancelled_running, 8)
    running_at_the_end = await past.submit("a", 3)
    await past.claim(running_at_the_end, 13, "n", 1)
    await past.submit("a", 3, inference=True)  # holds no node: left out
    requeued_then_cancelled = await past.submit("a", 4)
    await past.claim(requeued_then_cancelled, 14, "n", 2)
    await past.restart(requeued_then_cancelled, 15)
    await past.cancel(requeued_then_cancelled, 16)
    await past.node("late", gpus=1, s=20)  # the log's last event

    workload = await past.workload()
    specs: dict[object, JobSpec] = {spec.queued.job_id: spec for spec in workload.jobs}
    real: dict[object, Outcome] = {o.job_id: o for o in workload.recorded}
    assert [(s.attempts, s.stop) for s in specs.values()] == [
        ((Attempt(4, 3), Attempt(3)), None),
        ((Attempt(None),), 5),
        ((Attempt(None),), 8),
        ((Attempt(None),), 20),
        ((Attempt(1), Attempt(None)), 16),
    ]
    assert [(o.runs, o.end, o.order) for o in real.values()] == [
        ((Run(0, 4), Run(9, 12)), 12, 0),
        ((), 5, None),
        ((Run(6, 8),), 8, 1),
        ((Run(13, 20),), None, 2),
        ((Run(14, 15),), 16, 3),
    ]
    assert workload.origin == at(0)


async def test_the_replay_starts_where_no_job_was_queued_or_running_before_the_window() -> None:
    past = Past()
    await past.tenant("a")
    await past.node("n", gpus=1)
    a, b, c, d = [await past.submit("a", s) for s in (0, 5, 30, 35)]
    for job, start in ((a, 0), (b, 10), (c, 30), (d, 40)):
        await past.run(job, start, start + 10, "n", 0)

    def replayed(workload_jobs: tuple[JobSpec, ...]) -> list[object]:
        return [spec.queued.job_id for spec in workload_jobs]

    # c was running at 33 (d came at 35); the cluster was idle from 20 to 30.
    inside = await past.workload(since=33)
    assert (inside.origin, replayed(inside.jobs)) == (at(30), [c, d])
    assert [o.job_id for o in inside.recorded if inside.reported(o)] == [d]
    idle = await past.workload(since=25)
    assert (idle.origin, replayed(idle.jobs)) == (at(25), [c, d])
    busy = await past.workload(since=7)
    assert (busy.origin, replayed(busy.jobs)) == (at(0), [a, b, c, d])
    until = await past.workload(until=32)
    assert (until.origin, replayed(until.jobs)) == (at(0), [a, b, c])


async def test_the_release_delay_is_the_median_wait_of_a_busy_gpu() -> None:
    past = Past()
    await past.tenant("a")
    await past.node("n", gpus=1)
    jobs = [await past.submit("a", 0) for _ in range(4)]
    await past.run(jobs[0], 0, 10, "n", 0)
    await past.run(jobs[1], 10.1, 20, "n", 0)
    await past.run(jobs[2], 20.3, 30, "n", 0)
    await past.run(jobs[3], 30.2, 40, "n", 0)
    late = await past.submit("a", 60)  # nobody waited for the GPU: not a release delay
    await past.run(late, 60.01, 70, "n", 0)
    workload = await past.workload()
    assert round(workload.release_delay_s, 6) == 0.2
