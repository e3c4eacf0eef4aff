"""What the control plane's aiohttp application holds, by typed key."""

from __future__ import annotations

import asyncio

import asyncpg
from aiohttp import web

from controlplane.agents.manager import LifecycleManager
from controlplane.cluster_gauges import ClusterGauges
from controlplane.events.hub import StreamHub
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.images import ImageAllowlist
from controlplane.jobs.locations import Roots
from controlplane.jobs.service import Jobs
from controlplane.projections.runner import ProjectionRunner
from controlplane.tenants.submissions import SubmissionRates
from controlplane.webhooks.relay import RelayConfig, WebhookRelay

DATABASE_URL = web.AppKey("database_url", str)
POOL = web.AppKey("pool", asyncpg.Pool)
STORE = web.AppKey("store", EventStore)
LISTENER = web.AppKey("listener", LogListener)
PROJECTIONS = web.AppKey("projections", ProjectionRunner)
HUB = web.AppKey("hub", StreamHub)
JOBS = web.AppKey("jobs", Jobs)
MANAGER = web.AppKey("manager", LifecycleManager)
GAUGES = web.AppKey("gauges", ClusterGauges)
WEBHOOKS = web.AppKey("webhooks", WebhookRelay)
WEBHOOK_CONFIG = web.AppKey("webhook_config", RelayConfig)
BACKGROUND = web.AppKey("background", asyncio.Task[None])
SSE_HEARTBEAT_S = web.AppKey("sse_heartbeat_s", float)
IMAGES = web.AppKey("images", ImageAllowlist)
"""The learner images jobs may name (`TRAINYARD_IMAGES`)."""
LOCATION_ROOTS = web.AppKey("location_roots", Roots)
SUBMISSIONS = web.AppKey("submissions", SubmissionRates)
