"""A round's writes, decided purely: an event only where the set of a job's reasons changed or
it left the queue; a row wherever anything shown changed; nothing where nothing did."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import UUID

from controlplane.pending.changes import Queued, Recorded, changes
from controlplane.pending.reasons import Blocking, Pending, Reason

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(seconds=1)


def reason(kind: Reason, detail: str = "") -> Pending:
    return Pending(kind, Blocking.WAITING, detail)


def row(n: int, *reasons: Pending, attempt: int = 1, queued: bool = True) -> Recorded:
    return Recorded(UUID(int=n), "acme", attempt, 3, queued, 1 if queued else None, reasons, T0)


def test_a_round_records_what_changed_and_nothing_else() -> None:
    ahead = reason(Reason.FAIR_SHARE, "2 job(s) of other tenants come first")
    recorded = {
        r.job_id: r
        for r in (
            row(1, reason(Reason.RESOURCES)),  # unchanged
            row(2, reason(Reason.RESOURCES), ahead),  # one job fewer ahead: detail only
            row(3, reason(Reason.RESOURCES)),  # now starting
            row(4, reason(Reason.STARTING)),  # claimed: left the queue
            row(5, reason(Reason.STARTING), queued=False),  # restarted: queued again
        )
    }
    fewer = reason(Reason.FAIR_SHARE, "1 job(s) of other tenants come first")
    queue = [
        Queued(UUID(int=1), "acme", 1, 1, (reason(Reason.RESOURCES),)),
        Queued(UUID(int=2), "acme", 1, 1, (reason(Reason.RESOURCES), fewer)),
        Queued(UUID(int=3), "acme", 1, 1, (reason(Reason.STARTING),)),
        Queued(UUID(int=5), "acme", 2, 1, (reason(Reason.BACKOFF),)),
        Queued(UUID(int=6), "acme", 1, 2, (reason(Reason.NO_NODES),)),  # new
    ]
    decided = changes(recorded, queue, T1)
    assert decided.deferred is None
    written = {c.row.job_id.int: c for c in decided.changes}
    assert sorted(written) == [2, 3, 4, 5, 6]
    two = written[2]
    assert two.event is None and two.row.reasons == (reason(Reason.RESOURCES), fewer)
    assert (two.row.version, two.row.since) == (3, T0)  # no event: its stream stays
    for n, kinds in ((3, [Reason.STARTING]), (4, []), (5, [Reason.BACKOFF])):
        change = written[n]
        assert change.event is not None
        assert [r.reason for r in change.event.reasons] == kinds
        assert (change.expected_version, change.row.version, change.row.since) == (3, 4, T1)
    assert written[4].row.queued is False and written[4].row.position is None
    assert written[5].event is not None and written[5].event.attempt == 2
    assert (written[6].expected_version, written[6].row.version) == (0, 1)


def test_a_moved_position_is_written_at_most_every_two_seconds_a_new_reason_at_once() -> None:
    written_at = replace(row(1, reason(Reason.RESOURCES)), updated_at=T0)
    recorded = {written_at.job_id: written_at}
    moved = [Queued(UUID(int=1), "acme", 1, 2, (reason(Reason.RESOURCES),))]
    soon = changes(recorded, moved, T0 + timedelta(seconds=1))
    assert soon.changes == [] and soon.deferred == T0 + timedelta(seconds=2)
    later = changes(recorded, moved, T0 + timedelta(seconds=2))
    assert [c.row.position for c in later.changes] == [2] and later.deferred is None
    starting = [Queued(UUID(int=1), "acme", 1, 2, (reason(Reason.STARTING),))]
    [now] = changes(recorded, starting, T0 + timedelta(seconds=1)).changes
    assert now.event is not None
