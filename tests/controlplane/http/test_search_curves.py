"""`GET /v1/searches/{id}/curves`: every trial's metric curve in pages of trials, each curve
thinned to a bounded number of points, read from the trials' jobs' stored metric reports (one
job per rung), within the caller's tenant."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench.ui import write_search
from controlplane.http.app import create_app
from controlplane.http.keys import POOL
from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.store import write_lines
from controlplane.searches.lifecycle import trial_job_id
from runners import protocol
from tests.tenancy import Tokens, auth

Client = TestClient[Any, Any]
TRIALS = 12
BUDGET = 90  # rungs of 10, 30 and 90 steps


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(db_url))) as client:
        yield client


async def finished_search(client: Client, token: str) -> UUID:
    """A finished search of TRIALS trials, once the read model shows it."""
    search_id = await write_search(client.app[POOL], "acme", TRIALS, budget=BUDGET)
    async with asyncio.timeout(30):
        while True:
            response = await client.get(f"/v1/searches/{search_id}", headers=auth(token))
            if response.status == 200 and (await response.json())["state"] == "completed":
                return search_id
            await asyncio.sleep(0.05)


async def curves(client: Client, token: str, search_id: UUID, query: str = "") -> Any:
    response = await client.get(f"/v1/searches/{search_id}/curves{query}", headers=auth(token))
    assert response.status == 200, await response.text()
    return await response.json()


async def test_each_trial_has_its_curve_across_its_rungs_jobs(
    client: Client, tokens: Tokens
) -> None:
    search_id = await finished_search(client, tokens.acme)
    body = await curves(client, tokens.acme, search_id)
    assert (body["metric"], body["mode"], body["next_after"]) == ("loss", "min", None)
    trials = body["trials"]
    assert [t["number"] for t in trials] == list(range(TRIALS))
    # Trial 0 reached rung 2: three jobs, rung 0's first, and a curve through all their steps.
    first = trials[0]
    assert first["rung"] == 2 and first["state"] == "completed"
    assert first["jobs"] == [str(trial_job_id(search_id, 0, rung)) for rung in range(3)]
    assert [p[0] for p in first["points"]] == list(range(1, BUDGET + 1))
    assert first["reported"] == BUDGET
    # Trial 1 was pruned after rung 0: ten steps of one job.
    assert (trials[1]["rung"], trials[1]["state"], len(trials[1]["jobs"])) == (0, "pruned", 1)
    assert [p[0] for p in trials[1]["points"]] == list(range(1, 11))
    # The curve ends at the metric the trial reported at its rung.
    listed = await (
        await client.get(f"/v1/searches/{search_id}/trials", headers=auth(tokens.acme))
    ).json()
    for trial, curve in zip(listed["trials"], trials, strict=True):
        assert curve["points"][-1][1] == pytest.approx(trial["metric"])


async def test_curves_are_thinned_to_the_points_asked_keeping_both_ends(
    client: Client, tokens: Tokens
) -> None:
    search_id = await finished_search(client, tokens.acme)
    body = await curves(client, tokens.acme, search_id, "?points=10&trial=0")
    [only] = body["trials"]
    steps = [p[0] for p in only["points"]]
    assert steps[0] == 1 and steps[-1] == BUDGET
    assert 10 <= len(steps) <= 12 and steps == sorted(steps)
    assert only["reported"] == BUDGET


async def test_pages_of_trials_and_chosen_trials(client: Client, tokens: Tokens) -> None:
    search_id = await finished_search(client, tokens.acme)
    seen: list[int] = []
    after = -1
    while True:
        body = await curves(client, tokens.acme, search_id, f"?limit=5&after={after}")
        seen += [t["number"] for t in body["trials"]]
        assert len(body["trials"]) <= 5
        if body["next_after"] is None:
            break
        after = body["next_after"]
    assert seen == list(range(TRIALS))
    body = await curves(client, tokens.acme, search_id, "?trial=9&trial=3&trial=500")
    assert [t["number"] for t in body["trials"]] == [3, 9]


async def test_the_latest_report_of_a_step_from_the_first_learner_and_non_finite_values(
    client: Client, tokens: Tokens
) -> None:
    search_id = await finished_search(client, tokens.acme)
    job = trial_job_id(search_id, 1, 0)
    at = datetime.now(UTC)

    def line(attempt: int, learner: int, seq: int, text: str) -> LogLine:
        return LogLine(job, attempt, learner, Stream.STDOUT, seq, at, text)

    def metric(step: int, value: float, name: str = "loss") -> str:
        return protocol.encode(protocol.Metric(step=step, values={name: value}, at=at))

    await write_lines(
        client.app[POOL],
        [
            # A restarted attempt reports step 10 again, then diverges.
            line(2, 0, 1, metric(10, 7.5)),
            line(2, 0, 2, metric(11, math.inf)),
            line(2, 0, 3, '@@trainyard/1 {"kind":"metric","loss": not json'),
            line(2, 0, 4, metric(12, 0.5, "accuracy")),
            # Another learner's reports do not mix into the curve.
            line(1, 1, 1, metric(10, 99.0)),
        ],
    )
    [trial] = (await curves(client, tokens.acme, search_id, "?trial=1"))["trials"]
    assert trial["points"][-2:] == [[10, 7.5], [11, "inf"]]
    assert [p[0] for p in trial["points"]] == list(range(1, 12))
    body = await curves(client, tokens.acme, search_id, "?trial=1&metric=accuracy")
    assert body["mode"] is None
    assert body["trials"][0]["points"] == [[12, 0.5]]


async def test_another_tenants_search_and_bad_parameters(client: Client, tokens: Tokens) -> None:
    search_id = await finished_search(client, tokens.acme)
    for path, token in [
        (f"/v1/searches/{search_id}/curves", tokens.globex),
        (f"/v1/searches/{uuid4()}/curves", tokens.acme),
        ("/v1/searches/not-a-uuid/curves", tokens.acme),
    ]:
        response = await client.get(path, headers=auth(token))
        assert response.status == 404, path
    assert (await client.get(f"/v1/searches/{search_id}/curves")).status == 401
    admin = await client.get(f"/v1/searches/{search_id}/curves", headers=auth(tokens.admin))
    assert admin.status == 200
    for query, field in [
        ("points=1", "points"),
        ("points=1001", "points"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("after=-2", "after"),
        ("trial=x", "trial"),
        ("metric=a%20b", "metric"),
        ("metric=" + "a" * 65, "metric"),
    ]:
        response = await client.get(
            f"/v1/searches/{search_id}/curves?{query}", headers=auth(tokens.acme)
        )
        assert response.status == 400, query
        assert (await response.json())["field"] == field, query
