"""The pure parts of webhooks: signatures as receivers check them, and what each attempt's
result means for its delivery (delivered, retried after a backoff, given up)."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from controlplane.webhooks.events import WebhookAttemptFailed, WebhookDelivered, WebhookFailed
from controlplane.webhooks.retries import Attempt, Result, RetryPolicy, interrupted, outcome
from controlplane.webhooks.signing import sign, verify

BODY = b'{"id":"d1","type":"JobCompleted"}'
T = 1_800_000_000
T0 = datetime(2026, 11, 22, tzinfo=UTC)


def test_the_signature_is_the_hmac_of_the_time_and_the_body() -> None:
    header = sign(["s3cret"], T, BODY)
    expected = hmac.new(b"s3cret", b"1800000000." + BODY, hashlib.sha256).hexdigest()
    assert header == f"t={T},v1={expected}"
    assert verify(header, "s3cret", BODY, now=T + 10)


@pytest.mark.parametrize(
    ("secret", "body", "at"),
    [
        ("other", BODY, T),  # another tenant's secret
        ("s3cret", BODY + b" ", T),  # a body changed on the way
        ("s3cret", BODY, T + 301),  # replayed later than the tolerance
        ("s3cret", BODY, T - 301),  # a clock far ahead
    ],
)
def test_verification_refuses(secret: str, body: bytes, at: int) -> None:
    assert not verify(sign(["s3cret"], T, BODY), secret, body, now=at)


def test_during_a_rotation_either_secret_verifies() -> None:
    header = sign(["new", "old"], T, BODY)
    assert header.count("v1=") == 2
    assert verify(header, "new", BODY, now=T) and verify(header, "old", BODY, now=T)
    assert not verify("v1=abc", "new", BODY, now=T)  # no time: refused
    with pytest.raises(ValueError, match="at least one secret"):
        sign([], T, BODY)


def test_backoff_doubles_up_to_its_cap_stretched_by_the_jitter() -> None:
    policy = RetryPolicy(first_backoff_s=5, max_backoff_s=60, jitter=0.2)
    assert [policy.backoff_s(n, 0) for n in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    assert policy.backoff_s(2, 0.5) == pytest.approx(11)
    assert policy.backoff_s(2, 0.999) < 12
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def attempt(number: int) -> Attempt:
    return Attempt(uuid4(), "JobFailed", 42, number, T0)


def test_a_2xx_is_delivered_anything_else_is_retried_then_given_up() -> None:
    policy = RetryPolicy(max_attempts=3, first_backoff_s=1, jitter=0)
    done = T0 + timedelta(seconds=2)
    assert isinstance(outcome(policy, attempt(1), Result(204, None, done), 0), WebhookDelivered)
    retried = outcome(policy, attempt(2), Result(503, "HTTP 503 Service Unavailable", done), 0)
    assert isinstance(retried, WebhookAttemptFailed)
    assert retried.retry_at == done + timedelta(seconds=2)
    assert (retried.error, retried.status, retried.job_event_position) == (
        "HTTP 503 Service Unavailable",
        503,
        42,
    )
    redirect = outcome(policy, attempt(1), Result(302, None, done), 0)
    assert isinstance(redirect, WebhookAttemptFailed) and redirect.error == "HTTP 302"
    refused = outcome(policy, attempt(3), Result(None, "connection refused", done), 0)
    assert isinstance(refused, WebhookFailed)
    assert (refused.attempt, refused.status, refused.error) == (3, None, "connection refused")
    cut = interrupted(attempt(3), done)  # the relay stopped: again at once, even the last
    assert (cut.retry_at, cut.status, cut.attempt) == (done, None, 3)
