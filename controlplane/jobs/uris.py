"""The URIs a manifest names, each kind as one pattern: the document states it (JSON Schema's
`pattern`) and the server checks it, so that a URI the schema allows is one the server accepts
(tests/controlplane/jobs/test_uris.py holds the two to the same answers).

- `file:` names an absolute path below / on the learner's node: `file:/x`, `file:///x` or
  `file://localhost/x` (no other host: a learner reaches only its own node's files).
- `http:` and `https:` name a host by name or IPv4 address, and optionally a port: no user or
  password (a secret in a manifest's URL would sit in the job's events for ever) and no IPv6
  literal (Python's URL parser checks those by rules no pattern can state).
- None holds whitespace or a control character: Python's URL parser silently drops some of
  them, so the URI a learner fetched would not be the one its owner wrote.

The patterns are ECMA-262 and Python alike (no lookaround), anchored with ^ and $; `$` is no
trap for a final newline, since a URI with one is refused before any pattern is tried.
"""

from __future__ import annotations

import re

_UNSAFE = r"\x00-\x20\x7f"
"""Control characters and the space."""

_ROOT = r"(?:/|%2[Ff])*"
"""More slashes after the first, escaped or not: the root still."""
FILE_URI = (
    r"[Ff][Ii][Ll][Ee]:"
    # With an authority (none, or localhost) and the root, or the root alone, which must not
    # start with "//" (that would be an authority: file://host/x) ...
    rf"(?://(?:localhost)?/{_ROOT}|/(?:%2[Ff]{_ROOT})?)"
    # ... then a first character that is no slash, decoded or not: a path below the root.
    rf"(?:[^/%?#{_UNSAFE}]|%(?:[^2{_UNSAFE}]|2[^Ff{_UNSAFE}]|2$|$))"
    rf"[^{_UNSAFE}]*"
)
HTTP_URI = (
    r"[Hh][Tt][Tt][Pp][Ss]?://"
    r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?"
    r"(?::[0-9]{1,5})?"
    rf"(?:[/?#][^{_UNSAFE}]*)?"
)
DATA_SOURCE = f"^(?:{FILE_URI}|{HTTP_URI})$"
"""A job's data source: a file on the node, or a download."""
RESULTS_LOCATION = f"^{FILE_URI}$"
"""Where a job's results are copied: a file on the node."""

_UNSAFE_FOUND = re.compile(f"[{_UNSAFE}]")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_FORMS = {
    "file": (
        re.compile(f"^{FILE_URI}$"),
        "a file URI names an absolute path below / on the learner's node, as in "
        "file:///data/x (no host but localhost)",
    ),
    "http": (
        re.compile(f"^{HTTP_URI}$"),
        "an http(s) URI names a host by name or IPv4 address, and maybe a port, as in "
        "https://example.com/data.csv (no user or password in it)",
    ),
}
_FORMS["https"] = _FORMS["http"]


def check_uri(uri: str, schemes: tuple[str, ...]) -> str:
    """`uri` when it has one of `schemes` and that scheme's form; ValueError saying which rule
    it breaks otherwise."""
    if found := _UNSAFE_FOUND.search(uri):
        raise ValueError(
            f"a URI holds no whitespace or control character; {uri!r} holds "
            f"U+{ord(found.group()):04X} at {found.start()}"
        )
    scheme = match.group(1).lower() if (match := _SCHEME.match(uri)) else None
    if scheme not in schemes:
        raise ValueError(
            f"URI scheme must be one of {', '.join(schemes)}, not {scheme or 'none'!r}"
        )
    form, rule = _FORMS[scheme]
    if not form.match(uri):
        raise ValueError(f"{uri!r}: {rule}")
    return uri
