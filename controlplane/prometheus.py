"""OpenTelemetry metrics as the Prometheus text format (version 0.0.4), for `GET /metrics`.

Names follow OpenTelemetry's Prometheus conventions: dots become underscores, the unit is
appended (`s` as `_seconds`, `%` as `_percent`), monotonic sums are counters ending in
`_total`, other sums and gauges are gauges, and histograms have cumulative `_bucket{le=...}`
series with `_sum` and `_count`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from opentelemetry.sdk.metrics.export import Gauge, Histogram, Metric, MetricsData, Sum
from opentelemetry.util.types import Attributes

from controlplane.invariants import InvariantBroken

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_UNITS = {"s": "seconds", "ms": "milliseconds", "%": "percent", "By": "bytes"}
_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")


@dataclass
class _Family:
    kind: str
    help: str
    samples: list[str] = field(default_factory=list)


def render(data: MetricsData | None) -> str:
    """Every metric of `data` as Prometheus text; the same name from several scopes is one
    family."""
    families: dict[str, _Family] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = _kind(metric)
                if kind is None:
                    continue
                name = metric_name(metric.name, metric.unit, counter=kind == "counter")
                family = families.setdefault(name, _Family(kind, metric.description or ""))
                family.samples.extend(_samples(name, metric))
    lines: list[str] = []
    for name, family in families.items():
        lines.append(f"# HELP {name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {name} {family.kind}")
        lines.extend(family.samples)
    return "".join(f"{line}\n" for line in lines)


def metric_name(name: str, unit: str | None, *, counter: bool) -> str:
    """The Prometheus name of an OpenTelemetry instrument."""
    result = _INVALID_NAME.sub("_", name)
    suffix = _UNITS.get(unit or "")
    if suffix and not result.endswith(f"_{suffix}"):
        result = f"{result}_{suffix}"
    if counter and not result.endswith("_total"):
        result = f"{result}_total"
    return result


def _kind(metric: Metric) -> str | None:
    match metric.data:
        case Sum(is_monotonic=True):
            return "counter"
        case Sum() | Gauge():
            return "gauge"
        case Histogram():
            return "histogram"
    # Exponential histograms: no Trainyard instrument uses them.
    return None


def _samples(name: str, metric: Metric) -> Iterator[str]:
    data = metric.data
    if isinstance(data, Histogram):
        for point in data.data_points:
            cumulative = 0
            for bound, count in zip(point.explicit_bounds, point.bucket_counts, strict=False):
                cumulative += count
                yield _sample(f"{name}_bucket", point.attributes, cumulative, le=_number(bound))
            yield _sample(f"{name}_bucket", point.attributes, point.count, le="+Inf")
            yield _sample(f"{name}_sum", point.attributes, point.sum)
            yield _sample(f"{name}_count", point.attributes, point.count)
        return
    if not isinstance(data, Sum | Gauge):
        raise InvariantBroken(f"metric {name}: no text format for {type(data).__name__}")
    for number in data.data_points:
        yield _sample(name, number.attributes, number.value)


def _sample(name: str, attributes: Attributes, value: float, **extra: str) -> str:
    labels = {_INVALID_LABEL.sub("_", key): str(value) for key, value in (attributes or {}).items()}
    labels.update(extra)
    return f"{name}{_labels(labels)} {_number(value)}"


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    pairs = ",".join(f'{key}="{_escape_value(value)}"' for key, value in sorted(labels.items()))
    return "{" + pairs + "}"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _escape_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
