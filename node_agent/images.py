"""The images that images/build.sh builds, by the names it gives them."""

from __future__ import annotations

LEARNER_IMAGE = "trainyard-learner:latest"
"""Python, torch (CPU), numpy and the runners package: what learner images start from."""
PROJECT_IMAGE = "trainyard:latest"
"""The control plane and the node agent (the repository's Dockerfile)."""
