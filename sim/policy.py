"""The policies a replay can run: the claim policy in force (`current`: the one the log's last
SchedulingPolicySet set, as claims follow it now), FIFO, priority-only, fair share with other
tenant weights, or one read from a policy file (JSON or YAML), the file `trainyard scheduling
set-policy` switches production to:

    {"order": "fair_share" | "priority" | "fifo",   # required
     "weights": {"TENANT": W, ...},                # fair_share only: these tenants' weights
     "quotas": true | false}                       # tenants' GPU quotas hold (default true)

(`set-policy` refuses `weights`: a tenant's weight is its own, set with `trainyard tenants
set`.) Quotas hold in every named policy but `current`, which is whatever the operator set:
they are what tenants were promised, not an order. A tenant left out of `weights` keeps its
recorded weight."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator

from controlplane.scheduling.policy import (
    DEFAULT,
    ClaimPolicy,
    Order,
    PolicyError,
    PolicyFields,
    first_problem,
    read_document,
)

CURRENT = "current"
"""The name of the claim policy in force."""


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
    "fair_share": Policy("fair_share", ClaimPolicy(Order.FAIR_SHARE)),
    "priority": Policy("priority", ClaimPolicy(Order.PRIORITY)),
    "fifo": Policy("fifo", ClaimPolicy(Order.FIFO)),
}
"""The orders by name, quotas holding; `current` is the operator's policy (see `current`)."""


def current(in_force: ClaimPolicy) -> Policy:
    """The claim policy in force (`Workload.policy`), as `current`."""
    return Policy(CURRENT, in_force)


def named(name: str, weights: Mapping[str, float], in_force: ClaimPolicy = DEFAULT) -> Policy:
    """A named policy, with `weights` for some tenants (fair share only); `current` is
    `in_force`."""
    policy = current(in_force) if name == CURRENT else NAMED.get(name)
    if policy is None:
        known = ", ".join([CURRENT, *NAMED])
        raise PolicyError(f"--policy: no policy named {name!r} (known: {known})")
    if not weights:
        return policy
    if policy.claim.order is not Order.FAIR_SHARE:
        raise PolicyError(
            f"--weight: weights apply to fair share; policy {name} ({policy.claim.describe()}) "
            "has none"
        )
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


class _PolicyFile(PolicyFields):
    """A policy file as a replay reads it: the claim policy's fields, and weights to try."""

    weights: dict[str, float] = Field(default_factory=dict)

    @field_validator("weights")
    @classmethod
    def _positive(cls, weights: dict[str, float]) -> dict[str, float]:
        for tenant, weight in weights.items():
            if not math.isfinite(weight) or weight <= 0:
                raise ValueError(f"{tenant}: a weight must be a finite number above 0")
        return weights


def read_policy_file(path: Path) -> Policy:
    """The policy a file states; PolicyError naming the file and the field (or the line)."""
    document = read_document(path)
    try:
        stated = _PolicyFile.model_validate(document)
    except ValidationError as exc:
        raise PolicyError(f"{path}: {first_problem(exc)}") from None
    if stated.weights and stated.order is not Order.FAIR_SHARE:
        raise PolicyError(f"{path}: weights: apply to order fair_share, not {stated.order}")
    return Policy(path.name, stated.policy, tuple(sorted(stated.weights.items())))
