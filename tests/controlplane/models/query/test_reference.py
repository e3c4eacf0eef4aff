"""The reference meaning of a search query, over a few records."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controlplane.models.query.query import parse
from controlplane.models.query.reference import Record, facet_counts, search, tokens

RESNET = Record(
    name="ResNet50",
    tenant="acme",
    title="ResNet-50 image classifier",
    description="Residual network trained on ImageNet.",
    tags=("vision", "state of the art"),
    framework="pytorch",
    domains=("vision",),
    license="MIT",
    version=3,
    created=datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC),
    metrics={"accuracy": 0.91, "loss": 0.15},
)
BERT = Record(
    name="bert_base",
    tenant="acme",
    title="BERT base",
    description="Language model for text classification",
    tags=("nlp",),
    framework="tensorflow",
    domains=("nlp", "text"),
    license=None,
    version=1,
    created=datetime(2026, 12, 1, tzinfo=UTC),
    metrics={"accuracy": 0.88},
)
WHISPER = Record(
    name="whisper-small",
    tenant="globex",
    title="Whisper small",
    description="Speech recognition; image-free.",
    tags=(),
    framework="pytorch",
    domains=(),
    license="Apache-2.0",
    version=12,
    created=datetime(2026, 12, 2, 8, tzinfo=UTC),
    metrics={},
)
RECORDS = [RESNET, BERT, WHISPER]


def test_tokens_are_runs_of_letters_and_digits_lower_cased() -> None:
    assert tokens("ResNet-50, for_images; Ünïcode") == ["resnet", "50", "for", "images", "ünïcode"]


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("", [RESNET, BERT, WHISPER]),
        # Free text: every token of a word, anywhere in title, description or tags.
        ("classification", [BERT]),
        ("IMAGE", [RESNET, WHISPER]),
        ("resnet-50", [RESNET]),
        ("50-resnet", [RESNET]),
        ("imagenet residual", [RESNET]),
        ("classifiers", []),
        ("...", []),
        # A phrase: its tokens one after the other, also across a field's end.
        ('"text classification"', [BERT]),
        ('"classification text"', []),
        ('"state of the art"', [RESNET]),
        ('"imagenet vision"', [RESNET]),
        ('"image free"', [WHISPER]),
        # Names: partial ignoring case, or exact.
        ("name~RESNET", [RESNET]),
        ("name~_", [BERT]),
        ("name:resnet50", []),
        ("name:ResNet50", [RESNET]),
        # Facets are exact, case and all; a missing value matches no value.
        ("framework:pytorch", [RESNET, WHISPER]),
        ("framework:PyTorch", []),
        ("license:Apache-2.0", [WHISPER]),
        ("-license:MIT", [BERT, WHISPER]),
        ("tenant:globex", [WHISPER]),
        ("tag:vision", [RESNET]),
        ("tag:state", []),
        ('tag:"state of the art"', [RESNET]),
        # Metrics: a version without the metric never matches a comparison, but its negation.
        ("metrics.accuracy>=0.9", [RESNET]),
        ("metrics.accuracy!=0.91", [BERT]),
        ("metrics.loss<1", [RESNET]),
        ("-metrics.loss<1", [BERT, WHISPER]),
        ("metrics.accuracy=0.88", [BERT]),
        ("version>=3", [RESNET, WHISPER]),
        ("version!=3", [BERT, WHISPER]),
        # A date is its whole UTC day.
        ("created<2026-12-01", [RESNET]),
        ("created<=2026-12-01", [RESNET, BERT]),
        ("created=2026-12-01", [BERT]),
        ("created!=2026-12-01", [RESNET, WHISPER]),
        ("created>2026-12-01", [WHISPER]),
        ("created>=2026-12-01", [BERT, WHISPER]),
        ("created<=2026-11-30T23:59:59.999999Z", [RESNET]),
        ("created<2026-11-30T23:59:59.999999Z", []),
        ("created>2026-12-02T09:00+02:00", [WHISPER]),
        # Combinations.
        ("framework:pytorch image", [RESNET, WHISPER]),
        ("framework:pytorch -domain:vision", [WHISPER]),
        ("domain:nlp OR tenant:globex", [BERT, WHISPER]),
        ("(domain:nlp OR tenant:globex) -version>10", [BERT]),
        ("--tag:nlp", [BERT]),
    ],
)
def test_what_a_query_matches(query: str, found: list[Record]) -> None:
    assert search(parse(query), RECORDS) == found


def test_facets_count_the_matches_values_and_skip_the_missing_ones() -> None:
    assert facet_counts(search(parse("framework:pytorch OR tag:nlp"), RECORDS)) == {
        "framework": {"pytorch": 2, "tensorflow": 1},
        "domain": {"vision": 1, "nlp": 1, "text": 1},
        "tenant": {"acme": 2, "globex": 1},
        "license": {"MIT": 1, "Apache-2.0": 1},
    }
    assert facet_counts([]) == {"framework": {}, "domain": {}, "tenant": {}, "license": {}}
