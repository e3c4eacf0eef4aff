"""The metadata schema: every bad field of a hostile document is named at once, with its path;
updates name immutable fields; the JSON Schema is generated."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from controlplane.models.errors import InvalidMetadata
from controlplane.models.metadata import (
    MAX_REQUIREMENTS,
    MAX_TAGS,
    SCHEMA_ID,
    json_schema,
    validate_metadata,
)
from controlplane.models.updates import IMMUTABLE, MUTABLE, validate_update
from tests.controlplane.models.samples import DOCUMENT


def errors_of(document: object) -> dict[str, str]:
    with pytest.raises(InvalidMetadata) as raised:
        validate_metadata(document)
    return {e.path: e.message for e in raised.value.errors}


def test_a_full_document_is_valid_and_reads_back_as_stored() -> None:
    metadata = validate_metadata(copy.deepcopy(DOCUMENT))
    stored = metadata.model_dump(mode="json")
    assert validate_metadata(stored) == metadata  # what an event holds validates again
    assert stored["provenance"] == DOCUMENT["provenance"]
    assert stored["servable"]["input"]["shape"] == [None, 3, 224, 224]
    assert stored["metrics"] == {"accuracy": 0.93, "top_5": 0.99}


def test_a_minimal_document_takes_the_defaults() -> None:
    metadata = validate_metadata(
        {
            "title": "m",
            "creators": [{"name": "Ada"}],
            "framework": "other",
            "servable": {
                "entry_point": "m:f",
                "input": {"type": "json"},
                "output": {"type": "json"},
            },
        }
    )
    assert metadata.license == "NOASSERTION"
    assert (metadata.tags, metadata.metrics, metadata.provenance) == ([], {}, None)


def test_every_bad_field_of_a_hostile_document_is_named_with_its_path() -> None:
    hostile: dict[str, Any] = {
        "title": "x\x00y",
        "description": "d" * 10_001,
        "creators": [{"name": "", "orcid": "0000-0002-1825-0098"}, {"name": "B", "x": 1}],
        "license": "MIT License",
        "citation": {"doi": "doi:10.1000/1"},
        "domains": ["a\u202e" * 40],
        "tags": ["t", "t"],
        "framework": "caffe",
        "servable": {
            "entry_point": "os.system('rm -rf /')",
            "input": {"type": "string", "shape": [3]},
            "output": {"type": "ndarray", "shape": [-1, True]},
            "requirements": ["evil @ https://10.0.0.1/x.whl", "ok==1; os_name=='nt'"],
        },
        "metrics": {"nan": math.nan, "inf": -math.inf, "flag": True, "text": "1", "bad-name": 1},
        "provenance": {"job_id": "nope", "attempt": 0, "data_sha256": "A" * 64},
        "owner": "someone else",
    }
    assert set(errors_of(hostile)) == {
        "title",
        "description",
        "creators.0.name",
        "creators.0.orcid",
        "creators.1.x",
        "license",
        "citation.doi",
        "domains.0",
        "tags",
        "framework",
        "servable.entry_point",
        "servable.input",
        "servable.output.shape.0",
        "servable.output.shape.1",
        "servable.requirements.0",
        "servable.requirements.1",
        "metrics.nan",
        "metrics.inf",
        "metrics.flag",
        "metrics.text",
        "metrics.bad-name",
        "provenance.job_id",
        "provenance.attempt",
        "provenance.data_sha256",
        "owner",
    }


def test_the_messages_say_what_is_wrong() -> None:
    errors = errors_of(
        {
            **DOCUMENT,
            "title": "two\nlines",
            "tags": ["x", "x"],
            "metrics": {"loss": math.inf},
            "owner": "x",
        }
    )
    assert "control characters" in errors["title"]
    assert errors["tags"] == "repeated: x"
    assert errors["metrics.loss"] == "Input should be a finite number"
    assert errors["owner"] == "unknown field"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tags", [f"t{n}" for n in range(MAX_TAGS + 1)]),
        ("tags", ["t" * 65]),
        ("creators", []),
        ("creators", [{"name": "a"}] * 33),
        ("description", "d" * 10_001),
        ("title", ""),
    ],
)
def test_strings_and_lists_are_bounded(field: str, value: object) -> None:
    assert field in {path.split(".")[0] for path in errors_of({**DOCUMENT, field: value})}


def test_requirements_are_bounded_and_never_urls() -> None:
    servable = {**DOCUMENT["servable"], "requirements": ["pkg"] * (MAX_REQUIREMENTS + 1)}
    assert "servable.requirements" in errors_of({**DOCUMENT, "servable": servable})
    for requirement in ("pkg @ file:///etc/passwd", "-e .", "--index-url http://x", "pkg\n"):
        servable = {**DOCUMENT["servable"], "requirements": [requirement]}
        assert "servable.requirements.0" in errors_of({**DOCUMENT, "servable": servable})


def test_a_citation_needs_a_doi_or_a_text() -> None:
    assert errors_of({**DOCUMENT, "citation": {}}) == {"citation": "give a doi, a text, or both"}


def test_a_document_that_is_not_an_object_is_one_error() -> None:
    assert set(errors_of([DOCUMENT])) == {"(document)"}


def test_the_json_schema_documents_every_field() -> None:
    schema = json_schema()
    assert schema["$id"] == SCHEMA_ID
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"title", "creators", "framework", "servable"}
    for name, field in schema["properties"].items():
        assert "description" in field or "$ref" in field or "anyOf" in field, name
    assert "Provenance" in schema["$defs"]
    json.dumps(schema)  # served as JSON


def test_an_update_names_every_immutable_and_unknown_field_with_every_bad_value() -> None:
    with pytest.raises(InvalidMetadata) as raised:
        validate_update(
            {"title": "new", "servable": {}, "tags": ["ok", "ok"], "metrics": {"x": "1"}, "y": 1}
        )
    errors = {e.path: e.message for e in raised.value.errors}
    assert errors == {
        "title": "immutable once published: publish a new version to change it",
        "servable": "immutable once published: publish a new version to change it",
        "tags": "repeated: ok",
        "metrics.x": "Input should be a valid number",
        "y": "unknown field",
    }


def test_an_update_reads_the_mutable_parts() -> None:
    update = validate_update({"description": "better", "metrics": {"f1": 0.8}})
    assert (update.description, update.tags, update.metrics) == ("better", None, {"f1": 0.8})
    assert {"description", "domains", "tags", "citation", "metrics"} == MUTABLE
    assert {"servable", "provenance", "license", "creators", "title"} <= IMMUTABLE
