"""The claim policy's two choices: the order queued jobs are offered in, and whether tenants'
GPU quotas hold. One value says both for production and for the simulator: the operator sets
it (`trainyard scheduling set-policy FILE`, a `SchedulingPolicySet` event, see `service`), the
claim SQL (`claim_candidates`) reads it from the `scheduling_policy` row in the claim statement
itself, and `claim_order` states the same order in Python for the simulator (`sim/`) and the
pending reasons. Until an operator sets one, `DEFAULT` holds.

A policy file, as `set-policy` and `trainyard simulate --policy-file` read it (JSON or YAML):

    order: fair_share        # fair_share | priority | fifo (required)
    quotas: true             # whether tenants' GPU quotas hold (default true)

Pure: the file is read here, but nothing else is done with it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError


class Order(StrEnum):
    FAIR_SHARE = "fair_share"
    """The tenant holding the fewest GPUs for its weight first; within a tenant, priority, then
    submission time."""
    PRIORITY = "priority"
    """Priority (highest first), then submission time, across tenants: no fair share."""
    FIFO = "fifo"
    """Submission time alone, across tenants."""


@dataclass(frozen=True, slots=True)
class ClaimPolicy:
    order: Order = Order.FAIR_SHARE
    quotas: bool = True
    """Whether a tenant's GPU quota caps what it may hold; off, only room limits it."""

    def describe(self) -> str:
        """One line for a person: `fifo, quotas off`."""
        return f"{self.order}, quotas {'on' if self.quotas else 'off'}"


DEFAULT = ClaimPolicy()
"""The policy claims follow until an operator sets one (and after a rebuild of the
`scheduling` projection empties its row, until the log's events are applied again)."""


class PolicyError(ValueError):
    """A policy that cannot be used: the message names the field (or the file's line) at
    fault."""


class PolicyFields(BaseModel):
    """A claim policy as the API and policy files state it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    order: Order = Field(
        description="the order claims take queued jobs in: fair_share (the tenant holding the "
        "fewest GPUs for its weight first; within a tenant, priority, then submission time), "
        "priority (priority, then submission time, across tenants) or fifo (submission time "
        "alone)"
    )
    quotas: StrictBool = Field(
        default=True,
        description="whether tenants' GPU quotas hold; false: only room limits what a tenant holds",
    )

    @property
    def policy(self) -> ClaimPolicy:
        return ClaimPolicy(self.order, self.quotas)


def read_document(path: Path) -> dict[str, Any]:
    """The mapping a policy file holds (JSON or YAML); PolicyError naming the file, and the
    line where it does not parse."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not text (JSON or YAML)") from None
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
    return document


def first_problem(exc: ValidationError) -> str:
    """`field: what is wrong`, for the first problem pydantic found."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(top)"
    return f"{field}: {first['msg']}"


def read_policy(path: Path) -> ClaimPolicy:
    """The claim policy a file states (`order`, `quotas`, nothing else); PolicyError naming
    the file and the field at fault. (`trainyard simulate --policy-file` also takes `weights`,
    which are each tenant's own and set with `trainyard tenants set`: see `sim.policy`.)"""
    document = read_document(path)
    if "weights" in document:
        raise PolicyError(
            f"{path}: weights: a tenant's weight is its own, not the policy's: set it with "
            "`trainyard tenants set TENANT --weight W` (`trainyard simulate --policy-file` "
            "takes weights to try them)"
        )
    try:
        return PolicyFields.model_validate(document).policy
    except ValidationError as exc:
        raise PolicyError(f"{path}: {first_problem(exc)}") from None
