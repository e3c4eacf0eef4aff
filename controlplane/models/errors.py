"""Errors of model commands and look-ups; each says what was wrong, and a refused command
writes nothing. The classes map one to one onto the HTTP layer's answers (422, 404, 409)."""

from __future__ import annotations

from dataclasses import dataclass


class ModelError(Exception):
    """Base of the errors of model commands and look-ups."""


class InvalidModel(ModelError):
    """A name, alias, reference, reason or artifact digest that breaks the rules: a usage
    error."""


class ReservedAlias(InvalidModel):
    """An alias the repository derives itself (`latest`), which no one sets or removes."""


@dataclass(frozen=True, slots=True)
class FieldError:
    """One bad field of a metadata document: where (`creators.0.orcid`) and why."""

    path: str
    message: str


class InvalidMetadata(InvalidModel):
    """A metadata document (or update) with bad fields: `errors` names every one of them, so
    that one answer can list them all."""

    def __init__(self, errors: tuple[FieldError, ...]) -> None:
        listed = "; ".join(f"{e.path}: {e.message}" for e in errors)
        super().__init__(f"invalid metadata ({len(errors)} field(s)): {listed}")
        self.errors = errors


class ModelNotFound(ModelError):
    """No such model, or one the asking tenant may not see (the same answer, so that a private
    model's existence is not given away)."""


class UnknownVersion(ModelError):
    """The model has no such version (visible to the asking tenant)."""


class UnknownAlias(ModelError):
    """The model has no such alias (naming a version visible to the asking tenant)."""


class DuplicatePublish(ModelError):
    """The same artifact with the same metadata is published already, as the version named."""


class ImmutableField(ModelError):
    """A change to what a published version fixed for good (its artifact, servable, recorded
    metrics, ...): publish a new version instead."""


class VersionDeprecated(ModelError):
    """The version is deprecated: an alias may not name it."""


class VersionAliased(ModelError):
    """The version is named by an alias, which would go on naming a deprecated version."""


class TooManyAliases(ModelError):
    """The model has as many aliases as it may have."""


class Unchanged(ModelError):
    """The command would change nothing (the alias names that version already, ...); the
    model is as asked, so a caller may answer as if it had been done."""


class ModelBusy(ModelError):
    """The model kept changing under concurrent commands; the command gave up."""


class SourceNotFound(ModelError):
    """Publishing from a job the tenant has no such job of (`from_job`), or not that checkpoint
    (`checkpoint_step`): `field` names which."""

    def __init__(self, message: str, field: str = "from_job") -> None:
        super().__init__(message)
        self.field = field


class SourceUnavailable(ModelError):
    """The job's results or checkpoint cannot be published now: the job has not completed, it
    stored no results on a `file://` location, or the file is gone (a pruned checkpoint)."""


MISSING = (ModelNotFound, UnknownVersion, UnknownAlias)
"""What a reference names that does not exist (for the asking tenant): a 404 wherever it is
named, in a path or in a body."""
