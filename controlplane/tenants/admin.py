"""The admin token: issued once, on the control plane's first start, and kept in the data
directory for the operator."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.events.errors import ConcurrencyError
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.projections.runner import ProjectionRunner
from controlplane.settings import ADMIN_TOKEN_FILE
from controlplane.tenants.events import AdminTokenIssued
from controlplane.tenants.service import project_now
from controlplane.tenants.streams import ADMIN_STREAM
from controlplane.tenants.tokens import new_token

ACTOR = "system:bootstrap"


async def bootstrap_admin_token(
    store: EventStore, runner: ProjectionRunner, home: Path, *, clock: Clock = SYSTEM_CLOCK
) -> str | None:
    """Issue the admin token unless one exists; return it (to print) and keep it in
    `home/admin-token` (mode 0600). None when an earlier start or another replica issued it.

    Replicas starting together each try to append at version 0, and exactly one succeeds. The
    token is written to a file of its own before the append and renamed into place after it,
    so the file always holds the token that won, and a crash in between leaves it on disk.
    """
    # A start with an admin token already touches no files: the data directory may be read-only.
    if await store.read_stream(ADMIN_STREAM):
        return None
    token = new_token()
    pending = home / f"{ADMIN_TOKEN_FILE}.pending-{token.token_id}"
    await asyncio.to_thread(_write_secret, pending, token.plaintext)
    try:
        appended = await store.append(
            ADMIN_STREAM,
            0,
            [AdminTokenIssued(token_id=token.token_id, token_sha256=token.sha256, at=clock.now())],
            Metadata.capture(ACTOR),
        )
    except ConcurrencyError:
        # Certainly not stored. After any other failure the append may have committed, so
        # the pending file stays for the operator.
        await asyncio.to_thread(pending.unlink)
        return None
    await asyncio.to_thread(pending.replace, home / ADMIN_TOKEN_FILE)
    await project_now(runner, appended.log_position)
    return token.plaintext


def _write_secret(path: Path, secret: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Created 0600 (never readable by others, not even briefly); O_EXCL refuses to follow a
    # planted file or link.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secret + "\n")
        file.flush()
        os.fsync(file.fileno())
