"""Schemathesis hooks for `trainyard bench contract` (loaded through SCHEMATHESIS_HOOKS).

- `model-query`, the format of `GET /v1/models?q=`, is the model search language: its valid
  values come from the grammar the user guide gives (bench/api_contract_formats.py).
- A valid case keeps the rules between fields the document states in words, which JSON Schema
  cannot (bench/api_contract_rules.py); the invalid cases are left as generated.
- A job's logs and a log search with `follow=true` stream until the job ends (the jobs a run
  submits stay queued: no agent serves them), or forever: asked as text instead, as
  tests/controlplane/http/test_api_properties.py does, they are checked like any other answer.
  An invalid `follow` stays, so that its 400 is checked too.
- A `cursor` is a page's `next_cursor` sent back, which only the server makes: one generated
  from its schema is refused by design (400 "invalid cursor"), so a valid request leaves it out
  (the invalid ones keep theirs, to check that they are refused)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import schemathesis

from bench import api_contract_rules
from bench.api_contract_formats import MODEL_QUERY, ORCID

schemathesis.openapi.format("model-query", MODEL_QUERY)
schemathesis.openapi.format("orcid", ORCID)

RULES: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {
    ("POST", "/v1/jobs"): api_contract_rules.job,
    ("POST", "/v1/searches"): api_contract_rules.search_trial,
    ("POST", "/v1/inference"): api_contract_rules.inference,
}
UPLOADS = ("POST", "/v1/models/{name}/versions")
QUERY_RULES: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {
    ("GET", "/v1/jobs/{job_id}/pending"): api_contract_rules.pending_window,
    ("GET", "/v1/logs/search"): api_contract_rules.log_search,
}


@schemathesis.hook
def map_body(context: schemathesis.HookContext, body: Any) -> Any:
    # As the body is generated: schemathesis checks a multipart body that a before_call hook
    # changed against the schema again, and counts its bytes as no string (an invalid case).
    # Both a valid and an invalid body pass here; the rule keeps each as it is.
    operation = context.operation
    uploading = operation is not None and (operation.method.upper(), operation.path) == UPLOADS
    if uploading and isinstance(body, dict):
        api_contract_rules.upload(body)
    return body


@schemathesis.hook
def before_call(
    context: schemathesis.HookContext, case: schemathesis.Case[Any], kwargs: dict[str, Any]
) -> None:
    valid = case.meta is not None and case.meta.generation.mode.is_positive
    operation = (case.operation.method.upper(), case.operation.path)
    # Schemathesis sees the edits, and checks that the case is still valid.
    if valid and (rule := RULES.get(operation)) is not None and isinstance(case.body, dict):
        rule(case.body)
    if valid and (rule := QUERY_RULES.get(operation)) is not None and case.query:
        rule(case.query)
    if not case.query:
        return
    if str(case.query.get("follow")).lower() in ("true", "1"):
        case.query["follow"] = "false"
    if valid:
        case.query.pop("cursor", None)
