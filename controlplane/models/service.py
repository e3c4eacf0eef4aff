"""Carrying out model commands: an artifact into the content-addressed store, then its version
onto the model's stream (load, decide, append, retry on conflict); publishing straight from a
training job's results or checkpoint, with the provenance filled in from the job's events.

A publication stores the artifact before it appends the event: a refused or failed publication
may leave a blob no version names (the store deduplicates it if it comes again), never a
version whose artifact is missing.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from uuid import UUID

from controlplane.artifacts.beneath import JobFile, names_of
from controlplane.artifacts.errors import UnsafeSource
from controlplane.artifacts.local import add_job_file
from controlplane.artifacts.store import ArtifactStore, Blob
from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.events.metadata import Metadata
from controlplane.events.records import RecordedEvent
from controlplane.events.store import EventStore
from controlplane.jobs.events import CheckpointSaved
from controlplane.jobs.lifecycle import JobStatus
from controlplane.jobs.locations import CHECKPOINT_ROOTS_ENV, RESULTS_ROOTS_ENV, TENANT, Roots
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.service import Jobs
from controlplane.models.errors import (
    DuplicatePublish,
    FieldError,
    InvalidMetadata,
    InvalidModel,
    SourceNotFound,
    SourceUnavailable,
)
from controlplane.models.events import ModelEvent, Visibility
from controlplane.models.lifecycle import MODEL, ModelCommand, Publish
from controlplane.models.metadata import ModelMetadata, Provenance
from controlplane.models.names import check_model_name
from controlplane.models.references import Reference, resolve
from controlplane.models.state import ModelState, ModelVersion
from controlplane.models.streams import model_stream
from runners.uri import UriError, file_path

MAX_ARTIFACT_BYTES = 4 * 1024**3
"""The largest artifact accepted by default: a few billion parameters in half precision."""
NAME_MAX = 255
"""The longest name of a file or folder (bytes), as Linux file systems take them."""
RESULTS_FILE = "model.pt"
"""The file of a job's results published when none is named (what the PyTorch example saves)."""


@dataclass(frozen=True, slots=True)
class Published:
    """The version a publication made, or found (`created` False: a retry of one done)."""

    model: ModelState
    version: ModelVersion
    created: bool


class Models:
    """Model commands and look-ups, with each model's stream as the only truth."""

    def __init__(
        self,
        store: EventStore,
        artifacts: ArtifactStore,
        jobs: Jobs,
        *,
        roots: Roots,
        clock: Clock = SYSTEM_CLOCK,
        max_artifact_bytes: int = MAX_ARTIFACT_BYTES,
    ) -> None:
        self._store = store
        self.artifacts = artifacts
        self._jobs = jobs
        self._roots = roots
        self.clock = clock
        """What commands are timed by, and what callers time the commands they build by."""
        self.max_artifact_bytes = max_artifact_bytes

    async def load(self, tenant: str, name: str) -> ModelState | None:
        """The model now (None: nothing published under that name)."""
        return (await MODEL.load(self._store, model_stream(tenant, name))).state

    async def history(self, tenant: str, name: str) -> list[RecordedEvent]:
        """The model's recorded events, oldest first."""
        return await self._store.read_stream(model_stream(tenant, name))

    async def resolve(self, viewer: str, reference: Reference) -> tuple[ModelState, ModelVersion]:
        """The version `reference` names, as the tenant `viewer` sees it (ModelNotFound,
        UnknownVersion, UnknownAlias otherwise)."""
        owner = reference.owner or viewer
        model = await self.load(owner, reference.name)
        version = resolve(model, reference, viewer)
        assert model is not None  # resolve raises ModelNotFound for no model
        return model, version

    async def execute(
        self, tenant: str, name: str, command: ModelCommand, metadata: Metadata
    ) -> tuple[ModelState, list[ModelEvent]]:
        """Decide `command` on the model's latest state and append (retrying on a conflict):
        the model after it and the events appended; the lifecycle's refusal (a ModelError)
        otherwise, with nothing written."""
        executed = await MODEL.execute(
            self._store, model_stream(tenant, name), command, metadata.traced()
        )
        if executed.state is None:  # decide refuses every command but Publish on no model
            raise InvalidModel(f"no model {tenant}/{name}")
        return executed.state, executed.events

    async def publish(
        self,
        tenant: str,
        name: str,
        chunks: AsyncIterable[bytes],
        document: ModelMetadata,
        metadata: Metadata,
        *,
        visibility: Visibility = Visibility.PRIVATE,
        expected_sha256: str | None = None,
        room: int | None = None,
    ) -> Published:
        """Store an uploaded artifact and publish it as the model's next version. Provenance
        is the repository's to fill in (`publish_from_job`): an upload that claims one is
        refused, so that every provenance shown was checked against the job's events.
        `room`: the most bytes the tenant may still store (ArtifactTooLarge past it, or past
        `max_artifact_bytes`)."""
        check_model_name(name)
        no_provenance_given(document)
        blob = await self.artifacts.write(
            chunks, max_size=self._max_size(room), expected_sha256=expected_sha256
        )
        return await self._publish(tenant, name, blob, document, metadata, visibility)

    async def publish_from_job(
        self,
        tenant: str,
        name: str,
        job_id: UUID,
        document: ModelMetadata,
        metadata: Metadata,
        *,
        checkpoint_step: int | None = None,
        results_file: str = RESULTS_FILE,
        visibility: Visibility = Visibility.PRIVATE,
        room: int | None = None,
    ) -> Published:
        """Publish a file of a completed job's stored results (`results_file`, relative to its
        results location), or the checkpoint it saved at `checkpoint_step`, without uploading
        it again: read where the job put it, copied into the store. The provenance (job,
        attempt, checkpoint step, data sha256) comes from the job's events. `room` as for
        `publish`."""
        check_model_name(name)
        no_provenance_given(document)
        job = await self._jobs.load(job_id)
        if job is None or job.tenant != tenant:
            raise SourceNotFound(f"no job {job_id}")
        if checkpoint_step is None:
            if job.state is not JobStatus.COMPLETED:
                raise SourceUnavailable(
                    f"job {job_id} is {job.state.value}: its results are published once it "
                    "has COMPLETED (or publish one of its checkpoints)"
                )
            source, attempt = (
                self._results_file(job_id, tenant, job.manifest, results_file),
                job.attempt,
            )
        else:
            saved = [
                recorded.event
                for recorded in await self._jobs.history(job_id)
                if isinstance(recorded.event, CheckpointSaved)
                and recorded.event.step == checkpoint_step
            ]
            if not saved:
                raise SourceNotFound(
                    f"job {job_id} saved no checkpoint at step {checkpoint_step}",
                    field="checkpoint_step",
                )
            source, attempt = self._checkpoint_file(job_id, saved[-1].path), saved[-1].attempt
        provenance = Provenance(
            job_id=job_id,
            attempt=attempt,
            checkpoint_step=checkpoint_step,
            data_sha256=None if job.manifest.data is None else job.manifest.data.sha256,
        )
        try:
            blob = await add_job_file(self.artifacts, source, max_size=self._max_size(room))
        except FileNotFoundError:
            what = "results file" if checkpoint_step is None else "checkpoint"
            raise SourceUnavailable(
                f"job {job_id}'s {what} is no longer at {source.path} (a checkpoint the job has "
                "since pruned, or a directory the control plane does not mount)"
            ) from None
        except (UnsafeSource, OSError) as error:
            raise SourceUnavailable(
                f"job {job_id}'s {source.path} cannot be published: {error}"
            ) from None
        document = document.model_copy(update={"provenance": provenance})
        return await self._publish(tenant, name, blob, document, metadata, visibility)

    def _max_size(self, room: int | None) -> int:
        return self.max_artifact_bytes if room is None else min(room, self.max_artifact_bytes)

    def _checkpoint_file(self, job_id: UUID, reported: str) -> JobFile:
        """The checkpoint file a job's learner reported saving, in that job's own checkpoints
        folder under a checkpoint root, where the agent put it
        (`<root>/<job_id>/checkpoints/...`). The path is the learner's word, and the learner is
        the tenant's code: it is taken apart by name only (never resolved, which would follow
        what the learner planted) and the file is then opened by walking the root's folders."""
        path = PurePosixPath(reported)
        for root in self._roots.checkpoints:
            for named in _as_named(root):
                names = names_of(path.relative_to(named)) if path.is_relative_to(named) else None
                if names is not None and len(names) > 2 and names[:2] == _own_folder(job_id):
                    return JobFile(Path(named), names[:2], names[2:])
        raise SourceUnavailable(
            f"job {job_id}'s checkpoint {reported[:300]!r} is not in the job's checkpoints "
            f"folder under a checkpoint root ({CHECKPOINT_ROOTS_ENV}: the agents' checkpoint "
            "directories, as the control plane mounts them)"
        )

    def _results_file(
        self, job_id: UUID, tenant: str, manifest: JobManifest, relative: str
    ) -> JobFile:
        """The file `relative` names in the job's stored results, which must still lie below a
        results root of the job's tenant (the operator may have changed them since), by name:
        the folders on the way are walked from that root, never followed."""
        names = names_of(relative)
        if (
            names is None
            or any(len(name.encode("utf-8", "replace")) > NAME_MAX for name in names)
            or not relative.isprintable()
        ):
            raise InvalidModel(
                f"results_file: {relative[:200]!r} is not a path relative to the job's results "
                f"(no '..', not absolute, printable, names of at most {NAME_MAX} bytes), "
                "e.g. model.pt"
            )
        if manifest.results is None:
            raise SourceUnavailable(f"job {job_id} stores no results (its manifest has none)")
        try:
            location = PurePosixPath(file_path(manifest.results.location))
        except UriError:
            raise SourceUnavailable(
                f"job {job_id} stored its results at {manifest.results.location}, not on a "
                "file:// location the control plane reads: upload the file instead"
            ) from None
        for root in self._roots.results:
            for named in _as_named(root.replace(TENANT, tenant)):
                if location.is_relative_to(named):
                    folder = names_of(location.relative_to(named))
                    if folder is not None:
                        return JobFile(Path(named), folder, names)
        raise SourceUnavailable(
            f"job {job_id}'s results ({manifest.results.location}) are not below a results "
            f"root of tenant {tenant!r} by name ({RESULTS_ROOTS_ENV}, as the control plane "
            "mounts them)"
        )

    async def _publish(
        self,
        tenant: str,
        name: str,
        blob: Blob,
        document: ModelMetadata,
        metadata: Metadata,
        visibility: Visibility,
    ) -> Published:
        command = Publish(
            tenant=tenant,
            name=name,
            artifact_sha256=blob.sha256,
            size_bytes=blob.size,
            metadata=document,
            actor=metadata.actor,
            at=self.clock.now(),
            visibility=visibility,
        )
        try:
            model, _ = await self.execute(tenant, name, command, metadata)
        except DuplicatePublish:
            # A retry whose first answer was lost: the version it made.
            found = await self.load(tenant, name)
            # The same visibility too: published again as public, a private version must not
            # be answered as if it were done.
            wanted = (blob.sha256, document.model_dump(mode="json"), visibility)
            for version in () if found is None else found.versions:
                made = (version.artifact_sha256, version.metadata, version.visibility)
                if found is not None and made == wanted:
                    return Published(found, version, created=False)
            raise
        return Published(model, model.versions[-1], created=True)

    def download(self, version: ModelVersion) -> AsyncGenerator[bytes, None]:
        """The version's artifact, checksum verified as it is read (ArtifactCorrupted at the
        end if the stored bytes changed)."""
        return self.artifacts.read(version.artifact_sha256)


def _own_folder(job_id: UUID) -> tuple[str, str]:
    """The names of a job's own checkpoints folder below a checkpoint root."""
    return (str(job_id), "checkpoints")


def _as_named(root: str) -> tuple[PurePosixPath, ...]:
    """An operator's root as the configuration names it and as it resolves (it may be a
    symbolic link of the operator's): a path a learner reports may start with either."""
    return (PurePosixPath(root), PurePosixPath(os.path.realpath(root)))


def no_provenance_given(document: ModelMetadata) -> None:
    """Provenance is the repository's to fill in, from a job's events: a publication that
    claims one is refused (an upload's, or a job's, whose events give it), so that every
    provenance shown was checked against them."""
    if document.provenance is not None:
        raise InvalidMetadata(
            (
                FieldError(
                    "provenance",
                    "filled in when a model is published from its job (from_job), never given",
                ),
            )
        )
