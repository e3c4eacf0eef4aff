"""An instant as the API has always written it: `datetime.isoformat()` (`+00:00`, not the `Z`
pydantic writes), so that a view moved from a hand-built dict to a model answers the same."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import PlainSerializer

Instant = Annotated[
    datetime, PlainSerializer(lambda at: at.isoformat(), return_type=str, when_used="json")
]
