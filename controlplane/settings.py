"""Where Trainyard keeps its data and finds its database, from the environment."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

DATABASE_URL_ENV = "TRAINYARD_DATABASE_URL"
HOME_ENV = "TRAINYARD_HOME"
ARTIFACTS_DIR_ENV = "TRAINYARD_ARTIFACTS_DIR"
ADMIN_TOKEN_FILE = "admin-token"
"""Under `home`: the admin token a control plane writes on its first start, which operators'
commands on its machine use when given no other."""

DAY_S = 24 * 3600.0
LOG_RETENTION_ENV = "TRAINYARD_LOG_RETENTION_DAYS"
LOG_RETENTION_S = 30 * DAY_S
"""How long a job's log lines are kept after it ended (`serve` and `up` take
`--log-retention-days`, else LOG_RETENTION_ENV, else this): long enough to look into a failure
or compare runs, short enough that `job_logs` holds weeks of a fleet's history, not years."""
MAX_LOG_RETENTION_DAYS = 36_500.0
"""A hundred years: to keep logs longer is to keep them forever (0). Some bound is needed, as a
period whose cutoff fell before the first date Postgres holds would fail every sweep."""


def log_retention_days(text: str) -> float:
    """`text` as a log retention in days (0: forever); ValueError unless it is a number from 0
    to MAX_LOG_RETENTION_DAYS."""
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not 0 <= days <= MAX_LOG_RETENTION_DAYS:  # NaN compares false: refused too
        raise ValueError(
            f"{text!r} is not a number of days from 0 (keep logs forever) "
            f"to {MAX_LOG_RETENTION_DAYS:,.0f}"
        )
    return days


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
