"""The policies a replay can run: the current one, FIFO, priority-only, fair share with other
tenant weights, or one read from a policy file (JSON or YAML):

    {"order": "fair_share" | "priority" | "fifo",   # required
     "weights": {"TENANT": W, ...},                # fair_share only: these tenants' weights
     "quotas": true | false}                       # tenants' GPU quotas hold (default true)

Quotas hold in every named policy: they are what tenants were promised, not an order. A
tenant left out of `weights` keeps its recorded weight."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError, field_validator

from controlplane.scheduling.policy import CURRENT, ClaimPolicy, Order


class PolicyError(ValueError):
    """A policy that cannot be run: the message names the field (or the file's line) at fault."""


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    claim: ClaimPolicy
    weights: tuple[tuple[str, float], ...] = ()
    """Tenants' weights instead of their recorded ones, by name."""

    def weight(self, tenant: str, recorded: float) -> float:
        return dict(self.weights).get(tenant, recorded)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "order": str(self.claim.order),
            "quotas": self.claim.quotas,
            "weights": dict(self.weights),
        }


NAMED = {
    "current": Policy("current", CURRENT),
    "fair_share": Policy("fair_share", ClaimPolicy(Order.FAIR_SHARE)),
    "priority": Policy("priority", ClaimPolicy(Order.PRIORITY)),
    "fifo": Policy("fifo", ClaimPolicy(Order.FIFO)),
}
"""`current` is the claim SQL's policy; `fair_share` is the same order, named for `--weight`."""


def named(name: str, weights: Mapping[str, float]) -> Policy:
    """A named policy, with `weights` for some tenants (fair share only)."""
    policy = NAMED.get(name)
    if policy is None:
        raise PolicyError(f"--policy: no policy named {name!r} (known: {', '.join(NAMED)})")
    if not weights:
        return policy
    if policy.claim.order is not Order.FAIR_SHARE:
        raise PolicyError(f"--weight: weights apply to fair share; policy {name} has none")
    for tenant, weight in weights.items():
        _check_weight(weight, f"--weight {tenant}")
    return Policy(f"{name} with weights", policy.claim, tuple(sorted(weights.items())))


def parse_weight(text: str) -> tuple[str, float]:
    """`TENANT=W`, as `--weight` takes it."""
    tenant, sep, value = text.partition("=")
    if not sep or not tenant:
        raise PolicyError(f"--weight: {text!r} is not TENANT=WEIGHT")
    try:
        weight = float(value)
    except ValueError:
        raise PolicyError(f"--weight {tenant}: {value!r} is not a number") from None
    _check_weight(weight, f"--weight {tenant}")
    return tenant, weight


def _check_weight(weight: float, where: str) -> None:
    if not math.isfinite(weight) or weight <= 0:
        raise PolicyError(f"{where}: a weight must be a finite number above 0, not {weight}")


class _PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    order: Order
    weights: dict[str, float] = {}
    quotas: StrictBool = True

    @field_validator("weights")
    @classmethod
    def _positive(cls, weights: dict[str, float]) -> dict[str, float]:
        for tenant, weight in weights.items():
            if not math.isfinite(weight) or weight <= 0:
                raise ValueError(f"{tenant}: a weight must be a finite number above 0")
        return weights


def read_policy_file(path: Path) -> Policy:
    """The policy a file states; PolicyError naming the file and the field (or the line)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        # YAML reads JSON too.
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or "not JSON or YAML"
        raise PolicyError(f"{where}: {problem}") from None
    if not isinstance(document, dict):
        raise PolicyError(f"{path}: a policy is a mapping with an `order` field")
    try:
        stated = _PolicyFile.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(top)"
        raise PolicyError(f"{path}: {field}: {first['msg']}") from None
    if stated.weights and stated.order is not Order.FAIR_SHARE:
        raise PolicyError(f"{path}: weights: apply to order fair_share, not {stated.order}")
    claim = ClaimPolicy(stated.order, stated.quotas)
    return Policy(path.name, claim, tuple(sorted(stated.weights.items())))
