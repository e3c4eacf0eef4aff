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
"""The parts of an upload's multipart body, in their order."""


class Publication(BaseModel):
    """A new version: its metadata and visibility, and either an upload (the `publication`
    part of a multipart body, its `artifact` part following) or a job's results or checkpoint
    (a JSON body with `from_job`)."""

    model_config = ConfigDict(extra="forbid")

    metadata: ModelMetadata
    visibility: Visibility = Visibility.PRIVATE
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = Field(
        default=None,
        description="uploads: the artifact's sha256; the upload is refused if its bytes differ",
    )
    from_job: UUID | None = Field(
        default=None, description="publish a file of this job's results, or one of its checkpoints"
    )
    checkpoint_step: Annotated[int, Field(ge=0, le=INT8_MAX)] | None = Field(
        default=None, description="with from_job: the checkpoint saved at this step"
    )
    results_file: Annotated[str, StringConstraints(min_length=1, max_length=1000)] | None = Field(
        default=None,
        description=f"with from_job: the file of its results, relative to them ({RESULTS_FILE})",
    )
