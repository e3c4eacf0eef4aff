"""`/v1/inference` and an inference job's reads: submit one (it is a job: read, stream and
cancel it under `/v1/jobs/{job_id}`), its statistics (exact; also as an SSE stream), and its
queries' results in order."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from controlplane.deployments.errors import ServingError
from controlplane.http import params
from controlplane.http.auth import acting_tenant, principal
from controlplane.http.deployments import refused
from controlplane.http.errors import error, validation_error
from controlplane.http.jobs import JOBS_APPLICATION, visible_job
from controlplane.http.keys import IMAGES, INFERENCE, JOBS, POOL, TASKS
from controlplane.http.requests import event_metadata, idempotency_key, json_body, validated
from controlplane.http.streams import SSE_HEADERS, live_stream
from controlplane.inference.spec import InferenceRequest
from controlplane.inference.views import queries, stats
from controlplane.instruments import sse_client
from controlplane.jobs.images import ImageRefused
from controlplane.jobs.lifecycle import Job
from controlplane.jobs.service import IdempotencyMismatch, new_job_id

STATS_INTERVAL_S = 1.0
"""How often a stats stream looks again (it sends only what changed)."""
MAX_QUERIES_PAGE = 1000


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/inference", submit)
    app.router.add_get("/v1/jobs/{job_id}/stats", get_stats)
    app.router.add_get("/v1/jobs/{job_id}/stats/events", stream_stats)
    app.router.add_get("/v1/jobs/{job_id}/queries", list_queries)


async def submit(request: web.Request) -> web.Response:
    who = principal(request)
    body = validated(InferenceRequest, await json_body(request))
    try:
        request.app[IMAGES].admit(body.resources.image)
    except ImageRefused as exc:
        raise error(422, str(exc), field="resources.image") from exc
    tenant = acting_tenant(who, params.text(request.query.get("tenant"), "tenant"), "submits")
    key = idempotency_key(request)
    inference = request.app[INFERENCE]
    job_id = new_job_id(tenant, key)
    try:
        manifest = await inference.manifest(tenant, body, job_id)
        limits = None
        # A retry finds its job whatever the limits say now; only a new job is held to them.
        if key is None or await request.app[JOBS].load(job_id) is None:
            limits = (await request.app[JOBS_APPLICATION].admit(tenant, manifest)).for_job()
        job, created = await inference.submit(
            tenant, job_id, manifest, event_metadata(request, who, tenant), key, limits
        )
    except ValidationError as exc:
        raise validation_error(exc) from exc
    except ServingError as exc:
        raise refused(exc) from exc
    except IdempotencyMismatch as exc:
        raise error(409, str(exc)) from exc
    headers = {"Location": f"/v1/jobs/{job.job_id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    view = await request.app[JOBS_APPLICATION].view(job, now=False)
    return web.json_response(
        view.model_dump(mode="json", by_alias=True), status=201, headers=headers
    )


async def _inference_job(request: web.Request) -> Job:
    job = await visible_job(request, principal(request))
    if job.manifest.inference is None:
        raise error(404, f"job {job.job_id} is not an inference job: it has no queries")
    return job


async def _view(request: web.Request, job: Job) -> dict[str, Any]:
    spec = job.manifest.inference
    figures = await stats(request.app[POOL], job.job_id)
    return {
        "job_id": str(job.job_id),
        "state": job.state.value,
        "model": None if spec is None else f"{spec.model_tenant}/{spec.model_name}:{spec.version}",
        "weight": None if spec is None else spec.weight,
        "batch_size": None if spec is None else spec.batch_size,
        "total_queries": None if spec is None else spec.queries,
        **figures,
    }


async def get_stats(request: web.Request) -> web.Response:
    job = await _inference_job(request)
    return web.json_response(await _view(request, job))


async def stream_stats(request: web.Request) -> web.StreamResponse:
    """SSE of the job's statistics: a `stats` event now and whenever they change (looked at
    each second); the stream ends after the job has ended (its final figures sent)."""
    job = await _inference_job(request)
    response = web.StreamResponse(headers=SSE_HEADERS)
    jobs, tasks = request.app[JOBS], request.app[TASKS]
    with await live_stream(request):
        await response.prepare(request)
        try:
            with sse_client("stats"):
                sent = None
                while True:
                    view = await _view(request, job)
                    # The window's rate moves while nothing happens: the counts say what did.
                    changed = (view["state"], view["queries"], len(view["replicas"]))
                    if changed != sent:
                        sent = changed
                        await response.write(f"event: stats\ndata: {json.dumps(view)}\n\n".encode())
                    else:
                        await response.write(b": heartbeat\n\n")
                    if job.state.terminal or await tasks.pause(STATS_INTERVAL_S):
                        break
                    job = await jobs.load(job.job_id) or job
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away; nothing is lost (the figures are recomputed)
    return response


async def list_queries(request: web.Request) -> web.Response:
    job = await _inference_job(request)
    after = params.integer(request.query.get("after"), "after", maximum=2**62)
    limit = params.integer(request.query.get("limit"), "limit", minimum=1, maximum=MAX_QUERIES_PAGE)
    page = await queries(
        request.app[POOL], job.job_id, after=-1 if after is None else after, limit=limit or 100
    )
    # None once this page is the last (shorter than asked for): nothing more to ask for now.
    next_after = page[-1]["index"] if len(page) == (limit or 100) else None
    return web.json_response({"job_id": str(job.job_id), "queries": page, "next_after": next_after})
