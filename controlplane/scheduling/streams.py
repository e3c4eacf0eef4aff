"""Naming the scheduling stream: one for the whole cluster, as there is one claim policy."""

from __future__ import annotations

CATEGORY = "scheduling"
POLICY_STREAM = f"{CATEGORY}-policy"
