"""The import rules docs/architecture.md's Layout states, read from the source (every import
statement, also those inside functions): a new module that breaks one fails here, naming the
import."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FRONT_DOOR = "cli"
"""The `trainyard` command (`up` and its demo included): it may import every part (the agent's,
the simulator's and the benchmarks' lazily, see cli.main), and no part imports it."""
PACKAGES = ("controlplane", "trainyard", "node_agent", "runners", "harness", "bench", "sim")
FEATURES = (
    "controlplane.events",
    "controlplane.projections",
    "controlplane.agents",
    "controlplane.jobs",
    "controlplane.logs",
    "controlplane.models",
    "controlplane.pending",
    "controlplane.deployments",
    "controlplane.scheduling",
    "controlplane.searches",
    "controlplane.tenants",
    "controlplane.webhooks",
    "controlplane.artifacts",
    "controlplane.admission",
    "controlplane.identity",
)
"""The features: they never reach for the front ends (HTTP, the server) or the composition root
that is built from them."""

RULES: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    # (modules under, except these, may not import)
    (PACKAGES, (), (FRONT_DOOR,)),
    (("runners",), (), ("controlplane", "node_agent", "trainyard", "harness", "bench", "sim")),
    (("trainyard",), (), ("node_agent", "harness", "bench", "sim")),
    # The server and the kernel the other parts import: no arrow runs back up.
    (("controlplane",), (), ("node_agent", "trainyard", "harness", "bench", "sim")),
    (FEATURES, (), ("controlplane.http", "controlplane.composition", "controlplane.server")),
    (("controlplane.http",), (), ("controlplane.queries",)),
    (
        ("node_agent",),
        (),
        ("controlplane.http", "controlplane.composition", "trainyard", "harness", "bench", "sim"),
    ),
    (("harness",), (), ("bench", "tests", "sim")),
    (("bench",), (), ("tests",)),
    # The simulator: the control plane's scheduling, events and features' event types (and the
    # store, to read the log), never its front ends, the agent, the user's package or the tools.
    (
        ("sim",),
        (),
        (
            "controlplane.http",
            "controlplane.composition",
            "controlplane.server",
            "node_agent",
            "trainyard",
            "harness",
            "bench",
            "tests",
        ),
    ),
    # Its core is pure: only sim.log reads a database.
    (("sim",), ("sim.log",), ("asyncpg", "controlplane.database", "controlplane.events.store")),
]


ONLY: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    # (modules under, may import of these, only what is under these)
    # The agent speaks to the control plane through its port alone (controlplane.agent_port),
    # driving jobs by the pure lifecycle's commands: never its services, tables or SQL.
    (
        ("node_agent",),
        ("controlplane",),
        ("controlplane.agent_port", "controlplane.jobs.lifecycle"),
    ),
]


def _modules() -> Iterator[tuple[str, Path]]:
    for package in (FRONT_DOOR, *PACKAGES):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def broken(rules: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]) -> list[str]:
    found = []
    for module, path in _modules():
        for under, exempt, forbidden in rules:
            if not _under(module, under) or _under(module, exempt):
                continue
            found += [f"{module} imports {n}" for n in _imports(path) if _under(n, forbidden)]
    return found


def beyond(only: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]) -> list[str]:
    """The imports of `within` that are not of `allowed`, by modules under `under`."""
    found = []
    for module, path in _modules():
        for under, within, allowed in only:
            if _under(module, under):
                found += [
                    f"{module} imports {n}"
                    for n in _imports(path)
                    if _under(n, within) and not _under(n, allowed)
                ]
    return found


def test_every_package_imports_only_what_the_layout_allows() -> None:
    assert broken(RULES) == []
    assert beyond(ONLY) == []


def test_an_allow_list_that_the_code_goes_beyond_is_reported() -> None:
    # The agent drives jobs by the lifecycle's commands: the port alone is not enough.
    assert beyond([(("node_agent",), ("controlplane",), ("controlplane.agent_port",))]) != []


@pytest.mark.parametrize(
    "rule",
    [
        (("controlplane.http",), (), ("controlplane.composition",)),
        ((FRONT_DOOR,), (), ("trainyard", "node_agent", "bench", "sim")),
    ],
)
def test_a_rule_that_the_code_breaks_is_reported(
    rule: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]],
) -> None:
    # The check reads what it claims to: the HTTP layer does import the composition root, and
    # the front door the user's package, the agent, the benchmarks and the simulator.
    assert broken([rule]) != []
