"""Policies by name, with `--weight`, and from files: a bad one is refused naming its field."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from controlplane.scheduling.policy import DEFAULT, ClaimPolicy, Order, PolicyError
from sim.policy import NAMED, named, parse_weight, read_policy_file


def test_named_policies_and_weights() -> None:
    assert named("current", {}).claim == DEFAULT
    assert NAMED["fair_share"].claim == DEFAULT
    fifo = ClaimPolicy(Order.FIFO, quotas=False)
    assert named("current", {}, fifo).claim == fifo  # the operator's, as the log says it
    weighted = named("fair_share", {"b": 2.0, "a": 0.5})
    assert (weighted.claim, weighted.weights) == (DEFAULT, (("a", 0.5), ("b", 2.0)))
    assert weighted.weight("b", 1.0) == 2.0 and weighted.weight("c", 3.0) == 3.0
    assert parse_weight("acme=2.5") == ("acme", 2.5)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: named("lottery", {}), "--policy: no policy named 'lottery'"),
        (lambda: named("fifo", {"a": 2.0}), "--weight: weights apply to fair share"),
        (
            lambda: named("current", {"a": 2.0}, ClaimPolicy(Order.PRIORITY)),
            "--weight: weights apply to fair share; policy current (priority, quotas on)",
        ),
        (lambda: parse_weight("acme"), "--weight: 'acme' is not TENANT=WEIGHT"),
        (lambda: parse_weight("acme=lots"), "--weight acme: 'lots' is not a number"),
        (lambda: parse_weight("acme=0"), "--weight acme: a weight must be a finite number"),
    ],
)
def test_bad_names_and_weights_are_refused(call: Callable[[], object], message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        call()


def test_a_policy_file_in_yaml_or_json(tmp_path: Path) -> None:
    yaml_file = tmp_path / "policy.yaml"
    yaml_file.write_text("order: fair_share\nweights:\n  acme: 3\nquotas: false\n")
    policy = read_policy_file(yaml_file)
    assert (policy.name, policy.claim) == ("policy.yaml", ClaimPolicy(Order.FAIR_SHARE, False))
    assert policy.weights == (("acme", 3.0),)
    json_file = tmp_path / "fifo.json"
    json_file.write_text('{"order": "fifo"}')
    assert read_policy_file(json_file).claim == ClaimPolicy(Order.FIFO, True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"weights": {}}', "order: Field required"),
        ('{"order": "lottery"}', "order: Input should be 'fair_share', 'priority' or 'fifo'"),
        ('{"order": "fifo", "ordr": 1}', "ordr: Extra inputs are not permitted"),
        ('{"order": "fair_share", "weights": {"acme": -1}}', "weights: Value error, acme: a"),
        ('{"order": "fair_share", "weights": {"acme": "x"}}', "weights.acme: Input should be"),
        ('{"order": "fifo", "quotas": "yes"}', "quotas: Input should be a valid boolean"),
        ('{"order": "fifo", "weights": {"acme": 2}}', "weights: apply to order fair_share"),
        ('{"order": "fifo"', "policy.json:1:17: expected ',' or '}'"),
        ("[fifo]", "a policy is a mapping with an `order` field"),
    ],
)
def test_a_bad_policy_file_names_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.json"
    path.write_text(text)
    with pytest.raises(PolicyError) as refused:
        read_policy_file(path)
    assert message in str(refused.value)
    assert str(refused.value).startswith(str(path))


def test_a_missing_policy_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read it"):
        read_policy_file(tmp_path / "none.yaml")
