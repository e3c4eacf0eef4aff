"""Where Trainyard keeps its data and finds its database, from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DATABASE_URL_ENV = "TRAINYARD_DATABASE_URL"
HOME_ENV = "TRAINYARD_HOME"
ARTIFACTS_DIR_ENV = "TRAINYARD_ARTIFACTS_DIR"
ADMIN_TOKEN_FILE = "admin-token"
"""Under `home`: the admin token a control plane writes on its first start, which operators'
commands on its machine use when given no other."""


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    """The data directory: the embedded Postgres and other local state live here."""
    database_url: str | None
    """An external Postgres; None means the embedded one under `home`."""
    artifacts_dir: Path | None = None
    """The model repository's artifact store (a directory every node mounts, for a fleet);
    None: `artifacts` under `home`."""

    @classmethod
    def from_env(cls) -> Settings:
        home = os.environ.get(HOME_ENV) or "~/.local/share/trainyard"
        return cls(
            home=Path(home).expanduser(),
            database_url=os.environ.get(DATABASE_URL_ENV) or None,
            artifacts_dir=Path(artifacts).expanduser()
            if (artifacts := os.environ.get(ARTIFACTS_DIR_ENV))
            else None,
        )
