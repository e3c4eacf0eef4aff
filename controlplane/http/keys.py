"""What the control plane's aiohttp application holds, by typed key."""

from __future__ import annotations

import asyncio

import asyncpg
from aiohttp import web

from controlplane.cluster_gauges import ClusterGauges
from controlplane.composition import ControlPlane
from controlplane.deployments.service import Deployments
from controlplane.deployments.tasks import Tasks
from controlplane.events.hub import StreamHub
from controlplane.events.store import EventStore
from controlplane.inference.service import Inference
from controlplane.jobs.images import ImageAllowlist
from controlplane.jobs.locations import Roots
from controlplane.jobs.service import Jobs
from controlplane.models.service import Models
from controlplane.projections.runner import ProjectionRunner
from controlplane.tenants.submissions import SubmissionRates
from controlplane.webhooks.relay import WebhookRelay

DATABASE_URL = web.AppKey("database_url", str)
PLANE = web.AppKey("plane", ControlPlane)
"""The composition root's parts; the keys below name the ones handlers use."""
POOL = web.AppKey("pool", asyncpg.Pool)
STORE = web.AppKey("store", EventStore)
PROJECTIONS = web.AppKey("projections", ProjectionRunner)
HUB = web.AppKey("hub", StreamHub)
JOBS = web.AppKey("jobs", Jobs)
MODELS = web.AppKey("models", Models)
DEPLOYMENTS = web.AppKey("deployments", Deployments)
INFERENCE = web.AppKey("inference", Inference)
TASKS = web.AppKey("tasks", Tasks)
GAUGES = web.AppKey("gauges", ClusterGauges)
WEBHOOKS = web.AppKey("webhooks", WebhookRelay)
BACKGROUND = web.AppKey("background", asyncio.Task[None])
SSE_HEARTBEAT_S = web.AppKey("sse_heartbeat_s", float)
IMAGES = web.AppKey("images", ImageAllowlist)
"""The learner images jobs may name (`TRAINYARD_IMAGES`)."""
LOCATION_ROOTS = web.AppKey("location_roots", Roots)
SUBMISSIONS = web.AppKey("submissions", SubmissionRates)
