"""Each route declared once, as an `Operation`: its handler and what it takes and answers.

The router is built from these declarations (`add_operations`) and so is the OpenAPI document
(`described`, read by `controlplane.http.openapi`): the query parameters and the JSON bodies an
operation takes are pydantic models its handler validates with, its answers are the models its
facade returns. What the document says an operation takes is then what the handler checks.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel

REF = "#/components/schemas/"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Method = Literal["get", "post", "put", "patch", "delete"]


@dataclass(frozen=True, slots=True)
class Param:
    """A path or header parameter (query parameters come from the operation's `query` model)."""

    name: str
    where: Literal["path", "header"]
    description: str
    schema: Mapping[str, Any]
    required: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """One response: a model (named among the components), a schema stated as is (what no model
    says yet: an SSE stream, text), or no body."""

    description: str
    body: type[BaseModel] | Mapping[str, Any] | None = None
    media: str = "application/json"
    links: Mapping[str, Any] = field(default_factory=dict)
    also: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Other media types the answer comes in, as the request asks (an SSE stream with
    `follow=true`): each its OpenAPI media type object."""


@dataclass(frozen=True, slots=True)
class Operation:
    method: Method
    path: str
    handler: Handler
    id: str
    summary: str
    answers: Mapping[int, Answer]
    errors: Mapping[int, str] = field(default_factory=dict)
    """Each error status the operation answers, with what it means here."""
    description: str | None = None
    public: bool = False
    """Served without a token (see `controlplane.http.auth.PUBLIC_PATHS`)."""
    query: type[BaseModel] | None = None
    params: tuple[Param, ...] = ()
    body: type[BaseModel] | None = None
    body_required: bool = False
    raw_body: Mapping[str, Any] | None = None
    """A request body no model states (a multipart upload): its OpenAPI object as is."""
    raw_body_models: tuple[type[BaseModel], ...] = ()
    """The models `raw_body` names (its parts')."""


def add_operations(app: web.Application, operations: Iterable[Operation]) -> None:
    for operation in operations:
        app.router.add_route(operation.method.upper(), operation.path, operation.handler)


def answer(
    body: BaseModel, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A handler's JSON answer: the model as its facade made it, dumped by its aliases."""
    return web.json_response(
        body.model_dump(mode="json", by_alias=True),
        status=status,
        headers=dict(headers) if headers is not None else None,
    )


def models_of(operations: Iterable[Operation]) -> list[type[BaseModel]]:
    """The models the operations' bodies and answers name: the document's components."""
    found: dict[str, type[BaseModel]] = {}
    for operation in operations:
        named = [
            operation.body,
            *operation.raw_body_models,
            *(a.body for a in operation.answers.values()),
        ]
        for model in named:
            if isinstance(model, type) and issubclass(model, BaseModel):
                found.setdefault(model.__name__, model)
    return list(found.values())


def described(
    operations: Iterable[Operation], error_schema: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """The OpenAPI paths of `operations`; each error answers with `error_schema`."""
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method] = _operation(operation, error_schema)
    return paths


def _operation(operation: Operation, error_schema: Mapping[str, Any]) -> dict[str, Any]:
    described: dict[str, Any] = {"operationId": operation.id, "summary": operation.summary}
    if operation.description:
        described["description"] = operation.description
    if not operation.public:
        described["security"] = [{"bearer": []}]
    parameters = [_param(p) for p in operation.params]
    if operation.query is not None:
        parameters += query_params(operation.query)
    if parameters:
        described["parameters"] = parameters
    if operation.body is not None:
        described["requestBody"] = {
            "required": operation.body_required,
            "content": {"application/json": {"schema": {"$ref": REF + operation.body.__name__}}},
        }
    elif operation.raw_body is not None:
        described["requestBody"] = dict(operation.raw_body)
    responses = {str(s): _answer(a) for s, a in operation.answers.items()}
    for status, meaning in operation.errors.items():
        responses[str(status)] = _answer(Answer(meaning, error_schema))
    described["responses"] = responses
    return described


def _param(param: Param) -> dict[str, Any]:
    described: dict[str, Any] = {
        "name": param.name,
        "in": param.where,
        "description": param.description,
        "schema": dict(param.schema),
    }
    if param.required or param.where == "path":
        described["required"] = True
    return described


def _answer(answer: Answer) -> dict[str, Any]:
    described: dict[str, Any] = {"description": answer.description}
    if answer.body is not None:
        schema = (
            {"$ref": REF + answer.body.__name__}
            if isinstance(answer.body, type)
            else dict(answer.body)
        )
        described["content"] = {answer.media: {"schema": schema}}
    for media, content in answer.also.items():
        described.setdefault("content", {})[media] = dict(content)
    if answer.links:
        described["links"] = dict(answer.links)
    return described


def query_params(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A query model's fields as parameters: each its name (or alias), description and schema;
    a list field is a parameter given once per value (`?state=A&state=B`)."""
    schema = model.model_json_schema(ref_template=REF + "{model}")
    required = set(schema.get("required", ()))
    params = []
    for name, property_ in schema["properties"].items():
        property_ = _present(property_)
        property_.pop("title", None)
        description = property_.pop("description", "")
        param: dict[str, Any] = {
            "name": name,
            "in": "query",
            "description": description,
            "schema": property_,
        }
        if name in required:
            param["required"] = True
        if property_.get("type") == "array":
            param["explode"] = True
        params.append(param)
    return params


def _present(schema: Mapping[str, Any]) -> dict[str, Any]:
    """An optional field's schema as its parameter's: a parameter is absent or has a value,
    never null, so `anyOf [T, null]` (and its default of null) is T."""
    schema = dict(schema)
    branches = schema.get("anyOf", [])
    values = [b for b in branches if b != {"type": "null"}]
    if len(values) == 1 and len(branches) == 2:
        del schema["anyOf"]
        if schema.get("default", 0) is None:
            del schema["default"]
        schema = {**values[0], **schema}
    return schema


def is_list(annotation: Any) -> bool:
    """Whether a query field takes every value of its parameter (a list), or one."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(is_list(arg) for arg in typing.get_args(annotation))
    return typing.get_origin(annotation) is list


def links(parameter: str, *operations: str, at: str = "/id") -> dict[str, Any]:
    """The OpenAPI links of an answer whose body holds `parameter` of each operation at `at`
    (a JSON pointer): what clients (and generated tests) may do next with what it made, and
    nothing else."""
    return {
        operation[0].upper() + operation[1:]: {
            "operationId": operation,
            "parameters": {parameter: f"$response.body#{at}"},
        }
        for operation in operations
    }
