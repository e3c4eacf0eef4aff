"""The one command path every aggregate takes: load its stream (typed), decide on its state,
append at the version it was decided on, and on a conflict load again and decide again.

An aggregate (a job, a tenant) is described once by an `Aggregate`: the type of the events its
stream holds, its state before any, `decide` and `evolve`, and the error that means it kept
changing. The path works on any store that reads and appends streams: the Postgres one, its
view inside a caller's transaction (`EventStore.on`), the in-memory one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from controlplane.events.errors import ConcurrencyError
from controlplane.events.types import Event
from controlplane.invariants import InvariantBroken

if TYPE_CHECKING:
    # Only named in annotations: the job lifecycle (and with it the user's package, trainyard)
    # imports this module, and metadata brings in OpenTelemetry, a server dependency.
    from controlplane.events.metadata import Metadata
    from controlplane.events.records import Appended, RecordedEvent

CONFLICT_RETRIES = 10
"""How many times a command is decided before its aggregate counts as busy."""

C = TypeVar("C")
S = TypeVar("S")
E = TypeVar("E", bound=Event)
T = TypeVar("T")


class Streams(Protocol):
    """What the command path needs of a store: one stream read, one conditional append."""

    async def read_stream(
        self, stream_id: str, *, from_version: int = 1
    ) -> list[RecordedEvent]: ...

    async def append(
        self, stream_id: str, expected_version: int, events: Sequence[Event], metadata: Metadata
    ) -> Appended: ...


class ForeignEvent(InvariantBroken):
    """A stream holds an event that is not of its aggregate's type: a bug where it was
    appended, never something to decide on."""


@dataclass(frozen=True, slots=True)
class Loaded(Generic[S, E]):
    """A stream as read: its recorded events, the same events typed, and the state they fold
    into."""

    stream_id: str
    recorded: list[RecordedEvent]
    events: list[E]
    state: S

    @property
    def version(self) -> int:
        return len(self.recorded)


@dataclass(frozen=True, slots=True)
class Executed(Generic[S, E]):
    """A command carried out: the state after it, the events it appended, and where (None:
    the command decided nothing, as asking again for what is already so does, and nothing
    was written)."""

    state: S
    events: list[E]
    appended: Appended | None


@dataclass(frozen=True, slots=True)
class Aggregate(Generic[C, S, E]):
    """One kind of stream, and how commands are decided on it."""

    event_type: type[E]
    """Every event of its streams is one of these (a base class)."""
    initial: S
    """The state of a stream with no events."""
    decide: Callable[[C, S], Sequence[E]]
    """The events a command appends (one or more), or the aggregate's refusal (raised)."""
    evolve: Callable[[S, E], S]
    busy: Callable[[str, int], Exception]
    """The error for a stream that kept changing: from its id and the tries made."""

    def fold(self, state: S, events: Iterable[E]) -> S:
        """`state` with `events` applied in order."""
        folded = state
        for event in events:
            folded = self.evolve(folded, event)
        return folded

    def event_of(self, recorded: RecordedEvent) -> E:
        """A recorded event of one of its streams, as this aggregate's type; ForeignEvent for
        any other."""
        if not isinstance(recorded.event, self.event_type):
            raise ForeignEvent(
                f"stream {recorded.stream_id} holds a {recorded.event.type_name} at version "
                f"{recorded.stream_version}, not a {self.event_type.__name__}"
            )
        return recorded.event

    def typed(self, recorded: Iterable[RecordedEvent]) -> list[E]:
        """The events of one of its streams as this aggregate's type."""
        return [self.event_of(r) for r in recorded]

    async def load(
        self, streams: Streams, stream_id: str, *, since: Loaded[S, E] | None = None
    ) -> Loaded[S, E]:
        """The stream as read now. With `since`, an earlier read of it, only the events after
        it are read and folded onto its state: a stream is only ever appended to, so that is
        the same as reading it whole, for a long stream read again and again (a search's, at
        each of its trials' ends) at the cost of its news alone."""
        if since is None:
            recorded = await streams.read_stream(stream_id)
            events = self.typed(recorded)
            return Loaded(stream_id, recorded, events, self.fold(self.initial, events))
        if since.stream_id != stream_id:
            raise ValueError(f"a read of stream {since.stream_id} does not go on {stream_id}")
        news = await streams.read_stream(stream_id, from_version=since.version + 1)
        events = self.typed(news)
        return Loaded(
            stream_id,
            since.recorded + news,
            since.events + events,
            self.fold(since.state, events),
        )

    async def try_once(
        self,
        streams: Streams,
        stream_id: str,
        command: C,
        metadata: Metadata,
        *,
        loaded: Loaded[S, E] | None = None,
    ) -> Executed[S, E]:
        """Decide `command` on the stream (as `loaded`, if given, else as read now) and append
        at its version; ConcurrencyError, with nothing written, if it moved on meanwhile. For
        an append inside a caller's transaction, where deciding again means a new
        transaction."""
        if loaded is None:
            loaded = await self.load(streams, stream_id)
        events = list(self.decide(command, loaded.state))
        if not events:
            return Executed(loaded.state, events, None)
        appended = await streams.append(stream_id, loaded.version, events, metadata)
        return Executed(self.fold(loaded.state, events), events, appended)

    async def execute(
        self,
        streams: Streams,
        stream_id: str,
        command: C,
        metadata: Metadata,
        *,
        loaded: Loaded[S, E] | None = None,
    ) -> Executed[S, E]:
        """`try_once`, loading again and deciding again after a conflict (another command
        changed the stream meanwhile); the aggregate's `busy` error after CONFLICT_RETRIES."""
        first = loaded

        async def attempt() -> Executed[S, E]:
            nonlocal first
            given, first = first, None  # only the first try may decide on a given read
            return await self.try_once(streams, stream_id, command, metadata, loaded=given)

        return await retry_on_conflict(attempt, lambda tries: self.busy(stream_id, tries))


async def retry_on_conflict(
    attempt: Callable[[], Awaitable[T]], busy: Callable[[int], Exception]
) -> T:
    """`attempt` again after each ConcurrencyError (it wrote nothing), up to CONFLICT_RETRIES
    tries in all; then `busy(tries)` is raised. For commands that are more than one append (a
    transaction of their own per try) as for those that are one."""
    for _ in range(CONFLICT_RETRIES):
        try:
            return await attempt()
        except ConcurrencyError:
            continue
    raise busy(CONFLICT_RETRIES)
