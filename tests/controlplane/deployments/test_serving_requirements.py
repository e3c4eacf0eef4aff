"""A model that lists requirements: the agent fetches them as wheels (here from a local folder,
as pip's own settings point it: this machine's tests reach no index), installs them into a
folder of their own, cached by their hash, and the replica imports them."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from controlplane.models.metadata import ModelMetadata
from tests.controlplane.deployments.serving import (
    deploy,
    metadata,
    predict,
    publish,
    serving_cluster,
    until_serving,
)
from tests.tenancy import Tokens

USES_PACKAGE = b"""import tinytrainyardpkg

def predict(batch):
    return [tinytrainyardpkg.triple(x) for x in batch]
"""


def build_wheel(folder: Path) -> Path:
    """A real wheel of a pure-Python package, `tinytrainyardpkg` 1.0, with its RECORD."""
    files = {
        "tinytrainyardpkg/__init__.py": b"def triple(x):\n    return 3 * x\n",
        "tinytrainyardpkg-1.0.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: tinytrainyardpkg\nVersion: 1.0\n"
        ),
        "tinytrainyardpkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinytrainyardpkg-1.0.dist-info/RECORD,,")
    path = folder / "tinytrainyardpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("tinytrainyardpkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


async def test_a_models_requirements_are_installed_for_its_replicas(
    db_url: str, tmp_path: Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    doc = metadata("uses:predict")
    doc["servable"]["requirements"] = ["tinytrainyardpkg==1.0"]
    ModelMetadata.model_validate(doc)
    async with serving_cluster(db_url, tmp_path) as (client, agents):
        await publish(client, tokens.acme, "uses", USES_PACKAGE, "uses:predict", document=doc)
        await deploy(client, tokens.acme, name="uses", model="uses")
        await until_serving(client, tokens.acme, "uses", 1)
        status, task = await predict(client, tokens.acme, "uses", [1, 2])
        assert (status, task.get("outputs")) == (200, [3, 6]), task
        installed = list((agents[0].config.work_dir / "packages").glob("*/site/tinytrainyardpkg"))
        assert len(installed) == 1


async def test_requirements_that_cannot_be_installed_fail_the_tasks_saying_why(
    db_url: str, tmp_path: Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    doc = metadata("uses:predict")
    doc["servable"]["requirements"] = ["no-such-package-anywhere==9.9"]
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "uses", USES_PACKAGE, "uses:predict", document=doc)
        await deploy(client, tokens.acme, name="uses", model="uses")
        await until_serving(client, tokens.acme, "uses", 1)
        status, task = await predict(client, tokens.acme, "uses", [1])
        assert (status, task["status"]) == (200, "failed")
        assert "requirements could not be installed" in task["error"]
        assert "no-such-package-anywhere" in task["error"]
