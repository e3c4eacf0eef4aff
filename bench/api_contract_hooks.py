"""Schemathesis hooks for `trainyard bench contract` (loaded through SCHEMATHESIS_HOOKS).

- A job's logs and a log search with `follow=true` stream until the job ends (the jobs a run
  submits stay queued: no agent serves them), or forever: asked as text instead, as
  tests/controlplane/http/test_api_properties.py does, they are checked like any other answer.
  An invalid `follow` stays, so that its 400 is checked too.
- A `cursor` is a page's `next_cursor` sent back, which only the server makes: one generated
  from its schema is refused by design (400 "invalid cursor"), so a valid request leaves it out
  (the invalid ones keep theirs, to check that they are refused)."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def before_call(
    context: schemathesis.HookContext, case: schemathesis.Case[Any], kwargs: dict[str, Any]
) -> None:
    if not case.query:
        return
    if str(case.query.get("follow")).lower() in ("true", "1"):
        case.query["follow"] = "false"
    if case.meta is not None and case.meta.generation.mode.is_positive:
        case.query.pop("cursor", None)
