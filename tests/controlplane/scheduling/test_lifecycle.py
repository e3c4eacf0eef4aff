"""The scheduling stream's decisions, pure: a switch is one event, setting the policy in force
none, and the policy folds from the events (the default before any); a policy file states a
policy or is refused naming its line or field."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.memory import InMemoryEventStore
from controlplane.events.metadata import Metadata
from controlplane.refusals import Refusal
from controlplane.scheduling.events import SchedulingPolicySet
from controlplane.scheduling.lifecycle import POLICY, SetPolicy, decide, evolve
from controlplane.scheduling.policy import DEFAULT, ClaimPolicy, Order, PolicyError, read_policy
from controlplane.scheduling.streams import POLICY_STREAM

AT = datetime(2026, 3, 1, 9, tzinfo=UTC)
FIFO = ClaimPolicy(Order.FIFO, quotas=False)


def test_a_switch_is_one_event_and_the_policy_in_force_none() -> None:
    [event] = decide(SetPolicy(FIFO, "admin", "night batch", AT), DEFAULT)
    assert event == SchedulingPolicySet(
        order=Order.FIFO, quotas=False, actor="admin", reason="night batch", at=AT
    )
    assert evolve(DEFAULT, event) == FIFO
    assert decide(SetPolicy(FIFO, "admin", None, AT), FIFO) == []
    assert decide(SetPolicy(DEFAULT, "admin", None, AT), DEFAULT) == []
    # Quotas alone make another policy.
    assert len(decide(SetPolicy(ClaimPolicy(Order.FIFO), "admin", None, AT), FIFO)) == 1


def test_the_policy_folds_from_the_stream_the_default_before_any() -> None:
    priority = SchedulingPolicySet(order=Order.PRIORITY, quotas=True, actor="a", at=AT)
    fifo = SchedulingPolicySet(order=Order.FIFO, quotas=False, actor="b", at=AT)
    assert POLICY.fold(POLICY.initial, []) == DEFAULT
    assert POLICY.fold(POLICY.initial, [priority, fifo]) == FIFO


async def test_switching_twice_to_the_same_policy_appends_once() -> None:
    store = InMemoryEventStore(EVENT_REGISTRY)
    metadata = Metadata(actor="admin")
    first = await POLICY.execute(store, POLICY_STREAM, SetPolicy(FIFO, "admin", None, AT), metadata)
    again = await POLICY.execute(
        store, POLICY_STREAM, SetPolicy(FIFO, "admin", "again", AT), metadata
    )
    assert first.appended is not None and again.appended is None
    assert [r.event for r in await store.read_stream(POLICY_STREAM)] == first.events
    assert again.state == FIFO


def test_a_busy_stream_is_a_conflict() -> None:
    refusal = POLICY.busy(POLICY_STREAM, 10)
    assert isinstance(refusal, Refusal) and refusal.kind.value == "conflict"


def test_a_policy_file_in_yaml_or_json(tmp_path: Path) -> None:
    yaml_file = tmp_path / "fifo.yaml"
    yaml_file.write_text("order: fifo\nquotas: false\n")
    assert read_policy(yaml_file) == FIFO
    json_file = tmp_path / "priority.json"
    json_file.write_text('{"order": "priority"}')
    assert read_policy(json_file) == ClaimPolicy(Order.PRIORITY, quotas=True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("quotas: false\n", "order: Field required"),
        ("order: lottery\n", "order: Input should be 'fair_share', 'priority' or 'fifo'"),
        ("order: fifo\nquotas: maybe\n", "quotas: Input should be a valid boolean"),
        ("order: fifo\nordr: 1\n", "ordr: Extra inputs are not permitted"),
        ("order: fair_share\nweights: {acme: 2}\n", "weights: a tenant's weight is its own"),
        ("order: [fifo\n", "policy.yaml:2:1:"),
        ("- fifo\n", "a policy is a mapping with an `order` field"),
    ],
)
def test_a_bad_policy_file_is_refused_naming_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as refused:
        read_policy(path)
    assert str(refused.value).startswith(f"{path}") and message in str(refused.value)


def test_a_missing_or_binary_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read it"):
        read_policy(tmp_path / "none.yaml")
    binary = tmp_path / "policy.bin"
    binary.write_bytes(b"\xff\xfe\x00order")
    with pytest.raises(PolicyError, match="not text"):
        read_policy(binary)
