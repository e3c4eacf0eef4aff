"""The one error a search query can raise."""

from __future__ import annotations


class QueryError(ValueError):
    """A query that cannot be searched with. `position` is the 0-based index into the query where
    the problem is, `reason` says what it is; the message gives both (as a 1-based column), so
    that an API can answer 400 naming its `q` parameter and the CLI can print it as it is."""

    def __init__(self, reason: str, position: int) -> None:
        super().__init__(f"{reason} (at column {position + 1})")
        self.reason = reason
        self.position = position
