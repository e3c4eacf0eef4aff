"""The language the agent port speaks: the value types, constants and errors that an agent and
the control plane share, re-exported from where they live in the control plane (they are not
moved: the control plane's own modules use them too). `node_agent` takes them from here."""

from __future__ import annotations

from controlplane.agent_port.values import (
    Allocation,
    BatchCall,
    ClaimedTask,
    ExpiredFolders,
    InferenceJob,
    JobNews,
    QueryClaim,
    TaskResults,
    WarmUid,
)
from controlplane.agents.claims import uids_exhausted
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import NodeAddress, NodeNameTaken, NodeSpec
from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.database import DATABASE_ERRORS
from controlplane.failures import EXIT_FAILED, EXIT_USAGE, CommandFailed
from controlplane.invariants import InvariantBroken
from controlplane.jobs.events import (
    CheckpointRequested,
    DeploymentRolledBack,
    JobCancelled,
    JobFailed,
    JobRestarted,
)
from controlplane.jobs.images import DEFAULT_ALLOWLIST, IMAGES_ENV, ImageAllowlist, ImageRefused
from controlplane.jobs.limits import REPORT_BURST_S, JobLimits
from controlplane.jobs.locations import (
    DATA_ROOTS_ENV,
    RESULTS_ROOTS_ENV,
    Roots,
    root_of,
    tenant_roots,
)
from controlplane.jobs.manifest import ServableSpec
from controlplane.jobs.restarts import LearnerFailure, after_failure
from controlplane.logs.lines import LogLine, Series, Stream, split_long_line, storable
from controlplane.scheduling.claim import Claim
from controlplane.scheduling.placement import LearnerAllocation

UNAVAILABLE = DATABASE_ERRORS
"""What a port's method raises when the control plane cannot be reached: retried by the agent
(its learners keep running meanwhile)."""

__all__ = [
    "DATA_ROOTS_ENV",
    "DEFAULT_ALLOWLIST",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "IMAGES_ENV",
    "REPORT_BURST_S",
    "RESULTS_ROOTS_ENV",
    "SYSTEM_CLOCK",
    "UNAVAILABLE",
    "Allocation",
    "BatchCall",
    "CheckpointRequested",
    "Claim",
    "ClaimedTask",
    "Clock",
    "CommandFailed",
    "DeploymentRolledBack",
    "ExpiredFolders",
    "GpuInfo",
    "ImageAllowlist",
    "ImageRefused",
    "InferenceJob",
    "InvariantBroken",
    "JobCancelled",
    "JobFailed",
    "JobLimits",
    "JobNews",
    "JobRestarted",
    "LearnerAllocation",
    "LearnerFailure",
    "LogLine",
    "NodeAddress",
    "NodeNameTaken",
    "NodeSpec",
    "QueryClaim",
    "Roots",
    "Series",
    "ServableSpec",
    "Stream",
    "TaskResults",
    "WarmUid",
    "after_failure",
    "root_of",
    "split_long_line",
    "storable",
    "tenant_roots",
    "uids_exhausted",
]
