"""The STORING phase's work: copy the results directory to the results location.

Supported locations: `file://` (a directory, created with its parents if missing, replaced if it
exists), below the operator's root when the agent names one (`TRAINYARD_RESULTS_ROOT`): checked
with symlinks resolved, so a location that has come to pass through a symlink out of the root
is refused rather than replaced. The copy is assembled under a hidden staging name next to the
destination, made durable, and only then renamed into place, so the destination never holds a
partial copy.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path

from runners.config import RESULTS_SCHEMES
from runners.durable import fsync_dir, fsync_tree
from runners.phases import PhaseError
from runners.uri import UriError, file_path, require_scheme


class StoreError(PhaseError):
    """The results could not be stored at the results location."""


def store(results_dir: Path, uri: str, *, root: Path | None = None) -> None:
    """Copy `results_dir` to the location `uri` names, which must lie below `root` if given."""
    try:
        require_scheme(uri, RESULTS_SCHEMES)
        destination = file_path(uri)
        if root is not None:
            destination = _below(destination, root)
        if not results_dir.is_dir():
            raise StoreError(f"cannot store results: {results_dir} is not a directory")
        _replace_tree(results_dir, destination)
    except (OSError, UriError) as error:
        raise StoreError(f"cannot store results to {uri}: {error!s}") from error


def _below(destination: Path, root: Path) -> Path:
    """`destination` with symlinks resolved, if it lies below `root` (the root itself is not
    replaced: it is the operator's)."""
    resolved = Path(os.path.realpath(destination))
    if resolved == Path(os.path.realpath(root)) or not resolved.is_relative_to(
        os.path.realpath(root)
    ):
        raise StoreError(
            f"cannot store results to {destination}: it resolves to {resolved}, which is not "
            f"below the results root {root}"
        )
    return resolved


def _replace_tree(source: Path, destination: Path) -> None:
    parent = destination.parent
    for path in (destination, parent):
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:12]
    staging = parent / f".{destination.name}.staging-{token}"
    previous = parent / f".{destination.name}.previous-{token}"
    try:
        shutil.copytree(source, staging, symlinks=True)
        # Durable before it becomes visible: once STORING is reported done, the learner's own
        # directories may be deleted, and the stored copy is then the only one.
        fsync_tree(staging)
        if destination.exists():
            # Two renames, not one: rename(2) cannot replace a non-empty directory. A crash
            # between them leaves both complete copies under hidden names and no destination,
            # which a retried STORING replaces; it never leaves a mixed directory.
            os.rename(destination, previous)
        os.rename(staging, destination)
        fsync_dir(parent)
        # Errors ignored: the results are stored; a superseded copy left over takes space but
        # is no reason to report STORING failed.
        shutil.rmtree(previous, ignore_errors=True)
    except BaseException:
        _recover(destination, staging, previous)
        raise


def _recover(destination: Path, staging: Path, previous: Path) -> None:
    """Tidy up after a replacement cut short by an error or a signal, keeping complete results."""
    if previous.exists():
        if destination.exists():
            shutil.rmtree(previous, ignore_errors=True)  # the new results are already in place
        else:
            os.rename(previous, destination)  # cut between the renames: restore the old results
    shutil.rmtree(staging, ignore_errors=True)
