"""Property-based: schemathesis, driven by the served `/openapi.json`, sends generated requests
(valid and invalid) with a tenant's token to a real `trainyard serve` on a real Postgres, alone
and in sequences that follow the document's links (submit, then read, cancel...), and checks
that no answer is a server error, that every answer is complete and that it conforms to the
document (status, content type, headers, body).

The SSE routes stream until the job (or search) ends, so they are left to test_api_params.py and
the logs and events tests: here a job's `/events` and `/pending/events` and a search's `/events`
are left out (tested in tests/controlplane/pending and tests/trainyard/test_search_cli.py), and
the logs are asked for as text."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.stateful import run_state_machine_as_test
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from harness.served import ServedControlPlane
from tests.tenancy import Tokens

MANIFEST = {"name": "explored", "image": "img", "command": ["train"]}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES = 25
"""Generated requests per operation: this test is the short version, about a minute and a half
on two cores (at 40, 132 s of a CI run of 35 minutes, its slowest test, on 2026-12-03);
`trainyard bench contract` is the long one (100 a phase, every phase)."""
SCENARIOS = 25
STEPS = 8
TIMEOUT_S = 10.0
"""A request that takes longer is a stream that does not end: a failure."""

UNLIMITED = {"submissions_per_s": 100_000, "submission_burst": 100_000, "queued_jobs": 10_000_000}

_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no .hypothesis/ directory; the seed is printed on a failure
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


async def test_no_generated_request_gets_a_server_error_or_an_answer_off_the_document(
    db_url: str, tokens: Tokens, tmp_path: Path
) -> None:
    served = ServedControlPlane(db_url, tmp_path / "server")
    await served.start()
    try:
        # Limits out of reach: a 429 that depends on timing would make what a step gets (and so
        # the next step Hypothesis draws) differ between runs of the same scenario.
        lifted = await asyncio.to_thread(
            requests.put,
            f"{served.url}/v1/tenants/acme/limits",
            json=UNLIMITED,
            headers={"Authorization": f"Bearer {tokens.admin}"},
            timeout=TIMEOUT_S,
        )
        assert lifted.status_code == 200, lifted.text
        await asyncio.to_thread(_explore, served.url, tokens.acme)
        # The admin's routes answer a tenant with 403 before reading the body: explore them
        # with the admin's token too.
        await asyncio.to_thread(_explore_admin_routes, served.url, tokens.admin)
    finally:
        await served.stop()


def _explore(url: str, token: str) -> None:
    schema = schemathesis.openapi.from_url(url + "/openapi.json").exclude(
        path=[
            "/v1/jobs/{job_id}/events",
            "/v1/jobs/{job_id}/pending/events",
            "/v1/searches/{search_id}/events",
        ]
    )
    headers = {"Authorization": f"Bearer {token}"}
    session = requests.Session()
    _each_operation(schema, session, url, headers)

    # Sequences of valid requests, so that a submission succeeds and its links are followed
    # (the invalid ones were sent above, operation by operation).
    schema.config.generation.update(modes=[GenerationMode.POSITIVE])

    class Scenarios(schema.as_state_machine()):
        def before_call(self, case: schemathesis.Case) -> None:
            _text_logs(case)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return _call_kwargs(session, url, headers)

        def validate_response(
            self, response: schemathesis.Response, case: schemathesis.Case, **kwargs: Any
        ) -> None:
            case.validate_response(
                response, checks=CHECKS, headers=headers, transport_kwargs=kwargs
            )

    run_state_machine_as_test(
        Scenarios,
        settings=settings(_SETTINGS, max_examples=SCENARIOS, stateful_step_count=STEPS),
    )


def _explore_admin_routes(url: str, token: str) -> None:
    schema = schemathesis.openapi.from_url(url + "/openapi.json").include(
        path_regex="^/v1/tenants|^/metrics"
    )
    _each_operation(schema, requests.Session(), url, {"Authorization": f"Bearer {token}"})


def _each_operation(
    schema: schemathesis.BaseSchema,
    session: requests.Session,
    url: str,
    headers: dict[str, str],
) -> None:
    """Valid and invalid requests, operation by operation."""
    call_kwargs = _call_kwargs(session, url, headers)
    for result in schema.get_all_operations():
        operation = result.ok()
        # A job's routes get a job of this tenant (random ids stop at the 404): generated
        # filters and cursors then reach the database.
        fixed = {"job_id": _submit(session, url, headers)} if "{job_id}" in operation.path else {}

        @given(
            case=operation.as_strategy(
                generation_mode=GenerationMode.POSITIVE, path_parameters=fixed
            )
        )
        @_SETTINGS
        def stateless(case: schemathesis.Case) -> None:
            _text_logs(case)
            case.call_and_validate(checks=CHECKS, **call_kwargs)

        stateless()

        @given(
            case=operation.as_strategy(
                generation_mode=GenerationMode.NEGATIVE, path_parameters=fixed
            )
        )
        @_SETTINGS
        def invalid(case: schemathesis.Case) -> None:
            _text_logs(case)
            case.call_and_validate(checks=CHECKS, **call_kwargs)

        # Unsatisfiable: nothing the operation takes can be made invalid (no parameters).
        with contextlib.suppress(Unsatisfiable):
            invalid()


def _call_kwargs(session: requests.Session, url: str, headers: dict[str, str]) -> dict[str, Any]:
    return {"base_url": url, "session": session, "headers": headers, "timeout": TIMEOUT_S}


def _text_logs(case: schemathesis.Case) -> None:
    """Text, not the SSE stream, which lasts until the job ends (an invalid `follow` stays)."""
    if case.query and str(case.query.get("follow")).lower() in ("true", "1"):
        case.query["follow"] = "false"


def _submit(session: requests.Session, url: str, headers: dict[str, str]) -> str:
    response = session.post(url + "/v1/jobs", json=MANIFEST, headers=headers, timeout=TIMEOUT_S)
    assert response.status_code == 201, response.text
    job_id: str = response.json()["id"]
    return job_id
