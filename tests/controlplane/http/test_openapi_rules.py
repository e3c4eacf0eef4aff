"""The rules the OpenAPI document states as patterns take exactly what the server's checks take,
on samples of both sides of each rule: a pattern looser than its check lets a client send what
is refused, a stricter one refuses what is accepted (issue 33). Pure: no server, no database.

Python's `re` reads these patterns as JSON Schema's ECMA-262 does for what they use (classes,
`\\uXXXX`, lookahead), except that its `$` also matches before a final newline, so samples
end in one where that matters."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from controlplane.deployments.errors import InvalidRequest
from controlplane.deployments.names import check_name
from controlplane.deployments.spec import DeploymentRequest
from controlplane.http import params
from controlplane.jobs.images import IMAGE_PATTERN, ImageRef
from controlplane.jobs.manifest import _env_schema, check_env_name
from controlplane.models.errors import InvalidModel
from controlplane.models.query.errors import QueryError
from controlplane.models.query.tokens import ADMITTED, tokenize
from controlplane.models.references import REFERENCE_PATTERN, parse_reference

DIGEST = "sha256:" + "a" * 64


def _accepts(check: Callable[[str], object], refused: type[Exception]) -> Callable[[str], bool]:
    def accepts(value: str) -> bool:
        try:
            check(value)
        except refused:
            return False
        return True

    return accepts


def _matches(pattern: str, value: str) -> bool:
    return re.search(pattern, value) is not None and not value.endswith("\n")


@pytest.mark.parametrize(
    "image",
    [
        *("x", "x:1", "reg:5000/a/b:c", "a/:x", "a:b/", f"x@{DIGEST}", f"x:1@{DIGEST}", "/:x"),
        *(
            "",
            "x:",
            ":y",
            ":",
            "a:b/c:",
            "x@sha256:ab",
            f"@{DIGEST}",
            f":@{DIGEST}",
            f"x:@{DIGEST}",
        ),
    ],
)
def test_the_image_pattern_is_what_an_image_reference_parses_as(image: str) -> None:
    assert _matches(IMAGE_PATTERN, image) == _accepts(ImageRef.parse, ValueError)(image)


@pytest.mark.parametrize(
    "reference",
    [
        *("m", "m:3", "m@prod", "m@latest", "acme/m.v2", "acme/m:12", "m_1-x.y"),
        *("", "M", "1m", "m:0", "m:03", "m@", "m@Prod", "/m", "acme/", "a/b/c", "m:3@x", "m@1a"),
    ],
)
def test_the_reference_pattern_is_what_a_model_reference_parses_as(reference: str) -> None:
    assert _matches(REFERENCE_PATTERN, reference) == _accepts(parse_reference, InvalidModel)(
        reference
    )


@pytest.mark.parametrize("name", ["a", "a-1", "a" * 63, "", "A", "1a", "a.b", "a" * 64, "a_b"])
def test_a_deployment_name_pattern_is_what_check_name_takes(name: str) -> None:
    pattern = DeploymentRequest.model_json_schema()["properties"]["name"]["pattern"]
    assert _matches(pattern, name) == _accepts(check_name, InvalidRequest)(name)


@pytest.mark.parametrize(
    "name",
    [
        *("X", "MY_VAR", "PATHS", "MYPATH", "TRAINYARD", "PYTHO", "a b"),
        *("", "A=B", "A\0", "PATH", "TRAINYARD_X", "NVIDIA_", "LD_PRELOAD", "PYTHONPATH", "HOME"),
    ],
)
def test_an_environment_name_schema_is_what_check_env_name_takes(name: str) -> None:
    names = _env_schema()["propertyNames"]
    stated = _matches(names["pattern"], name) and not any(
        _matches(reserved["pattern"], name) for reserved in names["not"]["anyOf"]
    )
    assert stated == _accepts(check_env_name, ValueError)(name)


@pytest.mark.parametrize("text", ["", "a b", "tab\there", "é", "a\0", "\x08", "\x7f", "\x9f"])
def test_the_text_patterns_refuse_what_the_checks_refuse(text: str) -> None:
    assert _matches(params.NO_NUL, text) == params.storable(text)
    assert _matches(ADMITTED, text) == _accepts(tokenize, QueryError)(text)
