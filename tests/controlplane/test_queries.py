"""The query registry: every feature's named-query file under one namespace, duplicates refused."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest

from controlplane.queries import Q, load, sql_files


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_queries_of_every_file_are_loaded_by_name(tmp_path: Path) -> None:
    _write(tmp_path / "a.sql", "-- What a is.\n\n-- name: one\n-- Why.\nSELECT 1;\n")
    _write(tmp_path / "jobs" / "queries.sql", "-- name: two\nSELECT 2;\n-- name: three\nSELECT 3;")
    _write(tmp_path / "jobs" / "notes.txt", "-- name: four\nSELECT 4;\n")

    assert load(tmp_path) == {"one": "-- Why.\nSELECT 1;", "two": "SELECT 2;", "three": "SELECT 3;"}


def test_a_name_defined_in_two_files_fails_naming_both(tmp_path: Path) -> None:
    _write(tmp_path / "jobs" / "queries.sql", "-- name: ping\nSELECT 1;\n")
    _write(tmp_path / "agents" / "queries.sql", "-- name: ping\nSELECT 2;\n")

    with pytest.raises(ValueError, match=r"'ping' is defined in agents/queries\.sql and in jobs/"):
        load(tmp_path)


def test_a_name_defined_twice_in_one_file_fails(tmp_path: Path) -> None:
    _write(tmp_path / "queries.sql", "-- name: ping\nSELECT 1;\n-- name: ping\nSELECT 2;\n")

    with pytest.raises(ValueError, match=r"'ping' is defined twice"):
        load(tmp_path)


def test_the_control_plane_keeps_its_sql_per_feature() -> None:
    paths = {path for path, _ in sql_files(files("controlplane"))}

    assert {"jobs/queries.sql", "agents/queries.sql", "events/queries.sql"} <= paths
    assert "queries.sql" not in paths
    assert Q["append_events"].startswith("-- Append events")
    assert Q["claim_candidates"] and Q["list_jobs"] and Q["insert_webhook_deliveries"]
