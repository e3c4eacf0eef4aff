"""The line protocol: every message survives encode/parse; ordinary output is left alone."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runners.protocol import (
    PHASES,
    PREFIX,
    CheckpointRestored,
    CheckpointSaved,
    Message,
    Metric,
    PhaseEnded,
    PhaseStarted,
    encode,
    parse,
)

AT = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

times = st.datetimes(timezones=st.just(UTC))
steps = st.integers(min_value=0, max_value=2**63 - 1)
durations = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
texts = st.text()  # any text, newlines and control characters included
digests = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(PhaseStarted, phase=st.sampled_from(PHASES), at=times),
    st.builds(
        PhaseEnded,
        phase=st.sampled_from(PHASES),
        outcome=st.sampled_from(["succeeded", "failed", "interrupted"]),
        error=st.none() | texts,
        duration_s=durations,
        exit_code=st.none() | st.integers(min_value=-(2**31), max_value=2**31),
        signal=st.none() | st.sampled_from(["SIGKILL", "SIGTERM", "signal 34"]),
        at=times,
    ),
    st.builds(
        CheckpointSaved,
        step=steps,
        path=texts,
        size_bytes=steps,
        sha256=digests,
        duration_s=durations,
        at=times,
    ),
    st.builds(CheckpointRestored, step=steps, path=texts, at=times),
    st.builds(
        Metric,
        step=steps,
        # Any float: a diverging loss is NaN or infinite and must still be reported.
        values=st.dictionaries(texts, st.floats(), min_size=1),
        at=times,
    ),
)


@given(messages)
def test_every_message_survives_encode_and_parse(message: Message) -> None:
    line = encode(message)

    parsed = parse(line + "\n")

    assert "\n" not in line and "\r" not in line
    assert line.startswith(PREFIX)
    assert parsed is not None
    assert type(parsed) is type(message)
    # Compared as encoded text, where NaN equals NaN and every field takes part.
    assert encode(parsed) == line


def test_encoded_line_is_standard_json_after_the_prefix() -> None:
    message = Metric(step=3, values={"loss": math.nan, "grad": -math.inf}, at=AT)

    payload = json.loads(encode(message).removeprefix(PREFIX))

    assert payload == {
        "at": "2025-01-02T03:04:05.678901Z",
        "kind": "metric",
        "step": 3,
        "values": {"loss": "NaN", "grad": "-Infinity"},
    }


@pytest.mark.parametrize(
    "line",
    [
        "",
        "epoch 3 loss 0.25",
        '{"kind": "metric", "step": 1, "values": {"loss": 1.0}, "at": "2025-01-01T00:00:00Z"}',
        f" {PREFIX}" + '{"kind":"phase_started","phase":"STORING","at":"2025-01-01T00:00:00Z"}',
        PREFIX,
        PREFIX + "not json",
        PREFIX + '{"kind":"phase_started","phase":"DEPLOYING","at":"2025-01-01T00:00:00Z"}',
        PREFIX + '{"kind":"launched_rocket","at":"2025-01-01T00:00:00Z"}',
        PREFIX + '{"kind":"metric","step":1,"values":{},"at":"2025-01-01T00:00:00Z"}',
        PREFIX + '{"kind":"metric","step":-1,"values":{"a":1},"at":"2025-01-01T00:00:00Z"}',
        PREFIX + '{"kind":"phase_started","phase":"STORING","at":"2025-01-01T00:00:00"}',
    ],
    ids=[
        "empty",
        "user-output",
        "json-without-prefix",
        "indented-prefix",
        "prefix-only",
        "not-json",
        "unknown-phase",
        "unknown-kind",
        "metric-without-values",
        "negative-step",
        "naive-time",
    ],
)
def test_lines_that_carry_no_valid_message_are_ordinary_output(line: str) -> None:
    assert parse(line) is None


def test_fields_added_by_a_newer_learner_are_ignored() -> None:
    line = PREFIX + '{"kind":"phase_started","phase":"STORING","at":"2025-01-02T03:04:05Z","gpu":0}'

    assert parse(line) == PhaseStarted(
        phase="STORING", at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    )


def test_parse_accepts_crlf_line_endings() -> None:
    message = PhaseStarted(phase="PROCESSING", at=AT)

    assert parse(encode(message) + "\r\n") == message


def test_numbers_as_a_training_loop_has_them_are_reported_as_json_numbers() -> None:
    torch = pytest.importorskip("torch")
    numpy = pytest.importorskip("numpy")
    metric = Metric(step=numpy.int64(4), values={"loss": torch.tensor(0.5)}, at=AT)
    saved = CheckpointSaved(
        step=torch.tensor(7),
        path="/c",
        size_bytes=numpy.int32(3),
        sha256="0" * 64,
        duration_s=numpy.float32(0.25),
        at=AT,
    )
    assert json.loads(encode(metric)[len(PREFIX) :])["step"] == 4
    assert parse(encode(metric)) == Metric(step=4, values={"loss": 0.5}, at=AT)
    assert parse(encode(saved)) == CheckpointSaved(
        step=7, path="/c", size_bytes=3, sha256="0" * 64, duration_s=0.25, at=AT
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: Metric(step=1.5, values={"loss": 1.0}, at=AT),
        lambda: Metric(step=-1, values={"loss": 1.0}, at=AT),
        lambda: Metric(step=1, values={}, at=AT),
        lambda: Metric(step=1, values={"loss": "high"}, at=AT),
        lambda: PhaseStarted(phase="TRAINING", at=AT),
        lambda: PhaseEnded(phase="STORING", outcome="ok", duration_s=1.0, at=AT),
        lambda: PhaseEnded(phase="STORING", outcome="failed", duration_s=-1.0, at=AT),
        lambda: Metric(step=1, values={"loss": 1.0}, at=datetime(2025, 1, 1)),
    ],
)
def test_a_report_that_is_not_one_fails_where_it_is_made(make: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        make()


def test_a_time_at_any_offset_survives_encode_and_parse() -> None:
    odd = timezone(timedelta(hours=5, minutes=30, seconds=15))
    for at in (AT, AT.astimezone(odd), AT.astimezone(timezone(timedelta(hours=-3)))):
        message = CheckpointRestored(step=1, path="/c", at=at)
        parsed = parse(encode(message))
        assert parsed is not None and parsed.at == at
