"""Where on a node a job's `file://` data and results may be: only under roots the operator
configures, per tenant, never a path the tenant chooses freely.

`TRAINYARD_DATA_ROOTS` and `TRAINYARD_RESULTS_ROOTS` are lists of absolute paths separated by
`:`; `{tenant}` in a root stands for the submitting tenant's name (tenant names are lowercase
letters, digits and `-`, so they never climb out of it). Unset or empty: no root, so `file://`
is refused. A location is accepted when the path it names, with symlinks and `..` resolved,
is a root (resolved too) or lies below one (results: strictly below, since storing replaces
the location). The control plane checks at submit (403: the tenant may not use that place),
the agent again on the node before anything uses the path (a symlink may have changed
meanwhile), and the launcher checks results once more as it stores them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from runners.uri import UriError, file_path

DATA_ROOTS_ENV = "TRAINYARD_DATA_ROOTS"
RESULTS_ROOTS_ENV = "TRAINYARD_RESULTS_ROOTS"
CHECKPOINT_ROOTS_ENV = "TRAINYARD_CHECKPOINT_ROOTS"
TENANT = "{tenant}"


class LocationRefused(ValueError):
    """A `file://` location outside the operator's roots for its tenant (or the node's root
    itself, written with dot segments, as in file:///.)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def parse_roots(value: str | None, name: str) -> tuple[str, ...]:
    """The roots a setting lists; ValueError naming the setting for a relative one."""
    roots = tuple(root for root in (value or "").split(":") if root)
    for root in roots:
        if not root.startswith("/"):
            raise ValueError(f"{name}: {root!r} is not an absolute path")
    return roots


@dataclass(frozen=True, slots=True)
class Roots:
    """The operator's roots for `file://` data sources and results locations, and where the
    control plane may read jobs' checkpoints (the agents' checkpoint directories, as it mounts
    them) to publish one as a model."""

    data: tuple[str, ...] = ()
    results: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Roots:
        env = os.environ if environ is None else environ
        return cls(
            data=parse_roots(env.get(DATA_ROOTS_ENV), DATA_ROOTS_ENV),
            results=parse_roots(env.get(RESULTS_ROOTS_ENV), RESULTS_ROOTS_ENV),
            checkpoints=parse_roots(env.get(CHECKPOINT_ROOTS_ENV), CHECKPOINT_ROOTS_ENV),
        )

    def to_env(self) -> dict[str, str]:
        """The settings that give an agent (or a test's) these roots."""
        return {DATA_ROOTS_ENV: ":".join(self.data), RESULTS_ROOTS_ENV: ":".join(self.results)}


def tenant_roots(roots: tuple[str, ...], tenant: str) -> list[Path]:
    """The roots as they apply to `tenant`, resolved (an operator's root may be a symlink)."""
    return [Path(os.path.realpath(root.replace(TENANT, tenant))) for root in roots]


def root_of(path: Path, roots: tuple[str, ...], tenant: str, *, below: bool = False) -> Path | None:
    """The (resolved) root under which `path` lies once resolved; None when under none.
    `below`: the root itself does not count (results replace their location, and a root is
    the operator's)."""
    resolved = Path(os.path.realpath(path))
    for root in tenant_roots(roots, tenant):
        if resolved.is_relative_to(root) and not (below and resolved == root):
            return root
    return None


def check_file_location(
    uri: str, roots: tuple[str, ...], tenant: str, *, field: str, setting: str, below: bool
) -> Path | None:
    """The root a `file://` URI lies under (None for other schemes); LocationRefused naming
    `field` when it lies under none of the tenant's roots."""
    if urlsplit(uri).scheme.lower() != "file":
        return None
    try:
        path = file_path(uri)
    except UriError as exc:
        raise LocationRefused(field, str(exc)) from None
    if not roots:
        raise LocationRefused(
            field,
            f"file:// locations are not allowed on this service (the operator has set no "
            f"{setting}); {uri!r} was refused",
        )
    root = root_of(path, roots, tenant, below=below)
    if root is None:
        allowed = ", ".join(str(r) for r in tenant_roots(roots, tenant))
        raise LocationRefused(
            field,
            f"{uri!r} is not {'below' if below else 'under'} a root allowed for tenant "
            f"{tenant!r} ({allowed}), after resolving symlinks and '..'",
        )
    return root


def check_manifest_locations(
    data_source: str | None, results_location: str | None, roots: Roots, tenant: str
) -> None:
    """LocationRefused for the first of a manifest's `file://` locations outside its roots."""
    if data_source is not None:
        check_file_location(
            data_source,
            roots.data,
            tenant,
            field="data.source",
            setting=DATA_ROOTS_ENV,
            below=False,
        )
    if results_location is not None:
        check_file_location(
            results_location,
            roots.results,
            tenant,
            field="results.location",
            setting=RESULTS_ROOTS_ENV,
            below=True,
        )
