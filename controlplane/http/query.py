"""Query parameters as pydantic models, parsed before any I/O.

An operation's query is a model whose fields are annotated with the checks below
(`limit: Annotated[int, integer(1, 500)] = 50`); `parsed` reads the request's
query string into it, and a malformed or out-of-range value is a 400 naming the parameter, in
the same words `controlplane.http.params` uses. Each type states in its JSON schema what it
checks (bounds, patterns), so the OpenAPI document allows exactly what the server accepts.

Checked here rather than left to the database: a value Postgres refuses (an int4 past
2**31 - 1, a NUL byte in text) fails with a 500, and on a streamed route only after the 200.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar
from uuid import UUID

from aiohttp import web
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from controlplane.http import params
from controlplane.http.errors import error
from controlplane.http.operations import is_list

M = TypeVar("M", bound=BaseModel)


MAX_LABEL_FILTERS = 4
"""The most `label=KEY=VALUE` filters one request takes: each may be 510 characters, and a
request line past aiohttp's 32 KiB is refused before any handler (as text, not an Error)."""


class Query(BaseModel):
    """A query string's parameters. Unknown parameters are ignored, as HTTP servers do."""

    model_config = ConfigDict(frozen=True, extra="ignore")


def parsed(request: web.Request, model: type[M]) -> M:
    """The request's query as `model`; 400 naming the first bad parameter."""
    raw: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if is_list(info.annotation):
            values = request.query.getall(name, [])
            if values:
                raw[name] = values
        elif name in request.query:
            raw[name] = request.query[name]
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0])
        raise error(400, _message(name, first), field=name) from None


def _message(name: str, failure: Any) -> str:
    # Ours say the parameter's name already; pydantic's own (a missing parameter) do not.
    if failure["type"] == "parameter":
        return str(failure["msg"])
    return f"{name}: {failure['msg']}"


@dataclass(frozen=True, slots=True)
class Parameter:
    """A query parameter's check, as `Annotated` metadata: `check(raw, name)` turns the raw
    text into the value or refuses it (`refuse`); `schema` is what the check adds to the
    field's JSON schema (bounds, a pattern)."""

    check: Callable[[Any, str], Any]
    schema: Mapping[str, Any] = field(default_factory=dict)

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def validate(value: Any, info: core_schema.ValidationInfo) -> Any:
            return self.check(value, info.field_name or "parameter")

        return core_schema.with_info_before_validator_function(validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        stated = handler(schema)
        stated.update(self.schema)
        return stated


def refuse(message: str) -> PydanticCustomError:
    """A parameter's refusal, its message said as is."""
    return PydanticCustomError("parameter", message)


def integer(minimum: int = 0, maximum: int = params.INT4_MAX) -> Parameter:
    """An integer in [minimum, maximum], in plain ASCII digits."""

    def check(value: Any, name: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not params.ASCII_INTEGER.fullmatch(value):
            raise refuse(f"{name} must be an integer")
        number = int(value)
        if not minimum <= number <= maximum:
            raise refuse(f"{name} must be between {minimum} and {maximum}")
        return number

    return Parameter(check, params.schema(minimum=minimum, maximum=maximum))


def text(max_length: int = 1000, schema: Mapping[str, Any] | None = None) -> Parameter:
    """Text that Postgres stores and compares: no NUL, valid UTF-8, at most `max_length`;
    `schema` states a stricter form the caller checks (a pattern)."""

    def check(value: Any, name: str) -> str:
        if not isinstance(value, str):
            raise refuse(f"{name} must be text")
        if len(value) > max_length:
            raise refuse(f"{name} must be at most {max_length} characters")
        if not params.storable(value):
            raise refuse(f"{name} must be valid Unicode text without NUL")
        return value

    return Parameter(check, schema or params.text_schema(max_length=max_length))


def choice(allowed: Collection[str]) -> Parameter:
    """One of `allowed`, as it is spelled there."""

    def check(value: Any, name: str) -> Any:
        if value not in allowed:
            raise refuse(f"{name} must be one of {', '.join(sorted(allowed))}")
        return value

    return Parameter(check)


def _boolean(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if not isinstance(value, str) or value.lower() not in params.TRUE | params.FALSE:
        raise refuse(f"{name} must be true or false")
    return value.lower() in params.TRUE


BOOLEAN = Parameter(_boolean, {"type": "boolean"})
"""true/1 or false/0 (any case)."""


def _uuid(value: Any, name: str) -> UUID:
    try:
        return value if isinstance(value, UUID) else UUID(value)
    except (TypeError, ValueError):
        raise refuse(f"{name} must be a UUID") from None


UUID_PARAMETER = Parameter(_uuid)
"""A UUID, as its canonical text or any form `uuid.UUID` reads."""


def _instant(value: Any, name: str) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None:
        raise refuse(f"{name} must be an RFC 3339 timestamp")
    if when.tzinfo is None:
        raise refuse(f"{name} needs a time zone offset (e.g. Z)")
    try:
        # The offset may move an instant near year 1 or 9999 out of what datetime holds.
        return when.astimezone(UTC)
    except OverflowError:
        raise refuse(f"{name} is out of range") from None


INSTANT = Parameter(_instant)
"""An RFC 3339 instant with its offset, in UTC."""


def _cursor(value: Any, name: str) -> str:
    if not isinstance(value, str) or not params.CURSOR.fullmatch(value):
        raise refuse(f"invalid {name}")
    return value


CURSOR = Parameter(_cursor, params.CURSOR_SCHEMA)
"""A page's `next_cursor` sent back as it came (what it holds is the feature's to read)."""


class ResumeQuery(Query):
    """Where a stream resumes (`Last-Event-ID`, a header, wins; see `params.resume_after`)."""

    after: Annotated[int | None, integer(0, params.INT8_MAX)] = Field(
        default=None, description="same as Last-Event-ID: resume after this position"
    )
