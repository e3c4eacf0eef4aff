"""Which learner images may run: the operator's allowlist (`TRAINYARD_IMAGES`), checked when a
job is submitted and again by the node before it creates a container.

An entry is an image name or an fnmatch pattern (`registry.example.org/vision/*`), optionally
pinned by digest (`name@sha256:<64 hex>`). An entry without a tag allows every tag of its
repository; one with a tag allows that tag only. An image named without a tag is `:latest`, as
Docker reads it. A pinned entry admits an image only if the node's copy is that digest (its
image ID, or a repository digest it was pulled or pushed by): a tag moved to other content is
refused on the node even though its name is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

IMAGES_ENV = "TRAINYARD_IMAGES"
DEFAULT_IMAGES = "trainyard-learner:latest"
"""The learner image images/build.sh builds (node_agent/images.py: LEARNER_IMAGE)."""

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
IMAGE_PATTERN = r"^(?!:[^/@]*(?:@|$))[^@\u0000]*[^@:\u0000](?:@sha256:[0-9a-f]{64})?$"
"""What `ImageRef.parse` takes, for JSON Schema: a name with no empty repository or tag, and
an optional digest. Which images run is the operator's allowlist, which the schema leaves to
the description."""


class ImageRefused(ValueError):
    """An image the allowlist does not admit; the message says which and what is allowed."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image reference split into its parts: `repository[:tag][@digest]`."""

    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        name, at, digest = text.partition("@")
        if at and not _DIGEST.fullmatch(digest):
            raise ValueError(f"{text!r}: a digest is sha256: and 64 lower-case hex digits")
        # A tag follows the last colon of the last path component (a registry's port is
        # before a slash: localhost:5000/x).
        slash = name.rfind("/")
        colon = name.rfind(":")
        if colon > slash:
            repository, tag = name[:colon], name[colon + 1 :]
        else:
            repository, tag = name, None
        if not repository or tag == "":
            raise ValueError(f"{text!r} names no image")
        return cls(repository, tag, digest or None)


@dataclass(frozen=True, slots=True)
class Admitted:
    """An image the allowlist admits, and the digests its node copy must have (none: any)."""

    image: str
    digests: frozenset[str]


@dataclass(frozen=True, slots=True)
class ImageAllowlist:
    """What `TRAINYARD_IMAGES` allows (see the module's doc)."""

    entries: tuple[ImageRef, ...]

    @classmethod
    def parse(cls, text: str) -> ImageAllowlist:
        """Comma-separated entries; ValueError naming a malformed one (an empty list too: it
        would refuse every job, which an operator means to say by stopping the service)."""
        entries = tuple(ImageRef.parse(item.strip()) for item in text.split(",") if item.strip())
        if not entries:
            raise ValueError(f"{IMAGES_ENV} names no image")
        return cls(entries)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ImageAllowlist:
        """`TRAINYARD_IMAGES`, or the default when it is unset or empty; ValueError (naming the
        variable) when it is malformed."""
        try:
            return cls.parse(environ.get(IMAGES_ENV) or DEFAULT_IMAGES)
        except ValueError as exc:
            raise ValueError(f"{IMAGES_ENV}: {exc}") from None

    def describe(self) -> str:
        return ", ".join(_text(entry) for entry in self.entries)

    def admit(self, image: str) -> Admitted:
        """The image if an entry allows it; ImageRefused saying why not. An image that names
        a digest itself must be one an entry pins, where every matching entry pins one."""
        try:
            ref = ImageRef.parse(image)
        except ValueError as exc:
            raise ImageRefused(str(exc)) from None
        matching = [entry for entry in self.entries if _matches(entry, ref)]
        if not matching:
            raise ImageRefused(
                f"image {image!r} is not allowed on this service (allowed: {self.describe()})"
            )
        if any(entry.digest is None for entry in matching):
            return Admitted(image, frozenset({ref.digest} if ref.digest else ()))
        pinned = frozenset(entry.digest for entry in matching if entry.digest is not None)
        if ref.digest is not None and ref.digest not in pinned:
            raise ImageRefused(
                f"image {image!r} is pinned to {', '.join(sorted(pinned))} on this service"
            )
        return Admitted(image, frozenset({ref.digest}) if ref.digest else pinned)


def _matches(entry: ImageRef, ref: ImageRef) -> bool:
    if not fnmatchcase(ref.repository, entry.repository):
        return False
    return entry.tag is None or fnmatchcase(ref.tag or "latest", entry.tag)


def _text(entry: ImageRef) -> str:
    tag = f":{entry.tag}" if entry.tag else ""
    digest = f"@{entry.digest}" if entry.digest else ""
    return f"{entry.repository}{tag}{digest}"


DEFAULT_ALLOWLIST = ImageAllowlist.parse(DEFAULT_IMAGES)
