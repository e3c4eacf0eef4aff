"""How every store checks an append and turns stored rows back into events, so that each
refuses the same input with the same message and reads the same events back (upcast included)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from controlplane.events.errors import MalformedEvent, UnknownEventType
from controlplane.events.metadata import Metadata
from controlplane.events.records import RecordedEvent, StreamAppend
from controlplane.events.types import EventRegistry

STREAM_ID = re.compile(r"^[a-z][a-z0-9_]*-[A-Za-z0-9._:@-]+$")
"""`<category>-<id>`, e.g. `job-<uuid>`, `node-gpu01`, `tenant-acme`; the table checks it too."""


@dataclass(frozen=True, slots=True)
class SerializedAppend:
    """A checked append, its events and metadata as JSON."""

    stream_id: str
    expected_version: int
    types: list[str]
    schema_versions: list[int]
    datas: list[str]
    metadata: str


def serialize(append: StreamAppend, types: EventRegistry) -> SerializedAppend:
    """The append as stored, or the error that refuses it (before anything is written)."""
    stream_id, expected_version = append.stream_id, append.expected_version
    if not STREAM_ID.match(stream_id):
        raise ValueError(f"invalid stream id {stream_id!r}: expected '<category>-<id>'")
    if expected_version < 0:
        raise ValueError(f"stream {stream_id}: expected version must be >= 0")
    if not append.events:
        raise ValueError(f"stream {stream_id}: nothing to append")
    names, versions, datas = [], [], []
    for offset, event in enumerate(append.events, start=1):
        version = expected_version + offset
        if not types.is_registered(event):
            raise UnknownEventType(
                f"stream {stream_id} version {version}: event class "
                f"{type(event).__name__} is not a registered event type; nothing was written"
            )
        try:
            datas.append(event.model_dump_json())
        except ValueError as exc:
            raise MalformedEvent(
                f"stream {stream_id} version {version}: {event.type_name} cannot be "
                f"serialized ({exc}); nothing was written"
            ) from exc
        names.append(event.type_name)
        versions.append(event.schema_version)
    return SerializedAppend(
        stream_id, expected_version, names, versions, datas, append.metadata.model_dump_json()
    )


def decode(
    types: EventRegistry,
    *,
    position: int,
    xid: int,
    stream_id: str,
    stream_version: int,
    type_name: str,
    schema_version: int,
    data: str,
    metadata: str,
    recorded_at: datetime,
) -> RecordedEvent:
    """The recorded event of a stored one (its fields as written: no intermediate record, as
    a reader far behind decodes many); an unknown type or bad data is named by stream, version
    and place."""
    try:
        event = types.decode(type_name, schema_version, data)
    except (UnknownEventType, MalformedEvent) as exc:
        raise type(exc)(
            f"stream {stream_id} version {stream_version} (position {position}): {exc}"
        ) from exc
    return RecordedEvent(
        position=position,
        xid=xid,
        stream_id=stream_id,
        stream_version=stream_version,
        event=event,
        metadata=Metadata.model_validate_json(metadata),
        recorded_at=recorded_at,
    )
