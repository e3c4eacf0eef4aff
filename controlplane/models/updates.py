"""Which parts of a published version's metadata may change, and how an update is read.

A published version is a claim others rely on: they downloaded its artifact under its license,
cite it by its title and creators, build replicas from its servable, chose it for its metrics,
and trust its provenance. None of that changes; a different claim is a new version. What may
change is what helps people find and credit it, without changing what it is:

- `description`, `domains`, `tags`: words for discovery; better words change no behaviour.
- `citation`: a DOI is usually minted after a model is published (when its paper is); adding
  it credits the creators and changes nothing about the model.
- `metrics`, additions only: a version may be evaluated on a new benchmark later. A number
  once recorded is never changed, since users chose the version by it.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field, ValidationError

from controlplane.models.errors import FieldError, InvalidMetadata
from controlplane.models.metadata import (
    Citation,
    Description,
    Domains,
    Metrics,
    ModelMetadata,
    StrictModel,
    Tags,
    field_errors,
)


class MetadataUpdate(StrictModel):
    """The mutable parts of a version's metadata; a field left out (null) stays as it is."""

    description: Description | None = None
    domains: Domains | None = None
    tags: Tags | None = None
    citation: Citation | None = None
    metrics: Metrics = Field(
        default_factory=dict, description="metrics to add; one recorded already never changes"
    )


MUTABLE = frozenset(MetadataUpdate.model_fields)
IMMUTABLE = frozenset(ModelMetadata.model_fields) - MUTABLE


def validate_update(document: object) -> MetadataUpdate:
    """`document` (parsed JSON) as an update; InvalidMetadata naming every bad field, each
    immutable one said to be so."""
    errors: list[FieldError] = []
    if isinstance(document, Mapping):
        errors.extend(
            FieldError(str(name), "immutable once published: publish a new version to change it")
            for name in document
            if name in IMMUTABLE
        )
        document = {k: v for k, v in document.items() if k not in IMMUTABLE}
    try:
        update = MetadataUpdate.model_validate(document)
    except ValidationError as exc:
        raise InvalidMetadata((*errors, *field_errors(exc))) from None
    if errors:
        raise InvalidMetadata(tuple(errors))
    return update
