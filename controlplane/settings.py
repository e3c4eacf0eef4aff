"""Where Trainyard keeps its data and finds its database, from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DATABASE_URL_ENV = "TRAINYARD_DATABASE_URL"
HOME_ENV = "TRAINYARD_HOME"
ADMIN_TOKEN_FILE = "admin-token"
"""Under `home`: the admin token a control plane writes on its first start, which operators'
commands on its machine use when given no other."""


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    """The data directory: the embedded Postgres and other local state live here."""
    database_url: str | None
    """An external Postgres; None means the embedded one under `home`."""

    @classmethod
    def from_env(cls) -> Settings:
        home = os.environ.get(HOME_ENV) or "~/.local/share/trainyard"
        return cls(
            home=Path(home).expanduser(),
            database_url=os.environ.get(DATABASE_URL_ENV) or None,
        )
