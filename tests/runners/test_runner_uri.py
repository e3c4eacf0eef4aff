"""URIs: what a file URI names, and what of a URI may appear in reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.uri import UriError, file_path, redact, require_scheme


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("https://host/data/set.tar", "https://host/data/set.tar"),
        ("https://user@host/set.tar", "https://user@host/set.tar"),
        ("https://user:secret@host:8443/set.tar", "https://user:***@host:8443/set.tar"),
        ("https://host/set.tar?X-Amz-Signature=secret", "https://host/set.tar?***"),
        ("file:///data/set.tar", "file:///data/set.tar"),
    ],
)
def test_reports_show_no_password_and_no_query(uri: str, shown: str) -> None:
    assert redact(uri) == shown


def test_an_unsupported_scheme_is_reported_without_its_secrets() -> None:
    with pytest.raises(UriError) as error:
        require_scheme("s3://key:secret@bucket/set.tar", {"file"})

    assert "secret" not in str(error.value)
    assert "'s3://key:***@bucket/set.tar'" in str(error.value)


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("file:///data/set.tar", Path("/data/set.tar")),
        ("file://localhost/data/set.tar", Path("/data/set.tar")),
        ("file:///data/with%20space.tar", Path("/data/with space.tar")),
    ],
)
def test_a_file_uri_names_a_local_absolute_path(uri: str, path: Path) -> None:
    assert file_path(uri) == path
