"""`trainyard bench contract`: schemathesis against a served control plane, to check that the
OpenAPI document and the server agree (issue 33).

A real `trainyard serve` on a scratch database, a tenant with its limits out of reach (a 429
that depends on timing is no disagreement), and schemathesis's CLI run against its
`/openapi.json`: valid and invalid data, every phase (the document's examples, its coverage of
each rule, fuzzing, and stateful sequences that follow its links), every check, with the
tenant's token on every route, then with the admin's on the admin's routes (a tenant gets a 403
there before its request is read). The streams that last until a job or search ends are left
out (as in tests/controlplane/http/test_api_properties.py), and so are the choices of
bench/api_contract_hooks.py (logs as text, no made-up cursor in a valid request); the
schemathesis settings that differ from its defaults are in CONFIG, each with its reason.

Its figures: `cases` (requests schemathesis generated and sent, both runs), `failures`
(distinct failures by check, with the operations they were found on; e.g. `ST202
Schema-valid request rejected`: a request the document allows that the server refused),
`errors` (operations schemathesis could not test), `runs` (each run's cases and failures) and
`seed`. The check passes when `failures` and `errors` are empty; without `--json`,
schemathesis's own output above the figures shows each failing case with a curl that
reproduces it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from bench.scratch import scratch_database
from harness.served import ServedControlPlane

ENDLESS = (
    "/v1/jobs/{job_id}/events",
    "/v1/jobs/{job_id}/pending/events",
    "/v1/searches/{search_id}/events",
)
"""Streams that end only when their job or search does: a generated job stays queued."""
TIMING = ("/readyz",)
"""Not ready is a 503 by design (documented) while projections catch up with the run's writes:
schemathesis's stateful phase counts it as a server error whatever CONFIG says of the
operation, so the probe is left to tests/controlplane/http/test_http.py."""
ENDLESS_EXCLUDED = tuple(arg for path in (*ENDLESS, *TIMING) for arg in ("--exclude-path", path))
ADMIN_ROUTES = ("--include-path-regex", "^/v1/tenants|^/metrics")
TENANT = "contract"
UNLIMITED = {"submissions_per_s": 100_000, "submission_burst": 100_000, "queued_jobs": 10_000_000}
ALLOW_ANY_IMAGE = {"TRAINYARD_IMAGES": "*"}
"""Which images run is the operator's choice, which the document leaves to prose; with every
image allowed, the syntax it states is the whole rule."""
REQUEST_TIMEOUT_S = 10
"""An answer slower than this is a stream that does not end: an error."""
SEED = 20261128
"""The seed of issue 33's run."""
CONFIG = """
# The links a client follows are the document's: schemathesis's guesses (from a Location
# header, or from response fields) would send a training job's id to /stats, which only an
# inference job has.
[phases.stateful.inference]
algorithms = []

# Values captured from responses (ids, a webhook secret) are put into other operations' fields
# whatever those fields' patterns say, and the case is still counted as valid: a webhook secret
# sent as a DOI is schemathesis's disagreement with the document, not the server's.
[phases.fuzzing.extra-data-sources]
responses = false

# A body over the server's 1 MiB is a 413 (documented), whatever the schema says of its parts.
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "5xx"]
[checks.negative_data_rejection]
expected-statuses = [
    "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"
]
"""


async def run(
    url: str, *, seed: int = SEED, max_examples: int = 100, progress: bool = False
) -> dict[str, Any]:
    async with scratch_database(url, "contract") as database:
        with tempfile.TemporaryDirectory() as home:
            plane = ServedControlPlane(database, Path(home), env=ALLOW_ANY_IMAGE)
            await plane.start()
            try:
                config = Path(home) / "schemathesis.toml"
                config.write_text(CONFIG)
                runs = {
                    "tenant": (await _tenant_token(plane), ENDLESS_EXCLUDED),
                    "admin": (plane.admin_token, ADMIN_ROUTES),
                }
                found = {}
                for name, (token, selected) in runs.items():
                    report = Path(home) / f"{name}.json"
                    await _schemathesis(
                        plane.url, token, selected, seed, max_examples, config, report, progress
                    )
                    found[name] = summary(json.loads(report.read_text()))
            finally:
                await plane.stop()
    return {"seed": seed, "max_examples": max_examples, **merged(found)}


async def _tenant_token(plane: ServedControlPlane) -> str:
    admin = {"Authorization": f"Bearer {plane.admin_token}"}
    async with aiohttp.ClientSession(plane.url, headers=admin) as session:
        async with session.post("/v1/tenants", json={"name": TENANT}) as response:
            if response.status != 201:
                raise RuntimeError(f"create tenant: {response.status} {await response.text()}")
            token: str = (await response.json())["token"]
        # A 429 that depends on timing is no disagreement between the document and the server.
        async with session.put(f"/v1/tenants/{TENANT}/limits", json=UNLIMITED) as response:
            if response.status != 200:
                raise RuntimeError(f"tenant limits: {response.status} {await response.text()}")
    return token


async def _schemathesis(
    url: str,
    token: str,
    selected: tuple[str, ...],
    seed: int,
    max_examples: int,
    config: Path,
    report: Path,
    progress: bool,
) -> None:
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(config)),
        *("run", f"{url}/openapi.json"),
        *("--seed", str(seed), "--max-examples", str(max_examples)),
        *("--mode", "all", "--phases", "examples,coverage,fuzzing,stateful", "--checks", "all"),
        *("--header", f"Authorization: Bearer {token}"),
        *("--request-timeout", str(REQUEST_TIMEOUT_S), "--suppress-health-check", "all"),
        *selected,
        *("--report", "json", "--report-json-path", str(report)),
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "bench.api_contract_hooks"}
    process = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        stdout=None if progress else asyncio.subprocess.DEVNULL,
        stderr=None if progress else asyncio.subprocess.DEVNULL,
    )
    # Its exit code says only whether it found something; the report says what.
    if await process.wait() not in (0, 1):
        raise RuntimeError(f"schemathesis failed to run (exit code {process.returncode})")


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Cases, failures by check and errors from one of schemathesis's JSON reports."""
    cases = report["test_cases"]
    return {
        "schemathesis": report["schemathesis_version"],
        "cases": cases["generated"],
        "cases_failed": cases["with_failures"],
        "failures": {
            f"{failure['code']} {failure['title']}": {
                "count": failure["count"],
                "operations": failure["operations"],
            }
            for failure in report["failures"]
        },
        "errors": {error["title"]: error["count"] for error in report["errors"]},
        "phases": {name: phase["status"] for name, phase in report["phases"].items()},
    }


def merged(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The runs' summaries as one: cases summed, failures and errors by kind over both."""
    failures: dict[str, dict[str, Any]] = {}
    errors: dict[str, int] = {}
    for run in runs.values():
        for kind, found in run["failures"].items():
            into = failures.setdefault(kind, {"count": 0, "operations": []})
            into["count"] += found["count"]
            into["operations"] += found["operations"]
        for title, count in run["errors"].items():
            errors[title] = errors.get(title, 0) + count
    return {
        "schemathesis": next(iter(runs.values()))["schemathesis"],
        "cases": sum(run["cases"] for run in runs.values()),
        "failures": failures,
        "errors": errors,
        "runs": {
            name: {
                "cases": run["cases"],
                "cases_failed": run["cases_failed"],
                "phases": run["phases"],
            }
            for name, run in runs.items()
        },
    }
