"""`/healthz` and `/readyz`: what a supervisor and a load balancer ask, without a token."""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, Field

from controlplane.http.keys import BACKGROUND, PLANE
from controlplane.http.operations import Answer, Operation, add_operations, answer


class Health(BaseModel):
    status: Literal["ok", "background tasks stopped"]


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    database: bool
    projections_caught_up: bool
    background_tasks: bool
    stopped_projections: dict[str, str] = Field(
        description="projections stopped on an event they failed on too many times in a row, "
        "by name: what stopped each"
    )


async def healthz(request: web.Request) -> web.Response:
    """Alive unless the background tasks have died: then a supervisor should restart us."""
    if request.app[BACKGROUND].done():
        return answer(Health(status="background tasks stopped"), status=503)
    return answer(Health(status="ok"))


async def readyz(request: web.Request) -> web.Response:
    readiness = await request.app[PLANE].readiness(request.app[BACKGROUND])
    body = Readiness(
        status="ready" if readiness.ready else "not ready",
        database=readiness.database,
        projections_caught_up=readiness.projections_caught_up,
        background_tasks=readiness.background_tasks,
        stopped_projections=readiness.stopped_projections,
    )
    return answer(body, status=200 if readiness.ready else 503)


OPERATIONS = (
    Operation(
        "get",
        "/healthz",
        healthz,
        "healthz",
        "Liveness: the process serves requests",
        {
            200: Answer("alive", Health),
            503: Answer("its background tasks stopped: restart it", Health),
        },
        public=True,
    ),
    Operation(
        "get",
        "/readyz",
        readyz,
        "readyz",
        "Readiness: the database answers and projections have caught up",
        {200: Answer("ready", Readiness), 503: Answer("not ready", Readiness)},
        public=True,
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
