"""What a publication asks for: a new version's metadata and visibility, and where its artifact
comes from (an upload, or a file of a job's results or one of its checkpoints)."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from controlplane.models.events import Visibility
from controlplane.models.metadata import INT8_MAX, ModelMetadata
from controlplane.models.service import RESULTS_FILE

PUBLICATION_PART, ARTIFACT_PART = "publication", "artifact"
"""The parts of an upload's multipart body (in either order)."""


class GivenMetadata(ModelMetadata):
    """A publication's metadata: all but the provenance, which the repository fills in (from
    the job's events, for a job's file): the service refuses one given
    (`no_provenance_given`), and the schema says so."""

    provenance: None = Field(
        default=None, description="never given: filled in from the job's events"
    )


class _Publication(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metadata: GivenMetadata
    visibility: Visibility = Visibility.PRIVATE


class UploadPublication(_Publication):
    """An upload's new version: the `publication` part of a multipart body, beside its
    `artifact` part."""

    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = Field(
        default=None, description="the artifact's sha256; the upload is refused if its bytes differ"
    )


class JobPublication(_Publication):
    """A new version made of a job's file, without an upload (a JSON body): a file of its
    results, or one of its checkpoints."""

    from_job: UUID = Field(description="the job whose results or checkpoint to publish")
    checkpoint_step: Annotated[int, Field(ge=0, le=INT8_MAX)] | None = Field(
        default=None,
        description="the checkpoint saved at this step (then results_file is not read)",
    )
    results_file: Annotated[str, StringConstraints(min_length=1, max_length=1000)] | None = Field(
        default=None,
        description=f"the file of its results, relative to them ({RESULTS_FILE})",
    )
