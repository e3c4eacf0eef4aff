"""Errors of the artifact store; each message names the blob (or the path) it is about."""

from __future__ import annotations

from pathlib import Path


class ArtifactError(Exception):
    """Base of the artifact store's errors."""


class InvalidDigest(ArtifactError, ValueError):
    """A string that is not a sha256 digest as the store names blobs (64 lowercase hex digits).

    Checked before a digest becomes part of a path, so no caller's string can point the store
    outside its own files."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(f"{text[:80]!r} is not a sha256 digest (64 lowercase hex digits)")


class ArtifactTooLarge(ArtifactError):
    """A write went past its size limit: it stopped there and kept nothing."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        super().__init__(f"the artifact is larger than {max_size} bytes; nothing was kept")


class ChecksumMismatch(ArtifactError):
    """The bytes written do not have the sha256 the writer said they would: nothing was kept."""

    def __init__(self, expected: str, actual: str) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"the artifact's sha256 is {actual}, not the expected {expected}; nothing was kept"
        )


class ArtifactMissing(ArtifactError):
    """No blob with this digest is stored."""

    def __init__(self, sha256: str) -> None:
        self.sha256 = sha256
        super().__init__(f"no artifact with sha256 {sha256} is stored")


class ArtifactCorrupted(ArtifactError):
    """A stored blob's bytes no longer hash to its name: it was damaged after it was written.

    Raised at the end of a read, after its bytes were handed out: a reader passing them on
    (a download) must fail its transfer rather than finish it."""

    def __init__(self, sha256: str, actual: str) -> None:
        self.sha256 = sha256
        self.actual = actual
        super().__init__(f"the stored artifact {sha256} is corrupted: its bytes hash to {actual}")


class UnsafeSource(ArtifactError):
    """A local file offered to the store that is a symbolic link or not a regular file."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        super().__init__(f"{path} is {what}: only a regular file is added to the artifact store")
