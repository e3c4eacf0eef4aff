"""`/v1/scheduling/policy`: the claim policy in force (the order claims take queued jobs in,
and whether tenants' GPU quotas hold), which every token may read, and the admin's switch to
another (see `controlplane.scheduling.application`)."""

from __future__ import annotations

from aiohttp import web

from controlplane.http import params
from controlplane.http.auth import principal
from controlplane.http.errors import error
from controlplane.http.keys import PLANE
from controlplane.http.operations import Answer, Operation, add_operations, answer
from controlplane.http.requests import MAX_KEY, actor, json_body, validated
from controlplane.scheduling.application import Scheduling
from controlplane.scheduling.requests import PolicyRequest
from controlplane.scheduling.views import PolicyView


def _scheduling(request: web.Request) -> Scheduling:
    plane = request.app[PLANE]
    return Scheduling(plane.pool, plane.store, plane.projections, plane.clock)


async def get_policy(request: web.Request) -> web.Response:
    view = await _scheduling(request).policy()
    if not principal(request).is_admin:
        # Tenants see the order their jobs are claimed in; who switched it and the admin's
        # words of why (which may name tenants) are the operators' own.
        view = view.model_copy(update={"set_by": None, "reason": None})
    return answer(view)


async def set_policy(request: web.Request) -> web.Response:
    who = principal(request)
    if not who.is_admin:  # checked before the body is read
        raise error(403, "only the admin token may set the claim policy")
    body = validated(PolicyRequest, await json_body(request))
    correlation_id = params.text(
        request.headers.get("X-Request-ID"), "X-Request-ID", max_length=MAX_KEY
    )
    view = await _scheduling(request).set_policy(body, actor(who), correlation_id=correlation_id)
    return answer(view)


OPERATIONS = (
    Operation(
        "get",
        "/v1/scheduling/policy",
        get_policy,
        "getSchedulingPolicy",
        "The claim policy in force",
        {200: Answer("the policy claims follow now", PolicyView)},
        {401: "missing or wrong token"},
        description="The order claims take queued jobs in (fair_share, priority or fifo) and "
        "whether tenants' GPU quotas hold; `set_at` is null while none was set and the default "
        "(fair share within quotas) holds. `set_by` and `reason` are the admin's to read "
        "(null for a tenant's token). The pending reasons judge the queue under it.",
    ),
    Operation(
        "put",
        "/v1/scheduling/policy",
        set_policy,
        "setSchedulingPolicy",
        "Switch the claim policy (admin)",
        {200: Answer("the policy claims follow from the next claim on", PolicyView)},
        {
            400: "malformed JSON",
            401: "missing or wrong token",
            403: "not the admin token",
            409: "other switches kept changing it; nothing was written",
            422: "invalid fields, each listed",
        },
        description="Recorded as a SchedulingPolicySet event (who, when, why: see "
        "audit.actions); claims follow it from the next claim on, and the pending reasons "
        "and `trainyard simulate --policy current` with it. Setting the policy in force "
        "writes nothing (`changed` is false). Try a policy first against the recorded past "
        "with `trainyard simulate --policy-file FILE`.",
        body=PolicyRequest,
        body_required=True,
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)
