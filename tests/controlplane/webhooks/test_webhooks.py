"""Webhook notifications through the transactional outbox, against real receivers: the right
events, signed; retries with backoff; giving up; relays that stop, die or run side by side;
and a receiver that hangs never holding anything else up."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from uuid import UUID, uuid4

import asyncpg
import pytest

from controlplane.clock import SYSTEM_CLOCK
from controlplane.jobs.lifecycle import Complete, Deploy, EnterPhase, Fail, JobStatus, Restart
from controlplane.jobs.streams import job_stream
from controlplane.queries import Q
from controlplane.webhooks.addresses import parse_networks
from controlplane.webhooks.events import (
    WebhookAttempt,
    WebhookAttemptFailed,
    WebhookDelivered,
    WebhookFailed,
)
from controlplane.webhooks.relay import RelayConfig, WebhookRelay
from controlplane.webhooks.retries import RetryPolicy
from controlplane.webhooks.streams import webhook_stream
from controlplane.webhooks.tenant_secrets import signing_secrets
from tests.cluster import USER, Plane, RunningAgent
from tests.polling import eventually
from tests.receivers import (
    Received,
    Receiver,
    body_of,
    dead_url,
    failing_first,
    receiving,
    slow,
)

LOCAL = parse_networks("127.0.0.0/8")
"""The tests' receivers listen on loopback, which webhooks may reach only when allowed."""
FAST = RelayConfig(
    allow_networks=LOCAL,
    retries=RetryPolicy(max_attempts=5, first_backoff_s=0.3, jitter=0.2),
    timeout_s=2,
    lease_s=5,
    poll_interval_s=0.2,
    stop_grace_s=1,
)


@asynccontextmanager
async def relaying(plane: Plane, config: RelayConfig = FAST) -> AsyncIterator[WebhookRelay]:
    relay = WebhookRelay(plane.url, plane.pool, plane.store, config)
    task = asyncio.create_task(relay.run())
    try:
        yield relay
    finally:
        relay.stop()
        await asyncio.wait_for(task, 10)


async def fail(plane: Plane, job_id: UUID) -> None:
    await plane.jobs.execute(job_id, Fail(reason="boom", at=SYSTEM_CLOCK.now()), USER)


async def run_and_complete(plane: Plane, job_id: UUID) -> None:
    for command in (
        Deploy(["n1"], [], 1, SYSTEM_CLOCK.now()),
        EnterPhase(JobStatus.PROCESSING, SYSTEM_CLOCK.now()),
        Complete([0], SYSTEM_CLOCK.now()),
    ):
        await plane.jobs.execute(job_id, command, USER)


async def rows(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM webhook_deliveries ORDER BY position")


async def attempts(plane: Plane, job_id: UUID) -> list[WebhookAttempt]:
    recorded = await plane.store.read_stream(webhook_stream(job_stream(job_id)))
    return [r.event for r in recorded if isinstance(r.event, WebhookAttempt)]


async def until_settled(pool: asyncpg.Pool, count: int, seconds: float = 30) -> None:
    """Wait until `count` deliveries exist and none is pending any more."""

    async def settled() -> bool:
        states = [r["state"] for r in await rows(pool)]
        return len(states) == count and "pending" not in states

    await eventually(settled, seconds)


async def secret_of(plane: Plane, tenant: str = "acme") -> str:
    secrets = await signing_secrets(plane.pool, tenant)
    assert len(secrets) == 1
    return secrets[0].secret


KILLED_ON_FIRST_ATTEMPT = [
    sys.executable,
    "-c",
    "import os, signal\n"
    "if os.environ['TRAINYARD_ATTEMPT'] == '1':\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "print('second attempt')\n",
]
FAILS = [sys.executable, "-c", "raise SystemExit(1)"]
QUICK = [sys.executable, "-c", "print('done')"]


async def test_a_job_that_restarts_then_completes_notifies_exactly_those_events_signed(
    plane: Plane, agent: RunningAgent
) -> None:
    async with receiving() as receiver, relaying(plane):
        restarted = await plane.submit(KILLED_ON_FIRST_ATTEMPT, webhook_url=receiver.url)
        failed = await plane.submit(FAILS, webhook_url=receiver.url)
        silent = await plane.submit(QUICK)  # no webhook_url: nothing to send
        job = await plane.state(restarted, JobStatus.COMPLETED)
        assert job.attempt == 2
        await plane.state(failed, JobStatus.FAILED)
        await plane.state(silent, JobStatus.COMPLETED)
        await until_settled(plane.pool, 3)

    by_job: dict[str, list[str]] = {}
    for received in sorted(receiver.received, key=lambda r: body_of(r)["position"]):
        body = body_of(received)
        by_job.setdefault(body["job_id"], []).append(body["type"])
        assert received.headers["Trainyard-Event"] == body["type"]
        assert received.delivery_id == body["id"]
        assert received.attempt == 1
        assert received.headers["Content-Type"] == "application/json"
    assert by_job == {
        str(restarted): ["JobRestarted", "JobCompleted"],
        str(failed): ["JobFailed"],
    }
    # Signed with acme's secret, which the relay issued for the first delivery.
    secret = await secret_of(plane)
    assert all(r.signed_with(secret) for r in receiver.received)
    assert not any(r.signed_with("whsec_not-the-secret") for r in receiver.received)
    restart = next(body_of(r) for r in receiver.received if body_of(r)["type"] == "JobRestarted")
    assert restart["tenant"] == "acme" and restart["job_name"] == "t"
    assert restart["data"]["attempt"] == 2
    assert restart["data"]["reason"].startswith("learner 0 killed by SIGKILL")
    # Each delivery is in the job's webhook history, delivered at the first attempt.
    events = await attempts(plane, restarted)
    assert [(e.job_event, type(e), e.attempt, e.status) for e in events] == [
        ("JobRestarted", WebhookDelivered, 1, 200),
        ("JobCompleted", WebhookDelivered, 1, 200),
    ]


async def test_a_receiver_that_fails_twice_gets_the_delivery_with_backoff(plane: Plane) -> None:
    async with receiving(failing_first(2)) as receiver, relaying(plane):
        # By name: the relay resolves it on threads of its own.
        url = receiver.url.replace("127.0.0.1", "localhost")
        job_id = await plane.submit(QUICK, webhook_url=url)
        await fail(plane, job_id)
        await until_settled(plane.pool, 1)

    [row] = await rows(plane.pool)
    assert (row["state"], row["attempts"], row["last_status"]) == ("delivered", 3, 200)
    got = receiver.of(str(row["delivery_id"]))
    assert [r.attempt for r in got] == [1, 2, 3]
    assert len({r.body for r in got}) == 1  # every attempt sends the same bytes
    secret = await secret_of(plane)
    assert all(r.signed_with(secret) for r in got)
    # Backoff: 0.3 s, then 0.6 s (each stretched by up to 20 %), seen by the receiver too.
    assert got[1].at - got[0].at >= 0.3
    assert got[2].at - got[1].at >= 0.6
    first, second, third = await attempts(plane, job_id)
    assert isinstance(first, WebhookAttemptFailed) and isinstance(second, WebhookAttemptFailed)
    assert isinstance(third, WebhookDelivered)
    assert [(e.attempt, e.status) for e in (first, second, third)] == [(1, 500), (2, 500), (3, 200)]
    assert first.error == "HTTP 500 Internal Server Error"
    for failed, waited in ((first, 0.3), (second, 0.6)):
        backoff = failed.retry_at - failed.at
        assert timedelta(seconds=waited) <= backoff <= timedelta(seconds=waited * 1.2)
    assert second.started_at >= first.retry_at and third.started_at >= second.retry_at


async def test_a_dead_receiver_is_given_up_after_the_last_attempt(
    plane: Plane, owner: asyncpg.Connection
) -> None:
    config = RelayConfig(
        allow_networks=LOCAL,
        retries=RetryPolicy(max_attempts=3, first_backoff_s=0.05),
        timeout_s=2,
        lease_s=5,
        poll_interval_s=0.2,
    )
    job_id = await plane.submit(QUICK, webhook_url=dead_url())
    async with relaying(plane, config):
        await fail(plane, job_id)
        await until_settled(plane.pool, 1)

    [row] = await rows(plane.pool)
    assert (row["state"], row["attempts"], row["last_status"]) == ("failed", 3, None)
    assert row["finished_at"] is not None
    events = await attempts(plane, job_id)
    assert [type(e) for e in events] == [WebhookAttemptFailed, WebhookAttemptFailed, WebhookFailed]
    gave_up = events[-1]
    assert isinstance(gave_up, WebhookFailed)
    assert gave_up.status is None and "ClientConnectorError" in gave_up.error
    assert gave_up.error == row["last_error"]
    # The auditor sees every attempt, the last one given up.
    await owner.execute("SET ROLE trainyard_auditor")
    audited = await owner.fetch(
        "SELECT attempt, outcome, job_event, tenant FROM audit.webhook_attempts"
        " WHERE job_id = $1 ORDER BY attempt",
        job_id,
    )
    await owner.execute("RESET ROLE")
    assert [tuple(r) for r in audited] == [
        (1, "retrying", "JobFailed", "acme"),
        (2, "retrying", "JobFailed", "acme"),
        (3, "gave_up", "JobFailed", "acme"),
    ]


async def test_a_relay_stopped_mid_way_records_its_interrupted_attempts_and_the_next_delivers_all(
    plane: Plane,
) -> None:
    config = RelayConfig(
        allow_networks=LOCAL,
        retries=RetryPolicy(max_attempts=3, first_backoff_s=0.1),
        timeout_s=5,
        lease_s=30,  # far longer than the test: only the handing back makes them due at once
        max_in_flight=4,
        poll_interval_s=0.2,
        stop_grace_s=0,
    )
    async with receiving(slow(0.5)) as receiver:
        jobs = [await plane.submit(QUICK, webhook_url=receiver.url) for _ in range(12)]
        for job_id in jobs:
            await fail(plane, job_id)

        async def created() -> bool:
            return len(await rows(plane.pool)) == 12

        await eventually(created)
        async with relaying(plane, config):

            async def some_received() -> bool:
                return len(receiver.received) >= 6

            await eventually(some_received)
        # Stopped with attempts under way: each was recorded as interrupted, due again now.
        pending = [r for r in await rows(plane.pool) if r["state"] == "pending"]
        assert all(
            r["claim"] is None and r["next_attempt_at"] <= SYSTEM_CLOCK.now() for r in pending
        )
        cut = [r for r in pending if r["attempts"] == 1]
        assert cut and all(r["last_error"] == "interrupted: the relay stopped" for r in cut)

        async with relaying(plane, config):
            await until_settled(plane.pool, 12)

    assert {r["state"] for r in await rows(plane.pool)} == {"delivered"}
    assert receiver.answered() == {str(r["delivery_id"]) for r in await rows(plane.pool)}
    # A request that may have been received is never sent again under the same attempt number.
    sent = [(r.delivery_id, r.attempt) for r in receiver.received]
    assert len(sent) == len(set(sent))
    interrupted = [
        e
        for job_id in jobs
        for e in await attempts(plane, job_id)
        if isinstance(e, WebhookAttemptFailed)
    ]
    assert len(interrupted) == len(cut)
    assert all(e.retry_at == e.at and e.status is None for e in interrupted)


async def test_a_relay_that_dies_mid_attempt_leaves_it_to_the_next_after_its_lease(
    plane: Plane,
) -> None:
    async with receiving() as receiver:
        job_id = await plane.submit(QUICK, webhook_url=receiver.url)
        await fail(plane, job_id)

        async def created() -> bool:
            return len(await rows(plane.pool)) == 1

        await eventually(created)
        # A relay claims it (lease 1 s) and dies before it records anything.
        dead = uuid4()
        [claimed] = await plane.pool.fetch(Q["claim_webhook_deliveries"], 10, dead, 1.0, 0.0)
        async with relaying(plane):
            await until_settled(plane.pool, 1)

    [row] = await rows(plane.pool)
    assert (row["state"], row["attempts"]) == ("delivered", 2)
    [got] = receiver.received
    assert got.attempt == 2 and got.delivery_id == str(claimed["delivery_id"])
    # The dead relay's outcome, should it come back, is refused: its claim is gone.
    assert (
        await plane.pool.fetchval(
            Q["finish_webhook_attempt"],
            claimed["delivery_id"],
            dead,
            "failed",
            None,
            500,
            "x",
            SYSTEM_CLOCK.now(),
        )
        is None
    )


async def test_two_relays_never_make_the_same_attempt_at_once(plane: Plane) -> None:
    config = RelayConfig(
        allow_networks=LOCAL,
        retries=RetryPolicy(max_attempts=5, first_backoff_s=0.05),
        timeout_s=5,
        lease_s=10,
        max_in_flight=8,
        poll_interval_s=0.1,
    )
    async with receiving(slow(0.1, failing_first(1))) as receiver:
        jobs = [await plane.submit(QUICK, webhook_url=receiver.url) for _ in range(30)]
        async with relaying(plane, config) as one, relaying(plane, config) as two:
            for job_id in jobs:
                await fail(plane, job_id)
            await until_settled(plane.pool, 30, seconds=60)
        assert one.attempts_started > 0 and two.attempts_started > 0  # both took a share
        assert one.attempts_started + two.attempts_started == 60

    assert receiver.overlaps == []
    sent = [(r.delivery_id, r.attempt) for r in receiver.received]
    assert len(sent) == len(set(sent)) == 60  # each delivery: attempt 1 (refused), attempt 2
    assert {r["attempts"] for r in await rows(plane.pool)} == {2}
    for job_id in jobs:
        assert [(type(e), e.attempt) for e in await attempts(plane, job_id)] == [
            (WebhookAttemptFailed, 1),
            (WebhookDelivered, 2),
        ]


async def test_a_receiver_that_hangs_holds_up_neither_jobs_nor_other_deliveries(
    plane: Plane,
) -> None:
    config = RelayConfig(
        allow_networks=LOCAL,
        retries=RetryPolicy(max_attempts=1),
        timeout_s=3,
        lease_s=6,
        poll_interval_s=0.2,
    )

    async def hang(receiver: Receiver, received: Received) -> int:
        await asyncio.sleep(60)
        return 200

    async with receiving(hang) as stuck, receiving() as healthy, relaying(plane, config):
        hanging = await plane.submit(QUICK, webhook_url=stuck.url)
        await fail(plane, hanging)

        async def stuck_received() -> bool:
            return len(stuck.received) == 1

        await eventually(stuck_received)
        # While that POST hangs, another job runs its whole course (its projected status
        # too), and its notification is delivered.
        fine = await plane.submit(QUICK, webhook_url=healthy.url)
        await run_and_complete(plane, fine)

        async def fine_delivered() -> bool:
            status = await plane.pool.fetchval(
                "SELECT state FROM job_status WHERE job_id = $1", fine
            )
            delivery = {r["job_id"]: r["state"] for r in await rows(plane.pool)}.get(fine)
            return status == "COMPLETED" and delivery == "delivered"

        await eventually(fine_delivered)
        assert len(healthy.received) == 1
        # The hanging POST is still under way: claimed, not yet given up.
        [stuck_row] = [r for r in await rows(plane.pool) if r["job_id"] == hanging]
        assert stuck_row["state"] == "pending" and stuck_row["claim"] is not None
        await until_settled(plane.pool, 2)

    [gave_up] = await attempts(plane, hanging)
    assert isinstance(gave_up, WebhookFailed)
    assert gave_up.error == "no answer within 3s" and gave_up.status is None
    assert gave_up.at - gave_up.started_at >= timedelta(seconds=3)


async def test_each_notified_event_gets_exactly_one_delivery(plane: Plane) -> None:
    url = "http://127.0.0.1:9/never-sent"  # no relay runs in this test
    restarted = await plane.submit(QUICK, webhook_url=url, max_restarts=1)
    for command in (
        Deploy(["n1"], [], 1, SYSTEM_CLOCK.now()),
        EnterPhase(JobStatus.PROCESSING, SYSTEM_CLOCK.now()),
        Restart("node_lost", SYSTEM_CLOCK.now()),
        Deploy(["n1"], [], 2, SYSTEM_CLOCK.now()),
        EnterPhase(JobStatus.PROCESSING, SYSTEM_CLOCK.now()),
        Restart("node_lost again", SYSTEM_CLOCK.now()),  # past max_restarts: JobFailed
    ):
        await plane.jobs.execute(restarted, command, USER)
    completed = await plane.submit(QUICK, webhook_url=url)
    await run_and_complete(plane, completed)
    await run_and_complete(plane, await plane.submit(QUICK))  # no URL, no delivery

    async def created() -> bool:
        return len(await rows(plane.pool)) == 3

    await eventually(created)
    await asyncio.sleep(0.5)  # and no more come
    found = [(r["job_id"], r["event"], r["state"], r["attempts"]) for r in await rows(plane.pool)]
    assert found == [
        (restarted, "JobRestarted", "pending", 0),
        (restarted, "JobFailed", "pending", 0),
        (completed, "JobCompleted", "pending", 0),
    ]
    assert all(r["url"] == url for r in await rows(plane.pool))
    with pytest.raises(ValueError, match="owns no tables to rebuild"):
        await plane.runner.rebuild("webhook_outbox")
