"""A replay's report: its figures and the recorded past's (see `metrics.py`), and how far apart
they are, as JSON or as a table. The same workload and policy give the same bytes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sim.metrics import (
    available_gpu_seconds,
    jain_fairness,
    percentile,
    span,
    start_order_agreement,
    used_gpu_seconds,
    waits,
)
from sim.policy import Policy
from sim.workload import Outcome, TenantSet, Workload

DIGITS = 6


@dataclass(frozen=True, slots=True)
class TenantFigures:
    jobs: int
    started: int
    wait_p50_s: float | None
    wait_p95_s: float | None


@dataclass(frozen=True, slots=True)
class Figures:
    jobs: int
    started: int
    finished: int
    makespan_s: float | None
    gpu_utilization: float | None
    jain_fairness: float | None
    tenants: tuple[tuple[str, TenantFigures], ...]


@dataclass(frozen=True, slots=True)
class Comparison:
    jobs_compared: int
    """Jobs of the window that both the replay and the past claimed."""
    start_order_agreement: float | None
    start_time_error: float | None


@dataclass(frozen=True, slots=True)
class Report:
    policy: Policy
    since: datetime
    until: datetime | None
    replayed_from: datetime
    release_delay_s: float
    simulated: Figures
    recorded: Figures
    comparison: Comparison


def report(workload: Workload, policy: Policy, simulated: Sequence[Outcome]) -> Report:
    origin = workload.origin
    recorded_weights: dict[str, float] = {}
    for timed in workload.changes:
        if isinstance(timed.change, TenantSet):
            recorded_weights[timed.change.name] = timed.change.weight
    weights = {name: policy.weight(name, w) for name, w in recorded_weights.items()}
    real_figures = figures(workload, workload.recorded, weights)
    real_span = span([o for o in workload.recorded if workload.reported(o)])
    return Report(
        policy=policy,
        since=origin + timedelta(seconds=workload.since),
        until=None if workload.until is None else origin + timedelta(seconds=workload.until),
        replayed_from=origin,
        release_delay_s=workload.release_delay_s,
        simulated=figures(workload, simulated, weights),
        recorded=real_figures,
        comparison=compare(workload, simulated, real_span),
    )


def figures(workload: Workload, outcomes: Sequence[Outcome], weights: dict[str, float]) -> Figures:
    """The figures of the window's jobs among `outcomes` (all of them count towards the GPUs
    used, the jobs replayed from before the window too)."""
    reported = [o for o in outcomes if workload.reported(o)]
    window = span(reported)
    utilization = fairness = makespan = None
    if window is not None:
        makespan = window[1] - window[0]
        offered = available_gpu_seconds(workload.changes, window)
        utilization = used_gpu_seconds(outcomes, window) / offered if offered else None
        fairness = jain_fairness(reported, outcomes, weights, window)
    tenants = []
    for tenant in sorted({o.tenant for o in reported}):
        own = [o for o in reported if o.tenant == tenant]
        waited = waits(own)
        tenants.append(
            (
                tenant,
                TenantFigures(
                    len(own), len(waited), percentile(waited, 0.5), percentile(waited, 0.95)
                ),
            )
        )
    return Figures(
        jobs=len(reported),
        started=sum(o.start is not None for o in reported),
        finished=sum(o.end is not None for o in reported),
        makespan_s=makespan,
        gpu_utilization=utilization,
        jain_fairness=fairness,
        tenants=tuple(tenants),
    )


def compare(
    workload: Workload, simulated: Sequence[Outcome], real_span: tuple[float, float] | None
) -> Comparison:
    pairs = [
        (real, mine)
        for real, mine in zip(workload.recorded, simulated, strict=True)
        if workload.reported(real) and real.start is not None and mine.start is not None
    ]
    orders = [(real.order, mine.order) for real, mine in pairs]
    error = None
    if pairs and real_span is not None and real_span[1] > real_span[0]:
        total = sum(abs(_start(mine) - _start(real)) for real, mine in pairs)
        error = total / len(pairs) / (real_span[1] - real_span[0])
    return Comparison(
        jobs_compared=len(pairs),
        start_order_agreement=start_order_agreement(
            [(real, mine) for real, mine in orders if real is not None and mine is not None]
        ),
        start_time_error=error,
    )


def _start(outcome: Outcome) -> float:
    return outcome.start if outcome.start is not None else outcome.submitted


def as_json(report: Report) -> dict[str, Any]:
    sim, real = report.simulated, report.recorded
    return {
        "policy": report.policy.describe(),
        "window": {
            "since": report.since.isoformat(),
            "until": None if report.until is None else report.until.isoformat(),
            "replayed_from": report.replayed_from.isoformat(),
        },
        "release_delay_s": _round(report.release_delay_s),
        "simulated": _figures(sim),
        "recorded": _figures(real),
        "difference": {
            "jobs_compared": report.comparison.jobs_compared,
            "start_order_agreement": _round(report.comparison.start_order_agreement),
            "start_time_error": _round(report.comparison.start_time_error),
            "makespan_s": _minus(sim.makespan_s, real.makespan_s),
            "gpu_utilization": _minus(sim.gpu_utilization, real.gpu_utilization),
            "jain_fairness": _minus(sim.jain_fairness, real.jain_fairness),
            "tenants": {
                name: {
                    "wait_p50_s": _minus(mine.wait_p50_s, theirs.wait_p50_s),
                    "wait_p95_s": _minus(mine.wait_p95_s, theirs.wait_p95_s),
                }
                for (name, mine), (_, theirs) in zip(sim.tenants, real.tenants, strict=True)
            },
        },
    }


def dumps(report: Report) -> str:
    """The report as one JSON line: what `trainyard simulate --json` prints."""
    return json.dumps(as_json(report), sort_keys=True)


def _figures(figures: Figures) -> dict[str, Any]:
    return {
        "jobs": figures.jobs,
        "started": figures.started,
        "finished": figures.finished,
        "makespan_s": _round(figures.makespan_s),
        "gpu_utilization": _round(figures.gpu_utilization),
        "jain_fairness": _round(figures.jain_fairness),
        "tenants": {
            name: {
                "jobs": t.jobs,
                "started": t.started,
                "wait_p50_s": _round(t.wait_p50_s),
                "wait_p95_s": _round(t.wait_p95_s),
            }
            for name, t in figures.tenants
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, DIGITS)


def _minus(mine: float | None, theirs: float | None) -> float | None:
    return None if mine is None or theirs is None else round(mine - theirs, DIGITS)


def as_table(report: Report) -> str:
    """The report for a terminal."""
    sim, real, comparison = report.simulated, report.recorded, report.comparison
    policy = report.policy.describe()
    weights = ", ".join(f"{name}={w:g}" for name, w in policy["weights"].items())
    until = report.until.isoformat() if report.until is not None else "the log's end"
    lines = [
        f"policy {policy['name']}: order {policy['order']}, quotas "
        f"{'on' if policy['quotas'] else 'off'}" + (f", weights {weights}" if weights else ""),
        f"jobs submitted from {report.since.isoformat()} until {until}: {real.jobs} "
        f"(replayed from {report.replayed_from.isoformat()}; GPUs held "
        f"{report.release_delay_s:.3f} s past each attempt, as recorded)",
        "",
        f"{'':<24}{'simulated':>12}{'recorded':>12}{'difference':>12}",
    ]
    rows: list[tuple[str, float | None, float | None]] = [
        ("jobs started", sim.started, real.started),
        ("jobs finished", sim.finished, real.finished),
        ("makespan (s)", sim.makespan_s, real.makespan_s),
        ("GPU utilization", sim.gpu_utilization, real.gpu_utilization),
        ("Jain's fairness", sim.jain_fairness, real.jain_fairness),
    ]
    for (name, own), (_, recorded) in zip(sim.tenants, real.tenants, strict=True):
        rows.append((f"{name}: wait p50 (s)", own.wait_p50_s, recorded.wait_p50_s))
        rows.append((f"{name}: wait p95 (s)", own.wait_p95_s, recorded.wait_p95_s))
    for label, mine, theirs in rows:
        lines.append(
            f"{label:<24}{_cell(mine):>12}{_cell(theirs):>12}{_cell(_minus(mine, theirs)):>12}"
        )
    lines += [
        "",
        f"start order agreement {_cell(comparison.start_order_agreement)}, start time error "
        f"{_cell(comparison.start_time_error)} of the recorded makespan, over "
        f"{comparison.jobs_compared} jobs started in both",
    ]
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.3f}"
