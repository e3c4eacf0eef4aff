"""The OpenAPI description of the model repository's routes (`controlplane.http.models`); its
schemas come from the pydantic models those handlers validate and answer with."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.http import params
from controlplane.http.models import (
    ARTIFACT_PART,
    PUBLICATION_PART,
    AliasRequest,
    DeprecateRequest,
    Publication,
    VersionView,
    WebhookRequest,
)
from controlplane.models.catalog import MAX_PAGE
from controlplane.models.events import NOTIFIED
from controlplane.models.names import ALIAS, LATEST, MODEL_NAME
from controlplane.models.query.nodes import FACETS
from controlplane.models.query.tokens import ADMITTED
from controlplane.models.updates import MetadataUpdate

REF = "#/components/schemas/"
SCHEMAS: tuple[type[BaseModel], ...] = (
    VersionView,
    Publication,
    MetadataUpdate,
    AliasRequest,
    DeprecateRequest,
    WebhookRequest,
)
"""The component schemas these routes name."""

_REASONS = {
    400: "malformed request: a parameter or JSON body (the field names which)",
    401: "missing or wrong token",
    403: "a tenant's token acting for another tenant",
    404: "no such model, version or alias (or none the caller may see)",
    409: "refused in the model's current state (the message says why)",
    413: "the artifact (or its publication part) is over the size limit; nothing kept",
    422: "invalid fields, each listed (metadata fields as metadata.<path>)",
    429: "a tenant limit reached (the field names which; see docs/user-guide.md, Limits); "
    "nothing kept",
}


def answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int, **reasons: str) -> dict[str, Any]:
    """Error responses; `e409="..."` says what a status means for one operation."""
    return {
        str(s): answer(reasons.get(f"e{s}", _REASONS[s]), {"$ref": REF + "Error"}) for s in statuses
    }


def request_body(schema: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": {"$ref": REF + schema}}}}


def path_param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string"},
    }


_NAME = {
    **path_param("name", "the model's name"),
    "schema": {"type": "string", "pattern": f"^{MODEL_NAME.pattern}$"},
}
_VERSION = path_param("version", "a version number, an alias, or latest")
_ALIAS = {
    **path_param("alias", f"the alias (not {LATEST}, which is derived)"),
    "schema": {"type": "string", "pattern": f"^(?!{LATEST}$){ALIAS.pattern}$"},
}
_OWNER = {
    "name": "tenant",
    "in": "query",
    "description": "the model's tenant (default: the caller's own; the admin must name it)",
    "schema": params.text_schema(),
}
_ACTING = {
    "name": "tenant",
    "in": "query",
    "description": "admins only: the tenant whose model it is",
    "schema": params.text_schema(),
}
_VIEW = {"$ref": REF + "VersionView"}
_MODEL = {
    "type": "object",
    "properties": {
        "tenant": {"type": "string"},
        "name": {"type": "string"},
        "versions": {"type": "array", "items": _VIEW, "description": "newest first"},
        "aliases": {"type": "object", "additionalProperties": {"type": "integer"}},
        "latest": {"type": ["integer", "null"], "description": "the highest not deprecated"},
        "webhook_url": {
            "type": ["string", "null"],
            "description": "where the model's events are notified (shown to its tenant only)",
        },
    },
    "required": ["tenant", "name", "versions", "aliases", "latest", "webhook_url"],
}
_PAGE = {
    "type": "object",
    "properties": {
        "versions": {"type": "array", "items": _VIEW},
        "total": {"type": "integer", "description": "matching versions in all pages"},
        "facets": {
            "type": "object",
            "description": "per facet, how many matching versions have each value",
            "properties": {
                facet: {"type": "object", "additionalProperties": {"type": "integer"}}
                for facet in FACETS
            },
        },
        "next_cursor": {"type": ["string", "null"]},
    },
    "required": ["versions", "total", "facets", "next_cursor"],
}
_HISTORY = {
    "type": "object",
    "properties": {
        "tenant": {"type": "string"},
        "name": {"type": "string"},
        "history": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "version": {"type": "integer", "description": "in the model's stream"},
                    "position": {"type": "integer"},
                    "event": {"type": "string"},
                    "at": {"type": "string", "format": "date-time"},
                    "actor": {"type": "string"},
                    "data": {"type": "object"},
                },
            },
        },
        "webhooks": {
            "type": "array",
            "description": "every attempt to deliver the model's notifications, in the order "
            "they ended (from the stream webhook-model-<tenant>.<name>), as a job's history "
            "shows its own",
            "items": {"type": "object"},
        },
    },
    "required": ["tenant", "name", "history", "webhooks"],
}
_ALIAS_SET = {
    "type": "object",
    "properties": {
        "alias": {"type": "string"},
        "version": {"type": "integer"},
        "previous": {"type": ["integer", "null"], "description": "null: a new alias"},
    },
    "required": ["alias", "version", "previous"],
}
_UPLOAD = {
    "type": "object",
    "properties": {
        PUBLICATION_PART: {"$ref": REF + "Publication"},
        ARTIFACT_PART: {"type": "string", "format": "binary"},
    },
    "required": [PUBLICATION_PART, ARTIFACT_PART],
    "additionalProperties": False,
    "description": f"exactly two parts, in this order: `{PUBLICATION_PART}`, then "
    f"`{ARTIFACT_PART}`",
}


MODEL_NOTIFICATION = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid", "description": "the delivery id"},
        "type": {"type": "string", "enum": [e.type_name for e in NOTIFIED]},
        "tenant": {"type": "string"},
        "model": {"type": "string", "description": "the model's name"},
        "position": {"type": "integer", "description": "the event's place in the global log"},
        "version": {"type": "integer", "description": "the event's version in the model"},
        "at": {"type": "string", "format": "date-time"},
        "data": {"type": "object", "description": "the event's fields"},
    },
    "required": ["id", "type", "tenant", "model", "position", "version", "at", "data"],
}


def model_event_webhook(headers: list[dict[str, Any]]) -> dict[str, Any]:
    """The notification of a model's event, sent as a job's are (with `headers`)."""
    return {
        "post": {
            "summary": "A model's version or alias changed (sent to the URL its tenant set "
            "with PUT /v1/models/{name}/webhook)",
            "description": "Delivered, signed, retried and deduplicated exactly as jobEvent.",
            "parameters": headers,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": MODEL_NOTIFICATION}},
            },
            "responses": {"2XX": {"description": "received"}},
        }
    }


def openapi_paths() -> dict[str, Any]:
    secured: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "/v1/schemas/model-metadata": {
            "get": {
                "operationId": "getModelMetadataSchema",
                "summary": "The model metadata's JSON Schema (draft 2020-12)",
                "security": secured,
                "responses": {"200": answer("the schema", {"type": "object"}), **_errors(401)},
            }
        },
        "/v1/models": {
            "get": {
                "operationId": "searchModels",
                "summary": "Search the model versions the caller may see (docs/user-guide.md: "
                "Model search queries): ranked, with the total, facet counts and a cursor",
                "security": secured,
                "parameters": [
                    {
                        "name": "q",
                        "in": "query",
                        "description": "the query; empty: every version",
                        "schema": {**params.text_schema(), "pattern": ADMITTED},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "description": "page size (default 50)",
                        "schema": params.schema(minimum=1, maximum=MAX_PAGE),
                    },
                    {
                        "name": "cursor",
                        "in": "query",
                        "description": "next_cursor of the previous page",
                        "schema": params.CURSOR_SCHEMA,
                    },
                ],
                "responses": {"200": answer("a page", _PAGE), **_errors(400, 401)},
            }
        },
        "/v1/models/{name}": {
            "get": {
                "operationId": "getModel",
                "summary": "A model's versions (those the caller may see) and aliases",
                "security": secured,
                "parameters": [_NAME, _OWNER],
                "responses": {"200": answer("the model", _MODEL), **_errors(400, 401, 404)},
            }
        },
        "/v1/models/{name}/history": {
            "get": {
                "operationId": "getModelHistory",
                "summary": "Every event of the model, with its time and actor (its tenant and "
                "the admin only)",
                "security": secured,
                "parameters": [_NAME, _OWNER],
                "responses": {"200": answer("the history", _HISTORY), **_errors(400, 401, 404)},
            }
        },
        "/v1/models/{name}/versions": {
            "post": {
                "operationId": "publishModelVersion",
                "summary": "Publish the model's next version: an upload, or a job's file",
                "description": f"multipart/form-data: the `{PUBLICATION_PART}` part (JSON, "
                f"checked before the artifact is read), then the `{ARTIFACT_PART}` part, "
                "streamed into the store and checked against `sha256` when given. "
                "application/json: `from_job` with `checkpoint_step` or `results_file`; the "
                "provenance is filled in from the job's events. Publishing the same bytes "
                "and metadata again answers with the version it made (Idempotent-Replayed).",
                "security": secured,
                "parameters": [_NAME, _ACTING],
                "requestBody": {
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": _UPLOAD,
                            "encoding": {PUBLICATION_PART: {"contentType": "application/json"}},
                        },
                        "application/json": {"schema": {"$ref": REF + "Publication"}},
                    },
                },
                "responses": {
                    "201": answer("the version", _VIEW),
                    **_errors(
                        400,
                        401,
                        403,
                        409,
                        413,
                        422,
                        429,
                        e409="the job has not COMPLETED, or its file is gone",
                        e413="the artifact is over the size limit, or over the room its "
                        "tenant's artifact_bytes limit leaves (field artifact_bytes); nothing kept",
                        e422="invalid fields, each listed; a bad model name; an upload whose "
                        "bytes do not have its sha256; an unknown from_job",
                    ),
                },
            }
        },
        "/v1/models/{name}/versions/{version}": {
            "get": {
                "operationId": "getModelVersion",
                "summary": "One version of a model",
                "security": secured,
                "parameters": [_NAME, _VERSION, _OWNER],
                "responses": {"200": answer("the version", _VIEW), **_errors(400, 401, 404)},
            },
            "patch": {
                "operationId": "updateModelVersion",
                "summary": "Change a version's mutable metadata (description, domains, tags, "
                "citation; metrics added)",
                "security": secured,
                "parameters": [_NAME, _VERSION, _ACTING],
                "requestBody": request_body("MetadataUpdate"),
                "responses": {
                    "200": answer("the version (also when nothing changed)", _VIEW),
                    **_errors(
                        400,
                        401,
                        403,
                        404,
                        409,
                        422,
                        e409="a recorded metric given another value",
                        e422="invalid or immutable fields, each listed",
                    ),
                },
            },
        },
        "/v1/models/{name}/versions/{version}/deprecate": {
            "post": {
                "operationId": "deprecateModelVersion",
                "summary": "Deprecate a version: no longer latest, no alias may name it",
                "security": secured,
                "parameters": [_NAME, _VERSION, _ACTING],
                "requestBody": request_body("DeprecateRequest"),
                "responses": {
                    "200": answer("the version", _VIEW),
                    **_errors(400, 401, 403, 404, 409, 422, e409="an alias names the version"),
                },
            }
        },
        "/v1/models/{name}/versions/{version}/artifact": {
            "get": {
                "operationId": "downloadModelVersion",
                "summary": "The version's artifact, verified against its sha256 as it is read",
                "description": "ETag and Repr-Digest carry the sha256. A stored artifact found "
                "damaged is never sent whole: the connection closes before its last bytes.",
                "security": secured,
                "parameters": [_NAME, _VERSION, _OWNER],
                "responses": {
                    "200": {
                        "description": "the artifact's bytes",
                        "content": {
                            "application/octet-stream": {
                                "schema": {"type": "string", "format": "binary"}
                            }
                        },
                    },
                    **_errors(400, 401, 404, 409, e409="the artifact is missing from the store"),
                },
            }
        },
        "/v1/models/{name}/webhook": {
            "put": {
                "operationId": "setModelWebhook",
                "summary": "Notify the model's events to a URL (see the document's webhooks)",
                "description": "Each ModelVersionPublished, ModelMetadataUpdated, ModelAliasSet, "
                "ModelAliasRemoved and ModelVersionDeprecated from now on is POSTed to it, "
                "signed with the tenant's webhook secret and retried as a job's notifications "
                "are.",
                "security": secured,
                "parameters": [_NAME, _ACTING],
                "requestBody": request_body("WebhookRequest"),
                "responses": {
                    "200": answer(
                        "the webhook",
                        {"type": "object", "properties": {"url": {"type": "string"}}},
                    ),
                    **_errors(
                        400,
                        401,
                        403,
                        404,
                        409,
                        422,
                        e422="invalid fields; a host that is or resolves to a non-public "
                        "address (not in TRAINYARD_WEBHOOK_ALLOW_NETWORKS), or does not resolve",
                    ),
                },
            },
            "delete": {
                "operationId": "removeModelWebhook",
                "summary": "Stop notifying the model's events",
                "security": secured,
                "parameters": [_NAME, _ACTING],
                "responses": {
                    "204": {"description": "removed (or there was none)"},
                    **_errors(400, 401, 403, 404, 409, 422, e422="an unknown tenant"),
                },
            },
        },
        "/v1/models/{name}/aliases/{alias}": {
            "put": {
                "operationId": "setModelAlias",
                "summary": "Point an alias at a version (a new alias, or moved: one event)",
                "security": secured,
                "parameters": [_NAME, _ALIAS, _ACTING],
                "requestBody": request_body("AliasRequest"),
                "responses": {
                    "200": answer("the alias", _ALIAS_SET),
                    **_errors(
                        400,
                        401,
                        403,
                        404,
                        409,
                        422,
                        e409="the version is deprecated, or the model has its most aliases",
                        e422="invalid fields; an invalid alias, or latest (derived)",
                    ),
                },
            },
            "delete": {
                "operationId": "removeModelAlias",
                "summary": "Remove an alias",
                "security": secured,
                "parameters": [_NAME, _ALIAS, _ACTING],
                "responses": {
                    "204": {"description": "removed"},
                    **_errors(400, 401, 403, 404, 422, e422="an invalid alias, or latest"),
                },
            },
        },
    }
