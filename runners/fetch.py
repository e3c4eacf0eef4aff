"""The DOWNLOADING phase's work: fetch a data source into the data directory.

Supported sources: `file://` (a file or a directory) and `http(s)://` (a file). A single file
is written under a temporary name and renamed into place only after its checksum matched, so a
failed or interrupted fetch never leaves a file that looks complete.
"""

from __future__ import annotations

import http.client
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from runners.config import DATA_SCHEMES, DATA_SHA256
from runners.durable import HashingWriter, temp_path
from runners.phases import PhaseError
from runners.uri import UriError, file_path, redact, require_scheme

# Seconds without progress on a connection before giving up: a stalled server fails the phase
# instead of holding the job in DOWNLOADING forever.
HTTP_TIMEOUT_S = 60.0
_CHUNK = 1 << 20


class FetchError(PhaseError):
    """The data source could not be fetched, or its content is not what was expected."""


def fetch(uri: str, directory: Path, sha256: str | None) -> None:
    """Fetch `uri` into `directory`, verifying `sha256` if given.

    There is no retry here: a failed fetch fails the phase, and whether to try again is the
    restart policy's decision, which records each attempt and its reason.
    """
    shown = redact(uri)
    try:
        scheme = require_scheme(uri, DATA_SCHEMES)
        directory.mkdir(parents=True, exist_ok=True)
        if scheme == "file":
            _fetch_file(uri, file_path(uri), directory, sha256)
        else:
            _fetch_http(uri, directory, sha256)
    except urllib.error.HTTPError as error:
        raise FetchError(f"cannot fetch {shown}: HTTP {error.code} {error.reason}") from error
    except urllib.error.URLError as error:
        raise FetchError(f"cannot fetch {shown}: {error.reason}") from error
    except (OSError, UriError, http.client.HTTPException) as error:
        raise FetchError(f"cannot fetch {shown}: {error!s}") from error


def _fetch_file(uri: str, source: Path, directory: Path, sha256: str | None) -> None:
    if source.is_dir():
        if sha256 is not None:
            raise FetchError(
                f"{DATA_SHA256} is set, but {uri} is a directory; a checksum applies to one file"
            )
        # Copied in place, not staged: the data directory is scratch space of this attempt, and
        # if the copy fails the command never runs, so a partial copy is never read.
        shutil.copytree(source, directory, symlinks=True, dirs_exist_ok=True)
        return
    with open(source, "rb") as stream:
        _save(uri, stream, directory / source.name, sha256)


def _fetch_http(uri: str, directory: Path, sha256: str | None) -> None:
    request = urllib.request.Request(uri, headers={"User-Agent": "trainyard-runner"})
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        _save(uri, response, directory / _file_name(uri), sha256)


def _file_name(uri: str) -> str:
    """The name a downloaded file gets: the last segment of the URL's path."""
    name = PurePosixPath(unquote(urlsplit(uri).path)).name
    return name if name not in ("", ".", "..") else "data"


def _save(uri: str, stream: BinaryIO, target: Path, sha256: str | None) -> None:
    temp = temp_path(target)
    try:
        # Not fsynced: after a crash the attempt is restarted and downloads again, so durability
        # of scratch data would only cost time.
        with open(temp, "xb") as file:
            writer = HashingWriter(file)
            shutil.copyfileobj(stream, writer, _CHUNK)
        actual = writer.hexdigest()
        if sha256 is not None and actual != sha256:
            raise FetchError(f"sha256 mismatch for {redact(uri)}: expected {sha256}, got {actual}")
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
