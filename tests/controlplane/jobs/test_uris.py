"""A manifest's URIs: the patterns the document states and what the server accepts are the
same, and every URI they accept is one the learner can use (runners.uri, runners.config)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.jobs.manifest import DATA_SCHEMES, RESULTS_SCHEMES
from controlplane.jobs.uris import DATA_SOURCE, RESULTS_LOCATION, check_uri
from runners.config import DATA_SCHEMES as LEARNER_DATA_SCHEMES
from runners.config import ConfigError, _check_uri
from runners.uri import file_path

KINDS = [(DATA_SOURCE, DATA_SCHEMES), (RESULTS_LOCATION, RESULTS_SCHEMES)]

# URIs near the edges: what urlsplit strips, escaped slashes, hosts, ports, users.
TRICKY = st.lists(
    st.sampled_from(
        [*"fileFILEhtps:/%2Ff@[]?#.-_0x9 \t\n", "localhost", "file:", "http://", "%2F", "\x00"]
    ),
    max_size=14,
).map("".join)


def allowed(pattern: str, uri: str) -> bool:
    """Whether the document's pattern allows `uri`, as JSON Schema reads it (ECMA-262): there
    `$` is the end of the text alone, where Python's also matches before a final newline
    ("http://f\\n"), which the server refuses."""
    return re.search(pattern.replace("$", r"\Z"), uri) is not None


def accepted(uri: str, schemes: tuple[str, ...]) -> bool:
    try:
        check_uri(uri, schemes)
    except ValueError:
        return False
    return True


def usable_by_the_learner(uri: str) -> bool:
    """What the learner does with it: file URIs name a path below /, downloads a host. The
    one exception is the node's root written with dot segments (file:///.): the pattern does
    not follow them, and the server refuses it with the locations outside the tenant's roots
    (403, controlplane.jobs.locations), never as a malformed manifest."""
    if urlsplit(uri).scheme.lower() == "file":
        if os.path.normpath(unquote(urlsplit(uri).path)) in ("/", "//"):
            return True
        path = file_path(uri)
        return path.is_absolute() and path != Path("/")
    try:
        _check_uri("uri", uri, LEARNER_DATA_SCHEMES)
    except ConfigError:
        return False
    return bool(urlsplit(uri).hostname)


@pytest.mark.parametrize(("pattern", "schemes"), KINDS, ids=["data", "results"])
@given(data=st.data())
def test_what_the_pattern_allows_the_server_accepts_and_the_learner_can_use(
    pattern: str, schemes: tuple[str, ...], data: st.DataObject
) -> None:
    uri = data.draw(st.from_regex(pattern, fullmatch=True))
    assert accepted(uri, schemes), uri
    assert usable_by_the_learner(uri), uri


@pytest.mark.parametrize(("pattern", "schemes"), KINDS, ids=["data", "results"])
@settings(max_examples=1000)
@given(uri=TRICKY)
def test_the_server_accepts_exactly_what_the_pattern_allows(
    pattern: str, schemes: tuple[str, ...], uri: str
) -> None:
    assert accepted(uri, schemes) == allowed(pattern, uri), uri
    if accepted(uri, schemes):
        assert usable_by_the_learner(uri), uri


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("", "scheme must be one of"),
        ("file:///", "below /"),
        ("file:///%2F", "below /"),
        ("file://node7/data", "below /"),
        (" file:///data", "U+0020"),
        ("file:///da\tta", "U+0009"),
        ("https://user:secret@example.com/d", "no user or password"),
        ("https://[::1]/d", "by name or IPv4"),
        ("https:///d", "by name or IPv4"),
        ("s3://bucket/d", "not 's3'"),
    ],
)
def test_a_refused_uri_says_which_rule_it_breaks(uri: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        check_uri(uri, DATA_SCHEMES)


@pytest.mark.parametrize(
    "uri",
    [
        "file:/data/x",
        "FILE://localhost/data/x",
        "file:////%2Fdata",
        "file:///data/caf%C3%A9?v=1#top",
        "https://example.com",
        "http://10.0.0.7:8080/d.csv?x=1",
    ],
)
def test_the_forms_a_user_writes_are_accepted(uri: str) -> None:
    assert check_uri(uri, DATA_SCHEMES) == uri
    assert usable_by_the_learner(uri)
