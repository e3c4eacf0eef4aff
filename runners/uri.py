"""Locations given as URIs: the scheme a URI uses, and the local path a file URI names."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


class UriError(ValueError):
    """A URI that cannot be used where it was given."""


def redact(uri: str) -> str:
    """`uri` as it may appear in reports: without a password or a query string.

    Reports become events that users and operators read; a password in the URI or a signed
    query (a presigned download link) must not travel with them.
    """
    parts = urlsplit(uri)
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{host}"
    return urlunsplit(parts._replace(netloc=netloc, query="***" if parts.query else ""))


def require_scheme(uri: str, supported: Collection[str]) -> str:
    """The scheme of `uri` (lower case) if it is one of `supported`; UriError otherwise."""
    scheme = urlsplit(uri).scheme.lower()
    listed = ", ".join(sorted(supported))
    if not scheme:
        raise UriError(f"{redact(uri)!r} is not a URI: it has no scheme (supported: {listed})")
    if scheme not in supported:
        raise UriError(
            f"unsupported URI scheme {scheme!r} in {redact(uri)!r} (supported: {listed})"
        )
    return scheme


def file_path(uri: str) -> Path:
    """The absolute local path a `file://` URI names (percent-escapes decoded)."""
    parts = urlsplit(uri)
    if parts.scheme.lower() != "file":
        raise UriError(f"{uri!r} is not a file:// URI")
    # Another host's file cannot be reached from inside a learner; refuse rather than guess.
    if parts.netloc not in ("", "localhost"):
        raise UriError(f"{uri!r} names host {parts.netloc!r}; only local files are supported")
    # Imported here: urllib.request brings in HTTP's modules, which the launcher needs only
    # to fetch data.
    from urllib.request import url2pathname

    path = Path(url2pathname(parts.path))
    if not path.is_absolute() or path == Path("/"):
        raise UriError(f"{uri!r} must name an absolute path below the root, e.g. file:///data/x")
    return path
