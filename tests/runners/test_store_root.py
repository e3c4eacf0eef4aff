"""STORING replaces its location only below the results root the agent names: a location that
has come to pass through a symlink out of the root (planted by the job itself, after submit)
is refused and the tree it points at is left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.config import RESULTS_DIR, RESULTS_ROOT, RESULTS_URI, load_launch_config
from runners.store import StoreError, store


@pytest.fixture
def results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    (results / "model.pt").write_text("weights")
    return results


def test_results_are_stored_below_the_root(tmp_path: Path, results: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    store(results, (root / "run" / "1").as_uri(), root=root)
    assert (root / "run" / "1" / "model.pt").read_text() == "weights"


def test_a_location_through_a_symlink_out_of_the_root_is_refused(
    tmp_path: Path, results: Path
) -> None:
    root, outside = tmp_path / "root", tmp_path / "etc"
    root.mkdir()
    outside.mkdir()
    (outside / "passwd").write_text("kept")
    (root / "run").symlink_to(outside)
    with pytest.raises(StoreError, match="not below the results root"):
        store(results, (root / "run").as_uri(), root=root)
    with pytest.raises(StoreError, match="not below the results root"):
        store(results, (root / "run" / "x").as_uri(), root=root)
    assert [p.name for p in outside.iterdir()] == ["passwd"]
    assert (outside / "passwd").read_text() == "kept"


def test_the_root_itself_is_never_replaced(tmp_path: Path, results: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "other-run").mkdir()
    with pytest.raises(StoreError, match="not below the results root"):
        store(results, root.as_uri(), root=root)
    assert [p.name for p in root.iterdir()] == ["other-run"]


def test_the_launcher_takes_the_root_from_its_environment() -> None:
    config = load_launch_config(
        {RESULTS_DIR: "/r", RESULTS_URI: "file:///store/x", RESULTS_ROOT: "/store"}
    )
    assert config.results is not None and config.results.root == Path("/store")
