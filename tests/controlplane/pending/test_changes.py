"""A round's writes, decided purely: a row wherever anything shown changed, at once; an event
for each change of a job's set of reasons, a budget's worth a round, oldest first, with the
instant it happened; none when a job leaves the queue, nor for a `starting` a claim ends
within STARTING; nothing where nothing changed."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import UUID

from controlplane.pending.changes import STARTING, Queued, Recorded, Round, changes
from controlplane.pending.reasons import Blocking, Pending, Reason

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(seconds=1)


def reason(kind: Reason, detail: str = "") -> Pending:
    return Pending(kind, Blocking.WAITING, detail)


def row(
    n: int, *reasons: Pending, attempt: int = 1, queued: bool = True, recorded: bool = True
) -> Recorded:
    position = 1 if queued else None
    return Recorded(
        UUID(int=n), "acme", attempt, 3, queued, position, reasons, T0, recorded=recorded
    )


def queued(n: int, *reasons: Pending, attempt: int = 1, position: int = 1) -> Queued:
    return Queued(UUID(int=n), "acme", attempt, position, reasons)


def events(decided: Round) -> dict[int, list[tuple[datetime, list[Reason]]]]:
    """Each job's events in the round: their instants and reasons."""
    return {
        c.row.job_id.int: [(e.at, [r.reason for r in e.reasons]) for e in c.events]
        for c in decided.changes
        if c.events
    }


def test_a_round_shows_what_changed_and_records_the_changes_of_reasons() -> None:
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
        queued(1, reason(Reason.RESOURCES)),
        queued(2, reason(Reason.RESOURCES), fewer),
        queued(3, reason(Reason.STARTING)),
        queued(5, reason(Reason.BACKOFF), attempt=2),
        queued(6, reason(Reason.NO_NODES), position=2),  # new
    ]
    decided = changes(recorded, queue, T1)
    written = {c.row.job_id.int: c for c in decided.changes}
    assert sorted(written) == [2, 3, 4, 5, 6]
    assert events(decided) == {5: [(T1, [Reason.BACKOFF])], 6: [(T1, [Reason.NO_NODES])]}
    two = written[2]
    assert two.row.reasons == (reason(Reason.RESOURCES), fewer)
    assert (two.row.version, two.row.since) == (3, T0)  # no event: its stream stays
    # Shown at once, recorded only if it lasts: the round is due again then.
    three = written[3]
    assert three.row.reasons == (reason(Reason.STARTING),) and not three.row.recorded
    assert (three.row.version, three.row.since) == (3, T1)
    assert decided.deferred == T1 + STARTING
    # Its claim ends its spans (the projection reads the job's own event): no event here.
    four = written[4]
    assert (four.row.queued, four.row.position, four.row.version) == (False, None, 3)
    assert (written[5].expected_version, written[5].row.version) == (3, 4)
    assert written[5].events[0].attempt == 2 and written[5].row.recorded
    assert (written[6].expected_version, written[6].row.version) == (0, 1)


def test_a_moved_position_is_written_at_most_every_two_seconds_a_new_reason_at_once() -> None:
    written_at = replace(row(1, reason(Reason.RESOURCES)), updated_at=T0)
    recorded = {written_at.job_id: written_at}
    moved = [queued(1, reason(Reason.RESOURCES), position=2)]
    soon = changes(recorded, moved, T0 + timedelta(seconds=1))
    assert soon.changes == [] and soon.deferred == T0 + timedelta(seconds=2)
    later = changes(recorded, moved, T0 + timedelta(seconds=2))
    assert [c.row.position for c in later.changes] == [2] and later.deferred is None
    short = [queued(1, reason(Reason.FAIR_SHARE), position=2)]
    [now] = changes(recorded, short, T0 + timedelta(seconds=1)).changes
    assert [e.at for e in now.events] == [T0 + timedelta(seconds=1)]


def test_a_starting_that_lasts_is_recorded_from_when_it_began_one_a_claim_ends_is_not() -> None:
    shown = row(1, reason(Reason.STARTING), recorded=False)
    recorded = {shown.job_id: shown}
    starting = [queued(1, reason(Reason.STARTING))]
    young = changes(recorded, starting, T0 + STARTING / 2)
    assert young.changes == [] and young.deferred == T0 + STARTING
    lasted = changes(recorded, starting, T0 + STARTING)
    assert events(lasted) == {1: [(T0, [Reason.STARTING])]}
    [change] = lasted.changes
    assert change.row.recorded and change.row.version == 4 and lasted.deferred is None
    # Claimed while young: the row leaves the queue, and the history has no `starting`.
    claimed = changes(recorded, [], T0 + STARTING / 2)
    [left] = claimed.changes
    assert left.events == () and not left.row.queued and left.row.recorded


def test_a_burst_is_shown_at_once_and_recorded_a_budget_a_round_oldest_first() -> None:
    burst = [queued(n, reason(Reason.RESOURCES), position=n) for n in range(1, 6)]
    first = changes({}, burst, T0, budget=2)
    assert len(first.changes) == 5 and all(c.row.queued for c in first.changes)
    assert sorted(events(first)) == [1, 2] and first.deferred == T0
    rows = {c.row.job_id: c.row for c in first.changes}
    second = changes(rows, burst, T1, budget=2)
    # Recorded with the instant each was shown, though a round later.
    assert events(second) == {n: [(T0, [Reason.RESOURCES])] for n in (3, 4)}
    rows.update((c.row.job_id, c.row) for c in second.changes)
    third = changes(rows, burst, T1 + timedelta(seconds=1), budget=2)
    assert sorted(events(third)) == [5] and third.deferred is None
    rows.update((c.row.job_id, c.row) for c in third.changes)
    assert all(r.recorded and r.version == 1 for r in rows.values())


def test_a_change_not_recorded_yet_is_recorded_before_it_is_overwritten_or_leaves() -> None:
    fair = row(1, reason(Reason.FAIR_SHARE), recorded=False)
    passing = row(2, reason(Reason.STARTING), recorded=False)
    leaving = row(3, reason(Reason.RESOURCES), recorded=False)
    recorded = {r.job_id: r for r in (fair, passing, leaving)}
    queue = [queued(1, reason(Reason.RESOURCES)), queued(2, reason(Reason.RESOURCES))]
    # Over budget: those that cannot wait are recorded all the same; the new ones wait.
    full = changes(recorded, queue, T1, budget=0)
    assert events(full) == {1: [(T0, [Reason.FAIR_SHARE])], 3: [(T0, [Reason.RESOURCES])]}
    assert full.deferred == T1
    within = changes(recorded, queue, T1, budget=4)
    assert events(within) == {
        1: [(T0, [Reason.FAIR_SHARE]), (T1, [Reason.RESOURCES])],
        2: [(T1, [Reason.RESOURCES])],  # its `starting` passed unrecorded
        3: [(T0, [Reason.RESOURCES])],
    }
    versions = {c.row.job_id.int: (c.expected_version, c.row.version) for c in within.changes}
    assert versions == {1: (3, 5), 2: (3, 4), 3: (3, 4)}


def test_moved_positions_of_a_deep_queue_are_written_a_part_a_round_longest_unwritten_first() -> (
    None
):
    rows = [
        replace(row(n, reason(Reason.RESOURCES)), updated_at=T0 + timedelta(seconds=n))
        for n in range(1, 6)
    ]
    recorded = {r.job_id: r for r in rows}
    moved = [queued(n, reason(Reason.RESOURCES), position=n + 1) for n in range(1, 6)]
    later = T0 + timedelta(seconds=10)
    first = changes(recorded, moved, later, moved_rows=2)
    assert [c.row.job_id.int for c in first.changes] == [1, 2] and first.deferred == later
    assert all(c.events == () and c.row.position == c.row.job_id.int + 1 for c in first.changes)
    recorded.update((c.row.job_id, c.row) for c in first.changes)
    second = changes(recorded, moved, later, moved_rows=2)
    assert [c.row.job_id.int for c in second.changes] == [3, 4]
