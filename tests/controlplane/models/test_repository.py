"""The model repository on a real Postgres: publishing through the service, the `models`
projection's rows, and the search over them, as tenants see them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.clock import SYSTEM_CLOCK
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.lifecycle import Complete, Deploy, EnterPhase, JobStatus, SaveCheckpoint
from controlplane.jobs.locations import Roots
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.service import Jobs
from controlplane.models import catalog
from controlplane.models.errors import InvalidModel, SourceUnavailable, Unchanged
from controlplane.models.events import ModelAliasSet, Visibility
from controlplane.models.lifecycle import Deprecate, SetAlias, UpdateMetadata
from controlplane.models.projection import ModelsProjection
from controlplane.models.query.query import parse
from controlplane.models.service import Models
from controlplane.models.updates import validate_update
from controlplane.projections.runner import ProjectionRunner
from tests.controlplane.artifacts.swapping import swapping
from tests.controlplane.models.samples import metadata

pytestmark = pytest.mark.postgres

ACME = Metadata(actor="tenant:acme")
GLOBEX = Metadata(actor="tenant:globex")


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.fixture
def models(store: EventStore, tmp_path: Path) -> Models:
    return Models(store, FileArtifactStore(tmp_path / "artifacts"), Jobs(store), roots=Roots())


@pytest.fixture
def runner(pool: asyncpg.Pool, store: EventStore, db_url: str) -> ProjectionRunner:
    return ProjectionRunner(pool, store, LogListener(db_url), [ModelsProjection()])


async def test_published_versions_are_searched_as_each_tenant_may_see_them(
    models: Models, runner: ProjectionRunner, pool: asyncpg.Pool
) -> None:
    private = metadata(provenance=None, title="Crystal classifier", tags=["vision"])
    public = metadata(provenance=None, title="Speech recognizer", tags=["audio"], domains=[])
    first = await models.publish("acme", "crystals", chunks(b"weights-1"), private, ACME)
    second = await models.publish(
        "globex", "speech", chunks(b"weights-2"), public, GLOBEX, visibility=Visibility.PUBLIC
    )
    assert (first.version.number, second.version.number) == (1, 1)
    await runner.catch_up(ModelsProjection())

    acme = await catalog.search(pool, parse(""), viewer="acme")
    assert {(v.tenant, v.name) for v in acme.versions} == {
        ("acme", "crystals"),
        ("globex", "speech"),
    }
    globex = await catalog.search(pool, parse(""), viewer="globex")
    assert [(v.tenant, v.name) for v in globex.versions] == [("globex", "speech")]
    found = await catalog.search(pool, parse("crystal name~ryst"), viewer="acme")
    assert [v.name for v in found.versions] == ["crystals"]
    assert found.total == 1
    assert found.facets["framework"] == {"pytorch": 1}
    assert found.facets["domain"] == {"materials science": 1}

    model, _ = await models.execute(
        "acme",
        "crystals",
        UpdateMetadata(1, validate_update({"tags": ["vision", "x-ray"]}), models.clock.now()),
        ACME,
    )
    assert model.versions[0].metadata["tags"] == ["vision", "x-ray"]
    await models.execute("acme", "crystals", SetAlias("production", 1, models.clock.now()), ACME)
    await runner.catch_up(ModelsProjection())
    assert [
        v.name for v in (await catalog.search(pool, parse("tag:x-ray"), viewer="acme")).versions
    ] == ["crystals"]
    assert await catalog.aliases_of(pool, "acme", "crystals") == {"production": 1}


async def test_concurrent_alias_moves_each_land_once_in_one_chain(
    models: Models, runner: ProjectionRunner, pool: asyncpg.Pool
) -> None:
    document = metadata(provenance=None)
    for n in range(1, 5):
        await models.publish("acme", "m", chunks(b"w%d" % n), document, ACME)
    # Sixteen movers race for one alias: none is lost, and each event's `previous` is the
    # version the one before it set, so the history is one chain.
    moves = [SetAlias("production", 1 + n % 4, models.clock.now()) for n in range(16)]
    results = await asyncio.gather(
        *(models.execute("acme", "m", move, ACME) for move in moves), return_exceptions=True
    )
    landed = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    # A move to the version the alias names already is Unchanged: nothing to write.
    assert all(isinstance(r, Unchanged) for r in refused)
    history = [e.event for e in await models.history("acme", "m")]
    sets = [e for e in history if isinstance(e, ModelAliasSet)]
    assert len(sets) == len(landed)
    assert [s.previous for s in sets] == [None, *(s.version for s in sets[:-1])]
    await runner.catch_up(ModelsProjection())
    assert await catalog.aliases_of(pool, "acme", "m") == {"production": sets[-1].version}


async def test_same_bytes_share_one_blob_and_a_rebuild_gives_the_same_rows(
    models: Models, runner: ProjectionRunner, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    one = await models.publish(
        "acme", "a", chunks(b"same ", b"bytes"), metadata(provenance=None), ACME
    )
    two = await models.publish(
        "globex", "b", chunks(b"same bytes"), metadata(provenance=None, tags=["other"]), GLOBEX
    )
    assert one.version.artifact_sha256 == two.version.artifact_sha256
    assert len(list((tmp_path / "artifacts" / "sha256").rglob("*"))) == 3  # ab/, ab/cd/, blob

    # A retried publication (its answer lost) finds the version it made; nothing new.
    again = await models.publish(
        "acme", "a", chunks(b"same bytes"), metadata(provenance=None), ACME
    )
    assert (again.created, again.version.number) == (False, 1)

    await models.execute(
        "acme",
        "a",
        UpdateMetadata(1, validate_update({"metrics": {"f1": 0.5}}), models.clock.now()),
        ACME,
    )
    await models.execute("acme", "a", Deprecate(1, "superseded", models.clock.now()), ACME)
    await runner.catch_up(ModelsProjection())
    rows = "SELECT * FROM model_versions ORDER BY tenant, name, version"
    before = [dict(r) for r in await pool.fetch(rows)]
    assert before[0]["deprecated"] == "superseded"
    assert json.loads(before[0]["metrics"]) == {"accuracy": 0.93, "top_5": 0.99, "f1": 0.5}
    assert json.loads(before[0]["metadata"])["metrics"]["f1"] == 0.5
    await runner.rebuild("models")
    assert [dict(r) for r in await pool.fetch(rows)] == before


async def test_a_checkpoint_is_published_only_from_its_jobs_own_checkpoints_folder(
    store: EventStore, tmp_path: Path
) -> None:
    # The path of a checkpoint is what the job's learner (the tenant's code) reported: anywhere
    # but the job's own checkpoints folder under a checkpoint root, it is not read.
    root = tmp_path / "checkpoints"
    jobs = Jobs(store)
    roots = Roots(checkpoints=(str(root),))
    models = Models(store, FileArtifactStore(tmp_path / "artifacts"), jobs, roots=roots)
    manifest = JobManifest.model_validate({"name": "t", "image": "img", "command": ["train"]})
    job, _ = await jobs.submit("acme", manifest, ACME)
    other, _ = await jobs.submit("acme", manifest, ACME)
    now = SYSTEM_CLOCK.now()
    await jobs.execute(job.job_id, Deploy(["n1"], [], 1, now), ACME)
    await jobs.execute(job.job_id, EnterPhase(JobStatus.PROCESSING, now), ACME)
    own = root / str(job.job_id) / "checkpoints" / "learner-0" / "step-7.pt"
    theirs = root / str(other.job_id) / "checkpoints" / "learner-0" / "step-7.pt"
    secret = tmp_path / "agent-token"
    for path, content in ((own, b"weights"), (theirs, b"other weights"), (secret, b"token")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    link = own.parent / "step-9.pt"
    link.symlink_to(secret)
    linked_folder = root / str(job.job_id) / "checkpoints" / "learner-1"
    linked_folder.symlink_to(tmp_path)
    reported = {7: own, 8: secret, 9: link, 10: theirs, 11: linked_folder / "agent-token"}
    for step, path in reported.items():
        await jobs.execute(
            job.job_id, SaveCheckpoint(step, str(path), 1, 0.1, SYSTEM_CLOCK.now()), ACME
        )

    document = metadata(provenance=None)
    published = await models.publish_from_job(
        "acme", "m", job.job_id, document, ACME, checkpoint_step=7
    )
    assert published.version.size_bytes == len(b"weights")
    for step in (8, 10):
        with pytest.raises(SourceUnavailable, match="is not in the job's checkpoints folder"):
            await models.publish_from_job(
                "acme", "m", job.job_id, document, ACME, checkpoint_step=step
            )
    for step in (9, 11):
        with pytest.raises(SourceUnavailable, match="a symbolic link: only a regular file"):
            await models.publish_from_job(
                "acme", "m", job.job_id, document, ACME, checkpoint_step=step
            )
    unrooted = Models(store, models.artifacts, jobs, roots=Roots())
    with pytest.raises(SourceUnavailable, match="TRAINYARD_CHECKPOINT_ROOTS"):
        await unrooted.publish_from_job("acme", "n", job.job_id, document, ACME, checkpoint_step=7)
    model = await models.load("acme", "m")
    assert model is not None and len(model.versions) == 1


async def test_a_checkpoint_folder_swapped_for_a_link_never_publishes_what_it_leads_to(
    store: EventStore, tmp_path: Path
) -> None:
    # The learner swaps a folder of its checkpoint's path with a symbolic link to a folder of
    # the control plane's (renameat2 RENAME_EXCHANGE in a loop) while its tenant publishes the
    # checkpoint again and again: a check of the path and its opening race; the walk does not.
    root, outside = tmp_path / "checkpoints", tmp_path / "outside"
    jobs = Jobs(store)
    roots = Roots(checkpoints=(str(root),))
    models = Models(store, FileArtifactStore(tmp_path / "artifacts"), jobs, roots=roots)
    manifest = JobManifest.model_validate({"name": "t", "image": "img", "command": ["train"]})
    job, _ = await jobs.submit("acme", manifest, ACME)
    now = SYSTEM_CLOCK.now()
    await jobs.execute(job.job_id, Deploy(["n1"], [], 1, now), ACME)
    await jobs.execute(job.job_id, EnterPhase(JobStatus.PROCESSING, now), ACME)
    learner = root / str(job.job_id) / "checkpoints" / "learner-0"
    learner.mkdir(parents=True)
    (learner / "step-7.pt").write_bytes(b"weights")
    outside.mkdir()
    (outside / "step-7.pt").write_bytes(b"the control plane's secret")
    (learner.parent / "swap").symlink_to(outside)
    checkpoint = SaveCheckpoint(7, str(learner / "step-7.pt"), 1, 0.1, now)
    await jobs.execute(job.job_id, checkpoint, ACME)
    document = metadata(provenance=None)
    outcomes: dict[str, int] = {}
    async with swapping(learner, learner.parent / "swap"):
        for _ in range(400):
            try:
                published = await models.publish_from_job(
                    "acme", "m", job.job_id, document, ACME, checkpoint_step=7
                )
                data = b"".join([chunk async for chunk in models.download(published.version)])
                outcome = data.decode()
            except SourceUnavailable:
                outcome = "refused"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert "the control plane's secret" not in outcomes, outcomes
    # Both sides of the race were met, or the test proved nothing.
    assert outcomes.get("weights", 0) > 0 and outcomes.get("refused", 0) > 0, outcomes


async def test_a_results_file_that_no_file_system_could_name_is_refused(
    store: EventStore, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "model.pt").write_bytes(b"weights")
    jobs = Jobs(store)
    models = Models(
        store,
        FileArtifactStore(tmp_path / "artifacts"),
        jobs,
        roots=Roots(results=(str(tmp_path),)),
    )
    manifest = JobManifest.model_validate(
        {
            "name": "t",
            "image": "img",
            "command": ["train"],
            "results": {"location": results.as_uri()},
        }
    )
    job, _ = await jobs.submit("acme", manifest, ACME)
    now = SYSTEM_CLOCK.now()
    for command in (
        Deploy(["n1"], [], 1, now),
        EnterPhase(JobStatus.PROCESSING, now),
        Complete([0], now),
    ):
        await jobs.execute(job.job_id, command, ACME)
    document = metadata(provenance=None)
    for bad in ("a" * 300, "a\x00b", "line\nbreak"):
        with pytest.raises(InvalidModel, match="results_file"):
            await models.publish_from_job("acme", "m", job.job_id, document, ACME, results_file=bad)
    with pytest.raises(SourceUnavailable, match="cannot be published"):
        await models.publish_from_job(
            "acme", "m", job.job_id, document, ACME, results_file="model.pt/inside"
        )
    published = await models.publish_from_job("acme", "m", job.job_id, document, ACME)
    assert published.version.size_bytes == len(b"weights")
