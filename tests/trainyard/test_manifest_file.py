"""`trainyard submit FILE`: YAML and JSON manifests; a syntax error names the file, line and
column, a schema error the field (and its line in YAML); each is one line and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.api import UsageError
from trainyard.manifest_file import read_manifest

YAML = """\
# a comment, as people write them
name: mnist
image: trainyard/learner
command: [python, train.py, --epochs, "3"]
learners: 2
labels:
  team: vision
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refusal(file: str) -> str:
    with pytest.raises(UsageError) as refused:
        read_manifest(file)
    return str(refused.value)


def test_yaml_and_json_manifests_read_the_same(tmp_path: Path) -> None:
    from_yaml = read_manifest(write(tmp_path, "job.yaml", YAML))
    json_text = (
        '{"name": "mnist", "image": "trainyard/learner", "learners": 2, '
        '"command": ["python", "train.py", "--epochs", "3"], "labels": {"team": "vision"}}'
    )
    assert from_yaml == read_manifest(write(tmp_path, "job.json", json_text))
    # Only what the file gives is sent: the server applies the defaults.
    assert from_yaml == {
        "name": "mnist",
        "image": "trainyard/learner",
        "command": ["python", "train.py", "--epochs", "3"],
        "learners": 2,
        "labels": {"team": "vision"},
    }
    # A file with another name (and standard input) is read as YAML, which reads JSON too.
    assert read_manifest(write(tmp_path, "job.manifest", json_text)) == from_yaml


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    file = write(tmp_path, "job.yaml", "name: x\nimage: img\ncommand: [a, b\nlearners: 2\n")
    message = refusal(file)
    assert message.startswith(f"{file}: line 4 column 9: ")
    assert "\n" not in message
    tabs = write(tmp_path, "tabs.yaml", "name: x\n\timage: img\n")
    assert refusal(tabs).startswith(f"{tabs}: line 2 column 1: ")


def test_a_json_syntax_error_names_the_line_and_column(tmp_path: Path) -> None:
    file = write(tmp_path, "job.json", '{\n  "name": "x",\n  "image": "img"\n  "command": []\n}\n')
    assert refusal(file) == f"{file}: line 4 column 3: Expecting ',' delimiter"


def test_schema_errors_name_every_field_and_its_yaml_line(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "job.yaml",
        "name: x\nimage: img\nlearners: many\nlabels:\n  team: [a]\ncolour: red\n",
    )
    message = refusal(file)
    assert message.startswith(f"{file}: invalid manifest: ")
    assert "learners (line 3): " in message
    assert "labels.team (line 5): " in message
    assert "colour (line 6): " in message
    # A missing field points at the mapping it is missing from.
    assert "command (line 1): Field required" in message
    json_file = write(tmp_path, "job.json", '{"name": "x", "image": "img"}')
    assert refusal(json_file) == f"{json_file}: invalid manifest: command: Field required"


@pytest.mark.parametrize(
    ("text", "kind"), [("", "nothing"), ("- a\n- b\n", "a list"), ("just words\n", "a str")]
)
def test_a_manifest_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    file = write(tmp_path, "job.yaml", text)
    assert refusal(file) == f"{file}: a manifest is a mapping of fields, not {kind}"


def test_several_yaml_documents_are_refused_with_the_line(tmp_path: Path) -> None:
    file = write(tmp_path, "job.yaml", YAML + "---\nname: y\n")
    assert refusal(file).startswith(f"{file}: line 8 column 1: ")


def test_submit_refuses_a_bad_manifest_with_one_line_and_exit_code_2(tmp_path: Path) -> None:
    file = write(tmp_path, "job.yaml", "name: x\nimage: [\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    # No server is needed: the manifest is checked before anything is sent.
    result = subprocess.run(
        [sys.executable, "-m", "cli", "submit", file],
        capture_output=True,
        text=True,
        env={**env, "TRAINYARD_HOME": str(tmp_path), "TRAINYARD_SERVER": "http://127.0.0.1:9"},
        timeout=60,
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"trainyard: {file}: line 3 column 1: ")
    assert result.stdout == ""
