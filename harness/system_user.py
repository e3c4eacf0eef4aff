"""The system user the servers the harnesses start run as when the harness is root: Postgres
refuses to run as root, so Patroni, pgBackRest and pgBouncer run as the user the embedded
Postgres (pgserver) already runs as, created the same way."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Final

SYSTEM_USER: Final = "pgserver"


def runs_as() -> pwd.struct_passwd | None:
    """SYSTEM_USER, created if missing, when this process is root; None: as this process's
    user."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        from pgserver.utils import ensure_user_exists

        ensure_user_exists(SYSTEM_USER)
        return pwd.getpwnam(SYSTEM_USER)


def give(path: Path, user: pwd.struct_passwd | None) -> None:
    """`path` to `user`, when there is one."""
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)
