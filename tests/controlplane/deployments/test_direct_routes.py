"""The direct path's routes against names any tenant may send: a deployment that does not
exist (or no longer does) is read each time and never kept, so that such requests cannot grow
a control plane's memory; one that exists is kept and answered from memory."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.deployments.direct import DirectPath
from controlplane.deployments.lifecycle import DEPLOYMENT, Create
from controlplane.deployments.service import Deployments
from controlplane.deployments.spec import Serving
from controlplane.deployments.streams import deployment_stream
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.locations import Roots
from controlplane.jobs.service import Jobs
from controlplane.models.service import Models
from tests.controlplane.deployments.test_lifecycle import created


async def test_only_routes_of_deployments_that_exist_are_kept(
    store: EventStore, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    jobs = Jobs(store)
    models = Models(store, FileArtifactStore(tmp_path), jobs, roots=Roots())
    direct = DirectPath(pool, Deployments(store, jobs, models))
    try:
        for n in range(100):
            assert await direct.route("acme", f"nothing-{n}") is None
        assert direct._routes == {}

        # As the API creates one: every serving setting stated (the lifecycle tests' leave some).
        event = created().model_copy(update={"serving": Serving().model_dump()})
        await DEPLOYMENT.execute(
            store, deployment_stream("acme", "dbl"), Create(event), Metadata(actor="test")
        )
        route = await direct.route("acme", "dbl")
        assert route is not None and route.endpoints == ()  # no replica offered yet
        assert list(direct._routes) == [("acme", "dbl")]
        assert await direct.route("acme", "dbl") is route  # kept: not read again
    finally:
        await direct.close()
