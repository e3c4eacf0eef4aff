"""The logs' facade: a page shows what its reader asked for, and its cursor moves past what it
left out; a search's bad pattern or cursor is refused naming the parameter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from controlplane.events.hub import StreamHub
from controlplane.events.metadata import Metadata
from controlplane.jobs.manifest import JobManifest
from controlplane.logs.application import LogsApplication, Shown
from controlplane.logs.feeds import LogFeeds
from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.store import write_lines
from controlplane.refusals import Refusal, Refused
from runners import protocol
from tests.cluster import Plane

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MANIFEST = JobManifest.model_validate({"name": "j", "image": "img", "command": ["train"]})


@pytest.fixture
async def logs(plane: Plane) -> AsyncIterator[LogsApplication]:
    feeds = LogFeeds(
        plane.pool, StreamHub(plane.store, plane.listener), plane.jobs, poll_s=1, settle_s=1
    )
    yield LogsApplication(plane.pool, feeds)
    await feeds.close()


def _line(job_id: UUID, seq: int, text: str, learner: int = 0) -> LogLine:
    return LogLine(
        job_id=job_id,
        attempt=1,
        learner=learner,
        stream=Stream.STDOUT,
        seq=seq,
        at=T0 + timedelta(seconds=seq),
        text=text,
    )


async def test_a_page_leaves_out_reports_and_reads_past_them(
    plane: Plane, logs: LogsApplication
) -> None:
    job, _ = await plane.jobs.submit("acme", MANIFEST, Metadata(actor="test"))
    report = protocol.encode(protocol.Metric(step=1, values={"loss": 0.5}, at=T0))
    lines = [_line(job.job_id, 1, "epoch 1"), _line(job.job_id, 2, report)]
    await write_lines(plane.pool, [*lines, _line(job.job_id, 1, "other learner", learner=1)])

    page = await logs.page(job.job_id, Shown(learner=0), 0)
    assert [s.line.text for s in page.lines] == ["epoch 1"]
    assert page.complete
    # The report, left out, was read: the next page starts after it.
    everything = await logs.page(job.job_id, Shown(learner=0, protocol=True), 0)
    assert [s.line.text for s in everything.lines] == ["epoch 1", report]
    assert page.last_id == everything.last_id == everything.lines[-1].id
    assert (await logs.page(job.job_id, Shown(learner=0), everything.lines[-1].id)).lines == []


async def test_a_search_refuses_a_bad_pattern_or_cursor_naming_it(logs: LogsApplication) -> None:
    def search_for(pattern: str) -> object:
        return logs.search_for(
            "acme",
            pattern,
            regex=True,
            ignore_case=False,
            jobs=[],
            labels={},
            since=None,
            protocol=False,
        )

    with pytest.raises(Refusal) as caught:
        search_for("")
    assert (caught.value.kind, caught.value.field) == (Refused.MALFORMED, "pattern")

    wanted = logs.search_for(
        "acme",
        "epoch",
        regex=False,
        ignore_case=False,
        jobs=[],
        labels={},
        since=None,
        protocol=False,
    )
    with pytest.raises(Refusal) as caught:
        await logs.search(wanted, "bm90LWEtY3Vyc29y", 10)
    assert (caught.value.kind, caught.value.field) == (Refused.MALFORMED, "cursor")
    with pytest.raises(Refusal) as caught:
        await logs.follow_from("nope")
    assert (caught.value.kind, caught.value.field) == (Refused.MALFORMED, "Last-Event-ID")
    assert (await logs.search(wanted, None, 10)).lines == []
