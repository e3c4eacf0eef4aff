"""The relay: takes due deliveries from the outbox and POSTs them, signed, at least once.

Any number of control plane replicas run one. A relay claims due rows with SKIP LOCKED in a
statement of its own, so no row lock or transaction is held across a POST (which could last the
whole timeout): the claim counts the attempt and moves the row's `next_attempt_at` past a lease
longer than the POST's timeout, and the outcome is recorded under the claim's token. So two
relays never make the same attempt at once (nor does any attempt number come twice), a relay
that dies mid-attempt leaves the row to come due again when its lease ends, and one that is
stopped records its unfinished attempts as interrupted, due again at once. Deliveries run
concurrently (up to `max_in_flight`), each bounded by its timeout: a receiver that hangs or is
gone costs a slot for a while, never a job event, a projection or another delivery. Woken by a
NOTIFY from the outbox projection, by a delivery's retry time coming due, and by polling.
Receivers are reached only at addresses `targets` allows, checked as each connection resolves
its host: a refused one fails the delivery at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from dataclasses import dataclass, field

import aiohttp
import asyncpg

from controlplane import __version__
from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.database import DATABASE_ERRORS
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.queries import Q
from controlplane.tenants.errors import TenantError
from controlplane.webhooks.addresses import Network
from controlplane.webhooks.events import AttemptOutcome, WebhookAttemptFailed, WebhookDelivered
from controlplane.webhooks.outbox import CHANNEL
from controlplane.webhooks.resolver import OwnThreadsResolver
from controlplane.webhooks.retries import Attempt, Result, RetryPolicy, interrupted, outcome
from controlplane.webhooks.signing import HEADER, sign
from controlplane.webhooks.targets import CheckingResolver, TargetRefused, check_literal
from controlplane.webhooks.tenant_secrets import GRACE, rotate, signing_secrets
from controlplane.workers import isolated

log = logging.getLogger(__name__)

ACTOR = "system:webhooks"
DELIVERY_HEADER = "Trainyard-Delivery-Id"
EVENT_HEADER = "Trainyard-Event"
ATTEMPT_HEADER = "Trainyard-Attempt"
MIN_PAUSE_S = 0.01
"""The shortest wait between claims: a due row that another relay is claiming right now is
skipped (SKIP LOCKED) and still looks due until that claim commits."""


@dataclass(frozen=True, slots=True)
class RelayConfig:
    retries: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_s: float = 10.0
    """The longest an attempt's POST may take, connecting included."""
    lease_s: float = 30.0
    """How long a claim keeps other relays off a delivery: longer than the timeout, so that the
    claimant's attempt has ended (answered or timed out) before anyone else may try."""
    max_in_flight: int = 32
    poll_interval_s: float = 1.0
    stop_grace_s: float = 2.0
    """On stop, how long attempts under way may finish before they are cut off (recorded as
    interrupted, due again at once, for the next relay)."""
    allow_networks: tuple[Network, ...] = ()
    """Networks that receivers may be in although they are not public (see `addresses`)."""

    def __post_init__(self) -> None:
        if self.lease_s <= self.timeout_s:
            raise ValueError("a claim's lease must outlast the POST's timeout")


@dataclass(frozen=True, slots=True)
class Claimed:
    """A delivery claimed for one attempt."""

    delivery_id: uuid.UUID
    stream: str
    """Where the attempts' outcomes are recorded (see `streams`)."""
    tenant: str
    event: str
    position: int
    url: str
    body: str = field(repr=False)
    attempt: int
    claim: uuid.UUID
    secrets: list[str] = field(repr=False)


class WebhookRelay:
    def __init__(
        self,
        url: str,
        pool: asyncpg.Pool,
        store: EventStore,
        config: RelayConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._pool = pool
        self._store = store
        self._clock = clock
        self.config = config or RelayConfig()
        # Its own listener: finishing deliveries wake it, which must not wake the log's readers.
        self._listener = LogListener(
            url, channel=CHANNEL, poll_interval=self.config.poll_interval_s
        )
        self._stopping = asyncio.Event()
        self._in_flight: set[asyncio.Task[None]] = set()
        self.targets = CheckingResolver(
            OwnThreadsResolver(self.config.max_in_flight), self.config.allow_networks
        )
        """Checks webhook URLs at submission, and resolves receivers' hosts for delivery."""
        self.attempts_started = 0
        """Attempts this relay has claimed and begun, since it was made."""

    def stop(self) -> None:
        self._stopping.set()
        self._listener.wake()

    async def run(self) -> None:
        """Deliver until `stop()`; then let attempts under way finish for a moment, and hand
        back those that do not."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._listener.run(), name="webhook-listener")
            try:
                timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
                connector = aiohttp.TCPConnector(
                    limit=self.config.max_in_flight,
                    resolver=self.targets,
                )
                async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
                    await self._relay(session)
            finally:
                self._listener.stop()

    async def close(self) -> None:
        """Once the relay has stopped and nothing checks URLs any more: end the lookups'
        threads."""
        await self.targets.close()

    async def _relay(self, session: aiohttp.ClientSession) -> None:
        async with asyncio.TaskGroup() as deliveries:
            try:
                while not self._stopping.is_set():
                    seen = self._listener.generation
                    wait = self.config.poll_interval_s
                    try:
                        wait = await self._dispatch(session, deliveries)
                    except DATABASE_ERRORS as exc:
                        log.warning("webhook relay: %s; retrying", exc)
                    await self._pause(seen, wait)
            finally:
                await self._cut_off()

    async def _dispatch(self, session: aiohttp.ClientSession, group: asyncio.TaskGroup) -> float:
        """Start attempts for the due deliveries there is room for; how long to wait next."""
        free = self.config.max_in_flight - len(self._in_flight)
        if free <= 0:
            return self.config.poll_interval_s  # a finishing attempt wakes the loop
        claimed = await self._claim(free)
        self.attempts_started += len(claimed)
        for delivery in claimed:
            # Isolated: a delivery's failure (a bug its tenant's URL or event meets) is recorded,
            # and never ends the group, which would stop the relay for every tenant.
            step = self._deliver(session, delivery)
            task = group.create_task(
                isolated("webhook-relay", f"delivery {delivery.delivery_id}", step),
                name=f"webhook-{delivery.delivery_id}",
            )
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
        if len(claimed) == free:
            return self.config.poll_interval_s
        due: float | None = await self._pool.fetchval(Q["webhook_next_due"])
        if due is None:
            return self.config.poll_interval_s
        return min(self.config.poll_interval_s, max(due, MIN_PAUSE_S))

    async def _pause(self, seen: int, wait: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._listener.wait(seen)

    async def _cut_off(self) -> None:
        """Give attempts under way `stop_grace_s` to end, then cancel the rest (each records
        itself as interrupted as it ends)."""
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=self.config.stop_grace_s)
        for task in self._in_flight:
            task.cancel()

    async def _claim(self, limit: int) -> list[Claimed]:
        claim = uuid.uuid4()
        rows = await self._pool.fetch(
            Q["claim_webhook_deliveries"],
            limit,
            claim,
            self.config.lease_s,
            GRACE.total_seconds(),
        )
        return [
            Claimed(
                delivery_id=row["delivery_id"],
                stream=row["stream"],
                tenant=row["tenant"],
                event=row["event"],
                position=row["position"],
                url=row["url"],
                body=row["body"],
                attempt=row["attempts"],
                claim=claim,
                secrets=list(row["secrets"]),
            )
            for row in rows
        ]

    async def _deliver(self, session: aiohttp.ClientSession, delivery: Claimed) -> None:
        attempt = Attempt(
            delivery.delivery_id,
            delivery.event,
            delivery.position,
            delivery.attempt,
            self._clock.now(),
        )
        try:
            result = await self._attempt(session, delivery)
            await self._record(
                delivery, outcome(self.config.retries, attempt, result, random.random())
            )
        except asyncio.CancelledError:
            # Stopped mid-attempt: record it as interrupted and due again at once, rather than
            # leave the delivery until its lease ends. Shielded, so that it is written although
            # we are cancelled.
            await asyncio.shield(self._hand_back(delivery, attempt))
            raise
        except DATABASE_ERRORS as exc:
            # The outcome is not recorded: the claim lapses with its lease and the delivery is
            # attempted again (at least once; receivers dedupe on the delivery id).
            log.warning("webhook %s: outcome not recorded (%s)", delivery.delivery_id, exc)
        finally:
            self._listener.wake()  # a slot is free

    async def _attempt(self, session: aiohttp.ClientSession, delivery: Claimed) -> Result:
        try:
            secrets = delivery.secrets or await self._first_secrets(delivery.tenant)
        except TenantError as exc:
            return Result(None, f"cannot sign the delivery: {exc}", self._clock.now())
        body = delivery.body.encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"Trainyard-Webhooks/{__version__}",
            DELIVERY_HEADER: str(delivery.delivery_id),
            EVENT_HEADER: delivery.event,
            ATTEMPT_HEADER: str(delivery.attempt),
            HEADER: sign(secrets, int(time.time()), body),
        }
        try:
            check_literal(delivery.url, self.targets.allowed)
            # Redirects are not followed: a receiver answers where it was registered (and a
            # redirect could lead anywhere). Only the status line and headers are read (aiohttp
            # bounds their size), never the body, and all within the timeout.
            async with session.post(
                delivery.url, data=body, headers=headers, allow_redirects=False
            ) as response:
                status, reason = response.status, response.reason
        except TargetRefused as exc:
            return Result(None, str(exc), self._clock.now(), final=True)
        except aiohttp.ClientConnectorError as exc:
            # A refused address comes from the resolver, as the cause of the connection error.
            if isinstance(exc.os_error, TargetRefused):
                return Result(None, str(exc.os_error), self._clock.now(), final=True)
            return Result(None, f"{type(exc).__name__}: {exc}"[:500], self._clock.now())
        except TimeoutError:
            return Result(None, f"no answer within {self.config.timeout_s:g}s", self._clock.now())
        except (aiohttp.ClientError, OSError) as exc:
            return Result(None, f"{type(exc).__name__}: {exc}"[:500], self._clock.now())
        return Result(status, f"HTTP {status} {reason or ''}".strip(), self._clock.now())

    async def _first_secrets(self, tenant: str) -> list[str]:
        """The tenant has no secret yet: issue its first (unless another relay just did)."""
        await rotate(
            self._pool, self._store, tenant, actor=ACTOR, unless_present=True, clock=self._clock
        )
        return [s.secret for s in await signing_secrets(self._pool, tenant)]

    async def _record(self, delivery: Claimed, event: AttemptOutcome) -> None:
        """The delivery's new state and the attempt's event, together, under the claim."""
        if isinstance(event, WebhookDelivered):
            state, retry_at, error = "delivered", None, None
        elif isinstance(event, WebhookAttemptFailed):
            state, retry_at, error = "pending", event.retry_at, event.error
        else:
            state, retry_at, error = "failed", None, event.error
        stream = delivery.stream
        metadata = Metadata.capture(
            ACTOR,
            tenant=delivery.tenant,
            correlation_id=str(delivery.delivery_id),
            causation_id=str(delivery.position),
        )
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(Q["lock_webhook_stream"], stream)
            ours = await conn.fetchval(
                Q["finish_webhook_attempt"],
                delivery.delivery_id,
                delivery.claim,
                state,
                retry_at,
                event.status,
                error,
                event.at,
            )
            if ours is None:
                log.warning(
                    "webhook %s: attempt %d outlasted its claim; another relay has it now",
                    delivery.delivery_id,
                    delivery.attempt,
                )
                return
            version = await self._store.version(stream, conn=conn)
            await self._store.append(stream, version, [event], metadata, conn=conn)

    async def _hand_back(self, delivery: Claimed, attempt: Attempt) -> None:
        try:
            await self._record(delivery, interrupted(attempt, self._clock.now()))
        except DATABASE_ERRORS as exc:
            log.warning(
                "webhook %s: not handed back (%s); due again when its claim lapses",
                delivery.delivery_id,
                exc,
            )
