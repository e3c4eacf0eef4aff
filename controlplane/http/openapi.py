"""The OpenAPI document served at /openapi.json, kept beside the routes it describes."""

from __future__ import annotations

from typing import Any

from controlplane import __version__

_HEALTH = {
    "type": "object",
    "properties": {"status": {"type": "string"}},
    "required": ["status"],
}
_READY = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ready", "not ready"]},
        "database": {"type": "boolean"},
        "projections_caught_up": {"type": "boolean"},
        "background_tasks": {"type": "boolean"},
    },
    "required": ["status", "database", "projections_caught_up", "background_tasks"],
}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "Trainyard", "version": __version__},
        "paths": {
            "/healthz": {
                "get": {
                    "summary": "Liveness: the process serves requests",
                    "responses": {"200": _json("alive", _HEALTH)},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: the database answers and projections have caught up",
                    "responses": {
                        "200": _json("ready", _READY),
                        "503": _json("not ready", _READY),
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {"200": _json("the OpenAPI document", {"type": "object"})},
                }
            },
        },
    }
