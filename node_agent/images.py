"""The images that images/build.sh builds, by the names it gives them, and the node's own check
of a learner's image against the operator's allowlist before a container is created from it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.agent_port.vocabulary import IMAGES_ENV, ImageAllowlist, ImageRefused
from node_agent.runtime import LearnerStartError

LEARNER_IMAGE = "trainyard-learner:latest"
"""Python, torch (CPU), numpy and the runners package: what learner images start from."""
PROJECT_IMAGE = "trainyard:latest"
"""The control plane and the node agent (the repository's Dockerfile)."""


def admit(allowlist: ImageAllowlist, image: str) -> frozenset[str]:
    """The digests the node's copy of `image` must have (none: any); LearnerStartError when
    this node's allowlist refuses it (the control plane checked it at submission, against its
    own setting: the two may differ, and the node's is the one that protects the node)."""
    try:
        return allowlist.admit(image).digests
    except ImageRefused as exc:
        raise LearnerStartError(f"{exc} ({IMAGES_ENV} of this node's agent)") from None


def resolved_id(image: str, digests: frozenset[str], inspected: Mapping[str, Any]) -> str:
    """The ID of the image the engine resolved `image` to (`inspected`: its inspect answer),
    to create the container from: a tag moved after this check cannot change what runs.
    LearnerStartError when the image is pinned and this is other content."""
    image_id = str(inspected["Id"])
    if not digests:
        return image_id
    # Its ID is the digest of its configuration (what a locally built image has); a pulled or
    # pushed image also has the digests of its manifests in the registries it came from.
    repo_digests = [str(d).partition("@")[2] for d in inspected.get("RepoDigests") or ()]
    if digests & {image_id, *repo_digests}:
        return image_id
    raise LearnerStartError(
        f"image {image!r} on this node is {image_id}, not the digest {IMAGES_ENV} pins "
        f"({', '.join(sorted(digests))})"
    )
