"""The registry benchmark's data, shared by its Trainyard and MLflow halves: `generate` makes
model versions with realistic metadata (deterministic for a seed), `CASES` are the searches both
halves run, and `expected` is what each must find, by the reference evaluation of the query
language (`controlplane.models.query.reference`).

Free text agrees between the reference and Postgres's English text search only within the
limits `reference` states, so the words the cases search for are ones Postgres neither drops
(stop words) nor stems onto another word of the corpus (`segmentation` is `segment` there, and
no `segment`, `segments` or `segmented` occurs), and every phrase searched for is made of such
words, never split by a hyphen.

A version has one or two domains, the first always one of PRIMARY_DOMAINS and a second one of
SECONDARY_DOMAINS; `domain:X` matches either, and the facet counts each.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

from controlplane.models.query.query import parse
from controlplane.models.query.reference import Record, search


@dataclass(frozen=True, slots=True)
class VersionSpec:
    """One model version to publish: `metadata` passes `validate_metadata`."""

    tenant: str
    name: str
    version: int
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SearchCase:
    """One search of the benchmark, in Trainyard's query language."""

    label: str
    kind: Literal["text", "partial", "range", "facet"]
    query: str


@dataclass(frozen=True, slots=True)
class _Task:
    domain: str
    title: str
    archs: tuple[str, ...]
    datasets: tuple[str, ...]
    tags: tuple[str, ...]
    input: dict[str, Any]
    output: dict[str, Any]
    metrics: tuple[str, ...]


def _array(dtype: str, *shape: int | None, what: str) -> dict[str, Any]:
    return {"type": "ndarray", "dtype": dtype, "shape": list(shape), "description": what}


_IMAGE = _array("float32", None, 3, 224, 224, what="RGB images, normalised")
_AUDIO = _array("float32", None, 16000, what="one second of 16 kHz mono audio")
_TEXT = {"type": "string", "description": "UTF-8 text"}
_ROWS = _array("float32", None, 64, what="feature rows")
_GRAPH = {"type": "json", "description": "a graph: nodes, edges and their features"}
_CLASSIFY = ("accuracy", "loss", "f1")

TASKS = (
    _Task(
        "vision", "image classifier", ("resnet", "efficientnet", "vit", "convnext"),
        ("ImageNet", "CIFAR100", "iNaturalist"), ("classification", "imagenet", "cnn"),
        _IMAGE, _array("float32", None, 1000, what="class logits"), _CLASSIFY,
    ),
    _Task(
        "vision", "object detector", ("yolo", "detr", "retinanet"),
        ("COCO", "OpenImages", "Pascal VOC"), ("detection", "bounding-boxes", "coco"),
        _IMAGE, {"type": "json", "description": "boxes, labels and scores"}, _CLASSIFY,
    ),
    _Task(
        "vision", "semantic segmentation", ("unet", "deeplab", "segformer"),
        ("Cityscapes", "ADE20K", "Pascal VOC"), ("segmentation", "dense-prediction", "masks"),
        _IMAGE, _array("int64", None, 224, 224, what="a class per pixel"), _CLASSIFY,
    ),
    _Task(
        "vision", "depth estimator", ("dpt", "midas"),
        ("NYU Depth", "KITTI"), ("depth", "monocular", "3d"),
        _IMAGE, _array("float32", None, 224, 224, what="metres per pixel"), ("loss", "rmse"),
    ),
    _Task(
        "language", "sentiment classifier", ("bert", "roberta", "distilbert"),
        ("SST2", "IMDB", "Yelp"), ("sentiment", "classification", "reviews"),
        _TEXT, {"type": "json", "description": "label and score"}, _CLASSIFY,
    ),
    _Task(
        "language", "entity tagger", ("bert", "roberta", "bilstm"),
        ("CoNLL", "OntoNotes"), ("ner", "tokens", "spans"),
        _TEXT, {"type": "list", "description": "entity spans"}, _CLASSIFY,
    ),
    _Task(
        "language", "text summarizer", ("bart", "pegasus", "t5"),
        ("CNN DailyMail", "XSum", "arXiv"), ("summarization", "seq2seq", "abstractive"),
        _TEXT, _TEXT, ("loss", "rouge"),
    ),
    _Task(
        "language", "machine translation", ("transformer", "marian", "t5"),
        ("WMT", "OPUS", "FLORES"), ("translation", "seq2seq", "multilingual"),
        _TEXT, _TEXT, ("loss", "bleu"),
    ),
    _Task(
        "speech", "speech recognizer", ("wav2vec", "whisper", "conformer"),
        ("LibriSpeech", "Common Voice", "TEDLIUM"), ("asr", "transcription", "audio"),
        _AUDIO, _TEXT, ("loss", "wer"),
    ),
    _Task(
        "speech", "keyword spotter", ("crnn", "matchboxnet"),
        ("Speech Commands",), ("keywords", "audio", "streaming"),
        _AUDIO, _array("float32", None, 35, what="keyword logits"), _CLASSIFY,
    ),
    _Task(
        "speech", "speaker verification", ("ecapa", "xvector"),
        ("VoxCeleb",), ("speaker", "embeddings", "audio"),
        _AUDIO, _array("float32", None, 192, what="speaker embeddings"), _CLASSIFY,
    ),
    _Task(
        "tabular", "churn predictor", ("xgboost", "lightgbm", "tabnet"),
        ("Telco", "KKBox"), ("churn", "gradient-boosting", "customers"),
        _ROWS, _array("float32", None, what="churn probability"), _CLASSIFY,
    ),
    _Task(
        "tabular", "fraud detector", ("xgboost", "catboost", "tabnet"),
        ("IEEE CIS", "PaySim"), ("fraud", "anomaly", "transactions"),
        _ROWS, _array("float32", None, what="fraud probability"), _CLASSIFY,
    ),
    _Task(
        "tabular", "demand forecaster", ("lstm", "tft", "nbeats"),
        ("M5", "Favorita"), ("forecasting", "timeseries", "retail"),
        _array("float32", None, 90, 8, what="past days of features"),
        _array("float32", None, 28, what="demand per day ahead"), ("loss", "mae"),
    ),
    _Task(
        "graph", "molecule property predictor", ("gcn", "gin", "schnet"),
        ("QM9", "ZINC", "MoleculeNet"), ("chemistry", "molecules", "gnn"),
        _GRAPH, _array("float32", None, 12, what="predicted properties"), ("loss", "mae"),
    ),
    _Task(
        "graph", "link predictor", ("graphsage", "gat"),
        ("OGB", "Cora"), ("links", "recommendation", "gnn"),
        _GRAPH, _array("float32", None, what="link scores"), _CLASSIFY,
    ),
)  # fmt: skip
"""What the models do: each model is one task, in one primary domain, with one architecture."""

PRIMARY_DOMAINS = ("vision", "language", "speech", "tabular", "graph")
SECONDARY_DOMAINS = (
    "medicine", "astronomy", "materials science", "agriculture", "finance", "climate", "robotics",
)  # fmt: skip
_DOMAIN_WEIGHTS = {"vision": 0.34, "language": 0.26, "speech": 0.14, "tabular": 0.16, "graph": 0.1}

_FRAMEWORKS = {
    # Per domain: framework and weight (but see _ARCH_FRAMEWORK).
    "vision": (("pytorch", 60), ("tensorflow", 14), ("jax", 8), ("keras", 8), ("onnx", 10)),
    "language": (("pytorch", 64), ("tensorflow", 12), ("jax", 12), ("onnx", 12)),
    "speech": (("pytorch", 70), ("tensorflow", 10), ("jax", 8), ("onnx", 12)),
    "tabular": (("pytorch", 70), ("tensorflow", 15), ("scikit-learn", 15)),
    "graph": (("pytorch", 70), ("jax", 15), ("tensorflow", 15)),
}
_ARCH_FRAMEWORK = {"xgboost": "xgboost", "lightgbm": "other", "catboost": "other"}
"""Gradient-boosted trees are built with their own libraries, whatever their domain's usual."""
_REQUIREMENTS = {
    "pytorch": ("torch>=2.1", "torchvision>=0.16"),
    "tensorflow": ("tensorflow>=2.15",),
    "keras": ("keras>=3.0",),
    "jax": ("jax>=0.4.20", "flax>=0.8"),
    "onnx": ("onnxruntime>=1.17",),
    "xgboost": ("xgboost>=2.0", "pandas>=2.1"),
    "scikit-learn": ("scikit-learn>=1.4", "pandas>=2.1"),
    "other": ("lightgbm>=4.1", "pandas>=2.1"),
}
LICENSES = ("MIT", "Apache-2.0", "BSD-3-Clause", "CC-BY-4.0")
_LICENSE_WEIGHTS = (30, 40, 15, 15)
_GENERAL_TAGS = (
    "pretrained", "finetuned", "baseline", "production", "experimental", "distilled", "edge",
    "benchmark", "reproducible", "gpu", "cpu", "batch", "realtime", "onnx-export",
)  # fmt: skip
_FIRST = (
    "Ada", "Wei", "Priya", "Lucas", "Amara", "Kenji", "Sofia", "Omar", "Ingrid", "Mateo", "Yuki",
    "Chidi", "Elena", "Ravi", "Hana", "Tomas", "Leila", "Noah", "Zara", "Diego",
)  # fmt: skip
_LAST = (
    "Okafor", "Chen", "Sharma", "Moreau", "Nakamura", "Haddad", "Lindqvist", "Garcia", "Kim",
    "Novak", "Rossi", "Mensah", "Petrov", "Tanaka", "Silva", "Weber", "Kowalski", "Ibrahim",
)  # fmt: skip
_AFFILIATIONS = (
    "University of Chicago", "Argonne National Laboratory", "ETH Zurich", "University of Tokyo",
    "Max Planck Institute", "Stanford University", "Indian Institute of Science", None, None,
)  # fmt: skip
_ARCH_NAMES = {
    "resnet": "ResNet", "efficientnet": "EfficientNet", "vit": "ViT", "convnext": "ConvNeXt",
    "yolo": "YOLO", "detr": "DETR", "retinanet": "RetinaNet", "unet": "UNet",
    "deeplab": "DeepLab", "segformer": "SegFormer", "dpt": "DPT", "midas": "MiDaS",
    "bert": "BERT", "roberta": "RoBERTa", "distilbert": "DistilBERT", "bilstm": "BiLSTM",
    "bart": "BART", "pegasus": "PEGASUS", "t5": "T5", "transformer": "Transformer",
    "marian": "Marian", "wav2vec": "wav2vec", "whisper": "Whisper", "conformer": "Conformer",
    "crnn": "CRNN", "matchboxnet": "MatchboxNet", "ecapa": "ECAPA", "xvector": "xvector",
    "xgboost": "XGBoost", "lightgbm": "LightGBM", "tabnet": "TabNet", "catboost": "CatBoost",
    "lstm": "LSTM", "tft": "TFT", "nbeats": "NBEATS", "gcn": "GCN", "gin": "GIN",
    "schnet": "SchNet", "graphsage": "GraphSAGE", "gat": "GAT",
}  # fmt: skip
_NOTES = (
    "Trained with mixed precision on eight GPUs.",
    "Hyperparameters were tuned with a random search over forty trials.",
    "Evaluated on a held out split drawn from the same distribution.",
    "Augmentation and label smoothing reduce overfitting on small subsets.",
    "Checkpoints are averaged over the last five epochs.",
    "Calibrated with temperature scaling after training.",
)


def generate(
    models: int = 1000, versions_per_model: int = 10, tenants: int = 3, seed: int = 0
) -> list[VersionSpec]:
    """`models` models of `versions_per_model` versions each (numbered from 1), spread over
    `tenants` tenants (`bench-a`, `bench-b`, ...), in publication order: a model's versions in
    order, model after model. The same arguments give the same list."""
    if not 1 <= tenants <= 26:
        raise ValueError("tenants: 1 to 26")
    rng = random.Random(seed)
    tenant_names = [f"bench-{chr(ord('a') + i)}" for i in range(tenants)]
    specs: list[VersionSpec] = []
    for index in range(models):
        model = _model(rng, index)
        tenant = tenant_names[index % tenants]
        for version in range(1, versions_per_model + 1):
            metadata = _version(rng, model, version)
            specs.append(VersionSpec(tenant, model["name"], version, metadata))
    return specs


def _model(rng: random.Random, index: int) -> dict[str, Any]:
    """What a model's versions share."""
    domain = rng.choices(PRIMARY_DOMAINS, [_DOMAIN_WEIGHTS[d] for d in PRIMARY_DOMAINS])[0]
    task = rng.choice([t for t in TASKS if t.domain == domain])
    arch = rng.choice(task.archs)
    frameworks, weights = zip(*_FRAMEWORKS[domain], strict=True)
    # A second domain on half the models: where the model is applied.
    domains = [domain] + ([rng.choice(SECONDARY_DOMAINS)] if rng.random() < 0.5 else [])
    return {
        "name": f"{arch}-{domain}-{index:04d}",
        "task": task,
        "arch": arch,
        "domains": domains,
        "framework": _ARCH_FRAMEWORK.get(arch) or rng.choices(frameworks, weights)[0],
        "license": rng.choices(LICENSES, _LICENSE_WEIGHTS)[0],
        "creators": [_creator(rng) for _ in range(rng.choice((1, 1, 2, 2, 3)))],
        "dataset": rng.choice(task.datasets),
        "tags": rng.sample(task.tags, 2),
        # How good the first version is; later versions improve on it.
        "skill": rng.uniform(0.70, 0.93),
        "doi": f"10.5281/zenodo.{rng.randrange(1_000_000, 9_999_999)}",
    }


def _version(rng: random.Random, model: dict[str, Any], version: int) -> dict[str, Any]:
    task: _Task = model["task"]
    arch_name = _ARCH_NAMES[model["arch"]]
    quantized = rng.random() < 0.15
    tags = list(model["tags"]) + rng.sample(_GENERAL_TAGS, rng.randint(0, 4))
    if quantized:
        tags.append("int8")
    application = model["domains"][1] if len(model["domains"]) > 1 else "general use"
    sentences = [
        f"{_article(arch_name)} {arch_name} {task.title} trained on {model['dataset']} "
        f"for {application}.",
        f"Version {version} of the {model['name']} series.",
        rng.choice(_NOTES),
    ]
    if quantized:
        sentences.append("Weights quantized to int8 for deployment on small devices.")
    framework = model["framework"]
    module = model["name"].replace("-", "_")
    metadata: dict[str, Any] = {
        "title": f"{arch_name} {task.title} ({model['dataset']}) v{version}",
        "description": " ".join(sentences),
        # Copies, so that no two versions share a list or mapping that one could change.
        "creators": copy.deepcopy(model["creators"]),
        "license": model["license"],
        "citation": {"doi": model["doi"]},
        "domains": list(model["domains"]),
        "tags": tags,
        "framework": framework,
        "servable": {
            "entry_point": f"{module}.serve:predict",
            "input": copy.deepcopy(task.input),
            "output": copy.deepcopy(task.output),
            "requirements": list(_REQUIREMENTS[framework]),
        },
        "metrics": _metrics(rng, task, model["skill"], version),
    }
    if rng.random() < 0.6:
        metadata["provenance"] = {
            "job_id": str(UUID(int=rng.getrandbits(128), version=4)),
            "attempt": rng.choice((1, 1, 1, 2)),
            "checkpoint_step": rng.randrange(1_000, 200_000, 1_000),
        }
    return metadata


def _article(word: str) -> str:
    return "An" if word[0] in "AEIOUXaeioux" else "A"  # an XGBoost, an xvector


def _metrics(rng: random.Random, task: _Task, skill: float, version: int) -> dict[str, float]:
    # Each version a little better than the one before, with noise; the loss falls as the
    # accuracy rises.
    accuracy = min(0.995, skill + 0.006 * (version - 1) + rng.gauss(0, 0.01))
    values = {
        "accuracy": accuracy,
        "f1": accuracy - rng.uniform(0.005, 0.04),
        "loss": (1 - accuracy) * rng.uniform(0.35, 0.9),
        "rmse": 0.2 + (1 - accuracy) * rng.uniform(1.0, 2.0),
        "rouge": accuracy * rng.uniform(0.4, 0.5),
        "bleu": accuracy * rng.uniform(28, 40),
        "wer": (1 - accuracy) * rng.uniform(0.3, 0.6),
        "mae": (1 - accuracy) * rng.uniform(0.5, 3.0),
    }
    return {name: round(values[name], 4) for name in task.metrics}


def _creator(rng: random.Random) -> dict[str, Any]:
    creator: dict[str, Any] = {"name": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"}
    affiliation = rng.choice(_AFFILIATIONS)
    if affiliation is not None:
        creator["affiliation"] = affiliation
    if rng.random() < 0.4:
        creator["orcid"] = _orcid(rng)
    return creator


def _orcid(rng: random.Random) -> str:
    digits = "".join(str(rng.randrange(10)) for _ in range(15))
    # ISO 7064 MOD 11-2, the check digit ORCID iDs end with (the schema checks it).
    total = 0
    for digit in digits:
        total = (total + int(digit)) * 2
    check = (12 - total % 11) % 11
    last = "X" if check == 10 else str(check)
    whole = digits + last
    return "-".join(whole[at : at + 4] for at in range(0, 16, 4))


CASES: tuple[SearchCase, ...] = (
    SearchCase("text-word", "text", "segmentation"),
    SearchCase("text-phrase", "text", '"image classifier"'),
    SearchCase("text-words", "text", "quantized speech"),
    SearchCase("partial-prefix", "partial", "name~vision-00"),
    SearchCase("partial-family", "partial", "name~bert"),
    SearchCase("partial-suffix", "partial", "name~former"),
    SearchCase("range-accuracy", "range", "metrics.accuracy>=0.95"),
    SearchCase("range-loss-facet", "range", "metrics.loss<0.03 framework:pytorch"),
    SearchCase("range-f1-version", "range", "metrics.f1>0.93 version>=8"),
    SearchCase("facet-framework", "facet", "framework:jax"),
    SearchCase("facet-license-domain", "facet", "license:MIT domain:vision"),
    SearchCase("facet-or", "facet", "license:BSD-3-Clause (domain:speech OR domain:graph)"),
)
"""The searches, three of each kind; each finds between 0.1 % and 20 % of the default data."""

CREATED = datetime(2026, 11, 1, tzinfo=UTC)
"""The publication time `expected` gives every version: no case searches by time."""


def record(spec: VersionSpec, created: datetime = CREATED) -> Record:
    """The version as the reference evaluation sees it."""
    metadata = spec.metadata
    domains: list[str] = metadata.get("domains", [])
    return Record(
        name=spec.name,
        tenant=spec.tenant,
        title=metadata["title"],
        description=metadata.get("description", ""),
        tags=tuple(metadata.get("tags", ())),
        framework=metadata["framework"],
        domains=tuple(domains),
        license=metadata.get("license", "NOASSERTION"),
        version=spec.version,
        created=created,
        metrics=dict(metadata.get("metrics", {})),
    )


def key(record: Record) -> tuple[str, str, int]:
    """How both halves name a version in their results."""
    return (record.tenant, record.name, record.version)


def expected(
    specs: Iterable[VersionSpec] | Sequence[Record], case: SearchCase
) -> set[tuple[str, str, int]]:
    """The (tenant, name, version) of each version the case's query matches."""
    records = [item if isinstance(item, Record) else record(item) for item in specs]
    return {key(found) for found in search(parse(case.query), records)}
