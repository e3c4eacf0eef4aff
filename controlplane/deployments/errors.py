"""Errors of deployment, pipeline and task commands; each says what was wrong, and a refused
command writes nothing. They map onto the HTTP layer's answers (422, 404, 409)."""

from __future__ import annotations


class ServingError(Exception):
    """Base of the serving errors."""

    field: str | None = None
    """The request field that was wrong, when one was."""


class InvalidRequest(ServingError):
    """A name, setting or input that breaks the rules: a usage error (422)."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class NotFound(ServingError):
    """No such deployment, pipeline, task or model version, as the asking tenant sees it
    (404); `field` names the body's field that named it, where a body did."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class Conflict(ServingError):
    """The command does not fit the current state (409): a name taken, a deployment stopping."""
