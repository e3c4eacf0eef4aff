"""The inputs' own text, handed on by the direct path: found only where it is certainly the
inputs', refused where it may hold an infinity, and canonical (the memo's key) as before."""

from __future__ import annotations

import json

import pytest

from controlplane.deployments.inputs_text import InputsTexts, check_sent_storable, sent_inputs
from controlplane.deployments.tasks import canonical_json


@pytest.mark.parametrize(
    "body",
    [
        '{"inputs": [[0.5, 1], {"b": 2, "a": "x"}]}',
        ' {\n "inputs" :[[0.5, 1], {"b": 2, "a": "x"}] }\r\n',
    ],
)
def test_the_inputs_text_of_a_body_of_inputs_alone_is_theirs(body: str) -> None:
    sent = sent_inputs(body, json.loads(body))
    assert sent is not None
    assert json.loads(sent) == [[0.5, 1], {"b": 2, "a": "x"}]


@pytest.mark.parametrize(
    "body",
    [
        '{"inputs": [1], "no_cache": true}',  # other members
        '{"inputs": [1], "inputs": [2]}',  # the key twice: the document's is the last
        '{"\\u0069nputs": [1]}',  # the key written otherwise
        '{"inputs": [{"inputs": 1}]}',  # the key's text among the items: not told apart
        "[1]",
    ],
)
def test_a_body_of_more_or_otherwise_written_has_no_inputs_text(body: str) -> None:
    assert sent_inputs(body, json.loads(body)) is None


def test_the_sent_text_is_used_as_it_is_or_made_canonical() -> None:
    texts = InputsTexts()
    sent = '[{"b": 1.50, "a": 2}]'
    inputs = json.loads(sent)
    assert texts.text("acme", inputs, sent, canonical=False) == sent
    assert texts.text("acme", inputs, sent, canonical=True) == canonical_json(inputs)
    assert texts.text("acme", inputs, sent, canonical=True) == '[{"a":2,"b":1.5}]'  # kept
    assert texts.text("acme", inputs, None, canonical=False) == json.dumps(inputs)


@pytest.mark.parametrize("number", ["1e400", "-2E+0309", "9" * 400 + ".0"])
@pytest.mark.parametrize("canonical", [False, True])
def test_a_text_that_may_hold_an_infinity_is_refused_as_before(
    number: str, canonical: bool
) -> None:
    sent = f"[{number}]"
    with pytest.raises(ValueError):
        InputsTexts().text("acme", json.loads(sent), sent, canonical=canonical)


@pytest.mark.parametrize("number", ["1e400", "9" * 400 + ".0"])
def test_a_text_that_may_hold_an_infinity_is_refused_each_time_it_comes(number: str) -> None:
    """A kept text's canonical JSON is looked for before the scan for an infinity: such a
    text is never kept, so it is scanned, and refused, again."""
    texts = InputsTexts()
    sent = f"[{number}, 1.5]"
    for _ in range(3):
        with pytest.raises(ValueError):
            texts.text("acme", json.loads(sent), sent, canonical=True)
    fine = "[1.5, 2e10]"
    for _ in range(3):
        assert texts.text("acme", json.loads(fine), fine, canonical=True) == "[1.5,20000000000.0]"


@pytest.mark.parametrize("item", ["a\\u0000b", "\\ud800"])
def test_a_nul_or_a_lone_surrogate_is_refused_though_only_written_as_an_escape(item: str) -> None:
    sent = f'["{item}"]'
    with pytest.raises(ValueError):
        check_sent_storable(json.loads(sent), sent)
    check_sent_storable(json.loads('["ab", 1.5]'), '["ab", 1.5]')  # nothing to find
