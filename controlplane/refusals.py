"""What a feature's facade refuses, and why, said once for every front end.

A facade (`controlplane/<feature>/application.py`) checks a request before anything is written
and raises `Refusal` naming the kind of refusal, a message for a person and the offending field.
The HTTP layer turns it into a status and an `Error` body (`controlplane.http.errors`); the CLI
and the SDK read that body. The kinds are the questions a client acts on: fix the request, stop
asking, look elsewhere, retry later.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class Refused(enum.Enum):
    """Why a request changes nothing."""

    MALFORMED = "malformed"
    """A parameter that does not parse (400)."""
    FORBIDDEN = "forbidden"
    """Not for this caller (403)."""
    NOT_FOUND = "not_found"
    """No such thing, or none the caller may see: another tenant's is never disclosed (404)."""
    CONFLICT = "conflict"
    """Illegal in the current state of what it names (409)."""
    INVALID = "invalid"
    """A well-formed request the rules refuse: a field's value, a limit never met (422)."""
    LIMITED = "limited"
    """A limit reached for now: waiting helps (429, with the seconds to wait when known)."""
    TOO_LARGE = "too_large"
    """Over a size limit, the server's or the room a tenant's limit leaves; nothing kept (413)."""


class Refusal(Exception):
    """A request refused; nothing was written."""

    def __init__(
        self,
        kind: Refused,
        message: str,
        *,
        field: str | None = None,
        fields: Sequence[tuple[str, str]] = (),
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.field = field
        self.fields = tuple(fields)
        """Each bad field with what is wrong with it, where a request has several (INVALID)."""
        self.retry_after_s = retry_after_s
