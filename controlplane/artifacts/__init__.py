"""Artifacts: blobs addressed by their sha256, written whole or not at all, verified when read."""
