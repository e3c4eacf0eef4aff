"""Metadata documents and commands the models' tests share."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from controlplane.models.metadata import ModelMetadata, validate_metadata

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SHA_A = "a" * 64
SHA_B = "b" * 64

DOCUMENT: dict[str, Any] = {
    "title": "ResNet-50 on crystal images",
    "description": "Classifies crystal structures.\nTrained on 10k images.",
    "creators": [
        {
            "name": "Ada Lovelace",
            "affiliation": "Analytical Engines",
            "orcid": "0000-0002-1825-0097",
        }
    ],
    "license": "Apache-2.0",
    "citation": {"doi": "10.1000/xyz123", "text": "Lovelace, A. (2026). Crystals."},
    "domains": ["materials science"],
    "tags": ["vision", "resnet"],
    "framework": "pytorch",
    "servable": {
        "entry_point": "crystals.serve:predict",
        "input": {"type": "ndarray", "dtype": "float32", "shape": [None, 3, 224, 224]},
        "output": {"type": "list", "description": "class probabilities"},
        "requirements": ["torch>=2.1,<3", "torchvision[extra] == 0.16"],
    },
    "metrics": {"accuracy": 0.93, "top_5": 0.99},
    "provenance": {
        "job_id": "7e1f2c1a-0000-4000-8000-000000000001",
        "attempt": 2,
        "checkpoint_step": 1200,
        "data_sha256": "c" * 64,
    },
}
"""A document with every field set, each valid."""


def metadata(**changes: Any) -> ModelMetadata:
    """DOCUMENT with top-level fields replaced, validated."""
    return validate_metadata({**copy.deepcopy(DOCUMENT), **changes})
