"""`trainyard bench serving`'s model: the artifact Trainyard's replicas get holds the very model
the peers exec from MLP_SOURCE, and building it twice gives the same bytes."""

from __future__ import annotations

import importlib.util
import io
import zipfile
from pathlib import Path
from typing import Any

import pytest

from bench.serving_model import (
    INPUT_SIZE,
    MLP_SOURCE,
    mlp_artifact,
    noop_artifact,
    sample_input,
)

torch = pytest.importorskip("torch")


def test_the_artifact_is_a_zip_of_mlp_py_whose_predict_is_the_models(tmp_path: Path) -> None:
    with zipfile.ZipFile(io.BytesIO(mlp_artifact())) as archive:
        assert archive.namelist() == ["mlp.py"]
        archive.extractall(tmp_path)
    shipped = _import(tmp_path / "mlp.py", "bench_serving_mlp")
    direct: dict[str, Any] = {}
    exec(compile(MLP_SOURCE, "mlp.py", "exec"), direct)
    batch = [sample_input(seed) for seed in range(5)]

    outputs = shipped.predict(batch)

    assert [len(output) for output in outputs] == [10] * 5
    with torch.inference_mode():
        expected = direct["MODEL"](torch.tensor(batch, dtype=torch.float32)).tolist()
    assert outputs == expected


def test_the_artifacts_bytes_depend_on_their_content_alone() -> None:
    assert mlp_artifact() == mlp_artifact()
    assert noop_artifact() == noop_artifact()


def test_a_sample_is_784_floats_in_the_unit_interval_and_the_same_for_a_seed() -> None:
    sample = sample_input(3)
    assert len(sample) == INPUT_SIZE
    assert all(0 <= value < 1 for value in sample)
    assert sample == sample_input(3) != sample_input(4)


def _import(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
