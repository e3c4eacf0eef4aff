"""Vision models for inference jobs: ResNet18 and AlexNet, with random, seeded weights.

The layers are torchvision's, layer for layer, so that parameter counts, shapes and costs are
those of the published models (11,689,512 and 61,100,840 parameters). torchvision itself cannot
be used: its wheel on PyPI is built against CUDA torch and fails to load with the CPU torch the
project pins. The weights are random, drawn from a seed: no downloads, and what inference costs
does not depend on what the weights are.

To serve one, publish a single module as the model's artifact, with `module:predict` as its
entry point (`servable_source` gives the text):

    from runners.examples.vision import Classifier

    MODEL = Classifier("resnet18")
    predict = MODEL.predict

Each item is an image of shape (3, H, W), a numpy array or nested lists (224x224 as the models
were trained; AlexNet needs at least 63x63); each output is `{"class": int, "score": float}`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut; a 1x1 convolution on the shortcut where the block
    changes the shape."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        result: torch.Tensor = self.relu(out + identity)
        return result


class ResNet18(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(64, 64), BasicBlock(64, 64))
        self.layer2 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128))
        self.layer3 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256))
        self.layer4 = nn.Sequential(BasicBlock(256, 512, 2), BasicBlock(512, 512))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        # torchvision's initialisation, so that activations keep a sensible scale through the
        # layers and the random model's outputs look like a model's.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        logits: torch.Tensor = self.fc(torch.flatten(self.avgpool(x), 1))
        return logits


class AlexNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(64, 192, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(192, 384, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(0.5),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        logits: torch.Tensor = self.classifier(x)
        return logits


def _seeded(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    # A forked generator: the caller's global random state is the same after a build as before.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def resnet18(num_classes: int = 1000, seed: int = 0) -> nn.Module:
    return _seeded(lambda: ResNet18(num_classes), seed)


def alexnet(num_classes: int = 1000, seed: int = 0) -> nn.Module:
    return _seeded(lambda: AlexNet(num_classes), seed)


ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {"resnet18": resnet18, "alexnet": alexnet}


def _checked(arch: str) -> str:
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    return arch


class Classifier:
    """A model in eval mode whose `predict` is a servable entry point: images in, top-1 out."""

    def __init__(self, arch: str, *, threads: int | None = None, device: str | None = None) -> None:
        """`device`: None for the GPU when the replica was given one (the agent pins it to
        exactly its own), else the CPU."""
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = ARCHITECTURES[_checked(arch)]().eval().to(self.device)

    def predict(self, items: list[Any]) -> list[dict[str, Any]]:
        if not items:
            return []
        if all(isinstance(item, np.ndarray) for item in items):
            # Arrays are stacked without a detour through Python lists: the fast path.
            images = np.stack(items).astype(np.float32, copy=False)
        else:
            images = np.asarray(items, dtype=np.float32)
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"items must be images of shape (3, H, W), not {images.shape[1:]}")
        with torch.inference_mode():
            batch = torch.from_numpy(images).to(self.device)
            probabilities = torch.softmax(self.model(batch), dim=1)
            scores, classes = probabilities.max(dim=1)
        return [
            {"class": int(label), "score": round(float(score), 6)}
            for label, score in zip(classes.tolist(), scores.tolist(), strict=True)
        ]


def servable_source(arch: str) -> str:
    """The source of a module that serves `arch`, entry point `predict`: a model artifact."""
    return (
        "from runners.examples.vision import Classifier\n"
        "\n"
        f"MODEL = Classifier({_checked(arch)!r})\n"
        "predict = MODEL.predict\n"
    )
