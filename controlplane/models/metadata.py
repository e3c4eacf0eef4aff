"""The metadata schema of a model version (after DLHub's publication schema): who made it, how
to cite it, what it is about, how to run it (its servable), how well it does, and where it
came from (provenance back to a training job).

A tenant writes every field, so every string and list is bounded, unknown fields are refused,
and numbers are finite: a document is stored in an event that every replay reads, indexed for
search, and shown to other tenants when public. Control characters are refused everywhere
(Postgres cannot store NUL in text or jsonb, terminals obey escape sequences).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    JsonValue,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from controlplane.models.errors import FieldError, InvalidMetadata

SCHEMA_VERSION = 1
"""Raised whenever a field's meaning or bounds change; each published version records the
version its metadata was validated against."""
SCHEMA_ID = f"urn:trainyard:model-metadata:v{SCHEMA_VERSION}"

INT4_MAX = 2**31 - 1
INT8_MAX = 2**63 - 1
# Bounds: generous for real models, small enough that a document stays a few hundred KiB.
MAX_DESCRIPTION_CHARS = 10_000
MAX_CREATORS = 32
MAX_TAGS = 32
MAX_DOMAINS = 8
MAX_REQUIREMENTS = 64
MAX_METRICS = 64
MAX_DIMENSIONS = 32

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_CONTROL_BUT_LAYOUT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*"
_ENTRY_POINT = re.compile(rf"{_DOTTED}:{_DOTTED}")
# PEP 508 names, extras and version specifiers, without URLs or markers: a requirement is
# resolved from the package index the operator configured, never from a URL a tenant chose
# (which the control plane would fetch when it builds the wheelhouse).
_SPECIFIER = r"(?:===|==|~=|!=|<=|>=|<|>) *[A-Za-z0-9.*+!_-]+"
_REQUIREMENT = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
    r"(?:\[[A-Za-z0-9._-]+(?:, *[A-Za-z0-9._-]+)*\])?"
    rf"(?: *{_SPECIFIER}(?: *, *{_SPECIFIER})*)?"
)
_LICENSE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")
_DOI = re.compile(r"10\.[0-9]{4,9}/[-._;()/:A-Za-z0-9<>\[\]]+")
_ORCID = re.compile(r"[0-9]{4}-[0-9]{4}-[0-9]{4}-[0-9]{3}[0-9X]")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class _Stated(AfterValidator):
    """A check that the JSON Schema states too, as `pattern` (ECMA-262, as JSON Schema reads
    it): the OpenAPI document then admits only what the check does."""

    pattern: str = ""

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        stated = handler(schema)
        stated["pattern"] = self.pattern
        return stated


def _one_line(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("control characters (line breaks included) are not allowed here")
    return value


def _prose(value: str) -> str:
    if _CONTROL_BUT_LAYOUT.search(value):
        raise ValueError("control characters other than line breaks and tabs are not allowed")
    return value


def _matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    # Checked after the length bound (pydantic checks that first), so the pattern only ever
    # sees short input.
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"not {what}")
        return value

    return _Stated(check, pattern=f"^(?:{pattern.pattern})$")


_ONE_LINE = _Stated(_one_line, pattern="^[^\\u0000-\\u001f\\u007f-\\u009f]*$")
_PROSE = _Stated(
    _prose, pattern="^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f]*$"
)


def _unique(values: list[str]) -> list[str]:
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"repeated: {', '.join(repeated)}")
    return values


def _orcid_checksum(value: str) -> str:
    # ISO 7064 MOD 11-2, as ORCID defines its last character: catches mistyped iDs.
    total = 0
    for digit in value[:-1].replace("-", ""):
        total = (total + int(digit)) * 2
    check = (12 - total % 11) % 11
    if value[-1] != ("X" if check == 10 else str(check)):
        raise ValueError("not a valid ORCID iD (its check digit does not match)")
    return value


# Each text's bound comes before its character check, so that the check only ever reads a
# bounded string.
Title = Annotated[str, StringConstraints(min_length=1, max_length=200), _ONE_LINE]
Description = Annotated[
    str,
    StringConstraints(max_length=MAX_DESCRIPTION_CHARS),
    _PROSE,
    Field(description="what the model does, for people"),
]
PersonName = Annotated[str, StringConstraints(min_length=1, max_length=200), _ONE_LINE]
Affiliation = Annotated[str, StringConstraints(min_length=1, max_length=300), _ONE_LINE]
CitationText = Annotated[str, StringConstraints(min_length=1, max_length=2000), _PROSE]
TypeDescription = Annotated[str, StringConstraints(max_length=1000), _ONE_LINE]
Tag = Annotated[str, StringConstraints(min_length=1, max_length=64), _ONE_LINE]
Domains = Annotated[
    list[Tag],
    Field(
        max_length=MAX_DOMAINS,
        description="the scientific or application domains, e.g. 'materials science' (facets)",
        json_schema_extra={"uniqueItems": True},
    ),
    AfterValidator(_unique),
]
Tags = Annotated[
    list[Tag],
    Field(
        max_length=MAX_TAGS,
        description="free keywords for search",
        json_schema_extra={"uniqueItems": True},
    ),
    AfterValidator(_unique),
]
MetricName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64),
    _matching(re.compile(_IDENTIFIER), "a metric name: letters, digits and '_'"),
]
"""An identifier, so that the search language can name it (`metrics.accuracy>=0.9`)."""
Metric = Annotated[float, Field(strict=True, allow_inf_nan=False)]
"""A finite number; strict, so that neither a boolean nor a string passes for one."""
Metrics = Annotated[
    dict[MetricName, Metric],
    Field(
        max_length=MAX_METRICS,
        description="how well the model does, by metric name, e.g. {'accuracy': 0.93}",
    ),
]
Count = Annotated[int, Field(strict=True, ge=0, le=INT4_MAX)]


class StrictModel(BaseModel):
    """Frozen, and unknown fields are refused (a misspelt field is an error, not lost)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Creator(StrictModel):
    """A person credited for the model."""

    name: PersonName = Field(description="the creator's name")
    affiliation: Affiliation | None = Field(default=None, description="their institution")
    orcid: (
        Annotated[
            str,
            _matching(_ORCID, "an ORCID iD such as 0000-0002-1825-0097"),
            AfterValidator(_orcid_checksum),
            # The check digit is no rule a pattern can state: the format names it.
            Field(json_schema_extra={"format": "orcid"}),
        ]
        | None
    ) = Field(
        default=None,
        description="their ORCID iD, without the https://orcid.org/; its last character is "
        "the ISO 7064 MOD 11-2 check digit of the others",
    )


class Citation(StrictModel):
    """How to cite the model: a DOI, a citation text, or both."""

    # `_something_to_cite`, stated in the schema.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [key], "properties": {key: {"type": "string"}}}
                for key in ("doi", "text")
            ]
        }
    )

    doi: (
        Annotated[
            str,
            StringConstraints(max_length=256),
            _matching(_DOI, "a DOI such as 10.1000/xyz123 (without https://doi.org/)"),
        ]
        | None
    ) = Field(default=None, description="the DOI, e.g. 10.1000/xyz123")
    text: CitationText | None = Field(default=None, description="the citation as people cite it")

    @model_validator(mode="after")
    def _something_to_cite(self) -> Citation:
        if self.doi is None and self.text is None:
            raise ValueError("give a doi, a text, or both")
        return self


DataKind = Literal[
    "ndarray", "tensor", "image", "string", "number", "integer", "boolean", "bytes", "json", "list"
]
ARRAY_KINDS = frozenset({"ndarray", "tensor", "image"})
DType = Literal[
    "float16", "bfloat16", "float32", "float64",
    "int8", "int16", "int32", "int64", "uint8", "bool", "string",
]  # fmt: skip


class DataType(StrictModel):
    """What a servable takes or returns (DLHub's input and output types)."""

    # `_arrays_have_shapes`, stated in the schema.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"properties": {"type": {"enum": list[JsonValue](sorted(ARRAY_KINDS))}}},
                {"properties": {"dtype": {"type": "null"}, "shape": {"type": "null"}}},
            ]
        }
    )

    type: DataKind = Field(description="the kind of value")
    dtype: DType | None = Field(default=None, description="arrays only: the element type")
    shape: list[Count | None] | None = Field(
        default=None,
        max_length=MAX_DIMENSIONS,
        description="arrays only: the size of each dimension; null for a dimension of any "
        "size (the batch, usually)",
    )
    description: TypeDescription = Field(default="", description="what the value means")

    @model_validator(mode="after")
    def _arrays_have_shapes(self) -> DataType:
        if self.type not in ARRAY_KINDS and (self.dtype is not None or self.shape is not None):
            kinds = ", ".join(sorted(ARRAY_KINDS))
            raise ValueError(f"dtype and shape describe arrays ({kinds}), not a {self.type}")
        return self


class Servable(StrictModel):
    """How to run the model: what a replica imports and calls, with what, on what packages."""

    entry_point: Annotated[
        str,
        StringConstraints(max_length=200),
        _matching(_ENTRY_POINT, "'module:function', e.g. 'model.serve:predict'"),
    ] = Field(description="'module:function' (or 'module:Class.method') a replica calls")
    input: DataType = Field(description="what the entry point takes")
    output: DataType = Field(description="what it returns")
    requirements: list[
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=200),
            _matching(_REQUIREMENT, "a requirement such as 'torch>=2.1' (no URLs or markers)"),
        ]
    ] = Field(
        default_factory=list,
        max_length=MAX_REQUIREMENTS,
        description="Python packages it needs, as in requirements.txt (names, extras and "
        "versions only)",
    )


class Provenance(StrictModel):
    """Where the model came from, when published from a training job: enough to find the
    exact attempt and checkpoint, and to check the training data was the same."""

    job_id: UUID = Field(description="the training job")
    attempt: Annotated[int, Field(strict=True, ge=1, le=INT4_MAX)] = Field(
        description="the job's attempt that produced the artifact"
    )
    checkpoint_step: Annotated[int, Field(strict=True, ge=0, le=INT8_MAX)] | None = Field(
        default=None, description="the checkpoint's step; null for the job's final results"
    )
    data_sha256: Annotated[str, _matching(_SHA256, "a lowercase hex sha256")] | None = Field(
        default=None, description="sha256 of the training data, as the job downloaded it"
    )


class ModelMetadata(StrictModel):
    """A model version's metadata document."""

    title: Title = Field(description="a short title")
    description: Description = ""
    creators: list[Creator] = Field(
        min_length=1, max_length=MAX_CREATORS, description="who made it, credited in order"
    )
    license: Annotated[
        str,
        StringConstraints(max_length=64),
        _matching(_LICENSE, "an SPDX-like identifier such as MIT or Apache-2.0"),
    ] = Field(
        default="NOASSERTION",
        description="an SPDX license identifier, e.g. Apache-2.0; NOASSERTION: not stated",
    )
    citation: Citation | None = Field(default=None, description="how to cite it")
    domains: Domains = Field(default_factory=list)
    tags: Tags = Field(default_factory=list)
    framework: Literal[
        "pytorch", "tensorflow", "keras", "jax", "scikit-learn", "xgboost", "onnx", "other"
    ] = Field(description="what the model is built with")
    servable: Servable
    metrics: Metrics = Field(default_factory=dict)
    provenance: Provenance | None = Field(
        default=None, description="the training job it came from, when published from one"
    )


def json_schema() -> dict[str, Any]:
    """The schema's JSON Schema (draft 2020-12), to be served as the reference for authors."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **ModelMetadata.model_json_schema(),
    }


def validate_metadata(document: object) -> ModelMetadata:
    """`document` (parsed JSON) as metadata; InvalidMetadata naming every bad field."""
    try:
        return ModelMetadata.model_validate(document)
    except ValidationError as exc:
        raise InvalidMetadata(field_errors(exc)) from None


def field_errors(exc: ValidationError) -> tuple[FieldError, ...]:
    """Each error of `exc` with its field's path (`creators.0.orcid`; `(document)` for the
    document as a whole)."""
    return tuple(FieldError(_path(err["loc"]), _message(err)) for err in exc.errors())


def _path(loc: Iterable[str | int]) -> str:
    # A bad key of a mapping (a metric's name) is reported at `metrics.<key>.[key]`: the key's
    # own path says it.
    return ".".join(str(part) for part in loc if part != "[key]") or "(document)"


def _message(error: Mapping[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field"
    message: str = error["msg"]
    return message.removeprefix("Value error, ")
