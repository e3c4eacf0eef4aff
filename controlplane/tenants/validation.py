"""The rules for a tenant's name, weight and GPU quota, checked before anything is written.

The events themselves carry no such constraints: they record what was decided, and rules that
tighten later must never make old events unreadable.
"""

from __future__ import annotations

import math
import re

from controlplane.tenants.errors import InvalidTenant

NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")
"""Lowercase, as in stream ids, URLs and Docker labels."""


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidTenant(
            f"invalid tenant name {name!r}: use 1 to 63 lowercase letters, digits and '-', "
            "starting with a letter"
        )
    return name


def check_weight(weight: float) -> float:
    if not math.isfinite(weight) or weight <= 0:
        raise InvalidTenant(f"invalid weight {weight}: it must be a positive number")
    return weight


def check_gpu_quota(gpu_quota: int | None) -> int | None:
    if gpu_quota is not None and gpu_quota < 0:
        raise InvalidTenant(
            f"invalid GPU quota {gpu_quota}: it must be 0 or more (leave it out for no quota)"
        )
    return gpu_quota
