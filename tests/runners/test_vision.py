"""The vision models match torchvision's layouts and are deterministic; generated inputs depend
on (seed, index) alone; the servable module they publish predicts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from runners.examples.vision import Classifier, alexnet, resnet18, servable_source
from runners.inputs import generated, generated_batch

# Small images keep the forward passes fast; AlexNet's smallest input is 63x63.
SMALL = (3, 64, 64)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # One thread: the same operations on the same data give the same bits, and the tests do not
    # compete with each other for cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def parameters(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def images(count: int, seed: int = 0) -> np.ndarray:
    return np.stack(generated_batch(SMALL, seed, 0, count))


@pytest.mark.parametrize(
    ("build", "expected"),
    [(resnet18, 11_689_512), (alexnet, 61_100_840)],
    ids=["resnet18", "alexnet"],
)
def test_parameter_counts_equal_torchvisions(build: Callable[[], nn.Module], expected: int) -> None:
    assert parameters(build()) == expected


@pytest.mark.parametrize("arch", ["resnet18", "alexnet"])
def test_predict_gives_a_class_and_a_probability_per_image(arch: str) -> None:
    outputs = Classifier(arch).predict(list(images(2)))
    assert len(outputs) == 2
    for output in outputs:
        assert set(output) == {"class", "score"}
        assert isinstance(output["class"], int) and 0 <= output["class"] < 1000
        assert isinstance(output["score"], float) and 0 < output["score"] <= 1


def test_predict_takes_nested_lists_like_arrays() -> None:
    classifier = Classifier("resnet18")
    batch = list(images(2))
    assert classifier.predict([image.tolist() for image in batch]) == classifier.predict(batch)
    assert classifier.predict([]) == []


def test_predict_rejects_what_is_not_an_image() -> None:
    with pytest.raises(ValueError, match=r"shape \(3, H, W\)"):
        Classifier("resnet18").predict([np.zeros((1, 64, 64), dtype=np.float32)])


def test_an_unknown_architecture_is_named() -> None:
    with pytest.raises(ValueError, match="'vgg16'"):
        Classifier("vgg16")
    with pytest.raises(ValueError, match="'vgg16'"):
        servable_source("vgg16")


def test_the_same_seed_gives_the_same_model() -> None:
    batch = torch.from_numpy(images(2))
    first, second = resnet18(seed=3).eval(), resnet18(seed=3).eval()
    with torch.inference_mode():
        assert torch.equal(first(batch), second(batch))
    weights, others = first.state_dict(), resnet18(seed=4).state_dict()
    assert not torch.equal(weights["fc.weight"], others["fc.weight"])
    assert not torch.equal(weights["conv1.weight"], others["conv1.weight"])


def test_building_leaves_the_global_generator_alone() -> None:
    state = torch.get_rng_state()
    alexnet(seed=5)
    assert torch.equal(torch.get_rng_state(), state)


def test_generated_items_depend_on_seed_and_index_alone() -> None:
    item = generated((3, 8, 8), seed=1, index=7)
    assert item.dtype == np.float32 and item.shape == (3, 8, 8)
    assert np.array_equal(item, generated([3, 8, 8], seed=1, index=7))
    assert not np.array_equal(item, generated((3, 8, 8), seed=1, index=8))
    assert not np.array_equal(item, generated((3, 8, 8), seed=2, index=7))


def test_a_batch_holds_the_items_of_its_indices() -> None:
    batch = generated_batch((4,), seed=9, first=3, count=2)
    assert len(batch) == 2
    for item, index in zip(batch, (3, 4), strict=True):
        assert np.array_equal(item, generated((4,), seed=9, index=index))


@pytest.mark.parametrize(
    ("shape", "problem"),
    [
        ((), "0 dimensions"),
        ((1, 1, 1, 1, 1), "5 dimensions"),
        ((3, 0), "not a positive integer"),
        ((3, -2), "not a positive integer"),
        ((3, 2.5), "not a positive integer"),
        ((1 << 12, 1 << 12, 2), "33554432 elements"),
    ],
)
def test_a_bad_shape_is_refused(shape: tuple[Any, ...], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        generated(shape, seed=0, index=0)


def test_negative_seeds_and_indices_are_refused() -> None:
    with pytest.raises(ValueError, match="seed"):
        generated((2,), seed=-1, index=0)
    with pytest.raises(ValueError, match="index"):
        generated((2,), seed=0, index=-1)
    with pytest.raises(ValueError, match="count"):
        generated_batch((2,), seed=0, first=0, count=-1)


def test_the_servable_source_predicts() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(servable_source("resnet18"), "servable.py", "exec"), namespace)
    outputs = namespace["predict"](generated_batch(SMALL, 0, 0, 2))
    assert len(outputs) == 2 and all(0 <= output["class"] < 1000 for output in outputs)
