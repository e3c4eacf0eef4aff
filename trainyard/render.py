"""How the client shows jobs, nodes and a followed job: plain aligned text for reading (and
for pipes), a rich live status line when stdout is a terminal."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

from rich.console import Console
from rich.live import Live
from rich.text import Text

from runners import protocol


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def jobs_table(jobs: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        (
            job["id"],
            job["manifest"]["name"],
            job["state"],
            job["attempt"],
            job["restarts"],
            job["nodes"],
            job["submitted_at"],
        )
        for job in jobs
    ]
    return table(["ID", "NAME", "STATE", "ATTEMPT", "RESTARTS", "NODES", "SUBMITTED"], rows)


def nodes_table(nodes: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        (
            node["name"],
            node["state"],
            node["runtime"],
            f"{node['gpus_free']}/{len(node['gpus'])}",
            f"{node['cpus_allocated']:g}/{node['cpus']}",
            f"{node['memory_mb_allocated']}/{node['memory_mb']}",
            node["lease_until"],
        )
        for node in nodes
    ]
    return table(["NAME", "STATE", "RUNTIME", "GPUS FREE", "CPUS", "MEMORY MB", "LEASE"], rows)


def job_status(
    job: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    webhooks: Sequence[Mapping[str, Any]] = (),
) -> str:
    checkpoint = job.get("last_checkpoint")
    fields: list[tuple[str, object]] = [
        ("job", job["id"]),
        ("name", job["manifest"]["name"]),
        ("tenant", job["tenant"]),
        ("state", job["state"]),
        ("attempt", job["attempt"]),
        ("restarts", f"{job['restarts']} of {job['manifest'].get('max_restarts', '?')}"),
        ("nodes", job["nodes"]),
        ("gpus", job["gpus"]),
        (
            "checkpoint",
            checkpoint
            and f"step {checkpoint['step']} of attempt {checkpoint['attempt']} at "
            f"{checkpoint['at']} ({checkpoint['path']})",
        ),
        ("exit codes", job["exit_codes"]),
        ("failure", job.get("failure_reason")),
        ("unschedulable", job.get("unschedulable_reason")),
        ("submitted", job["submitted_at"]),
        ("updated", job["updated_at"]),
    ]
    head = table(["FIELD", "VALUE"], fields).split("\n", 1)[1]
    rows = [
        (e["at"], e["event"], e["state"], e["attempt"], e["actor"], e.get("reason"))
        for e in history
    ]
    events = table(["AT", "EVENT", "STATE", "ATTEMPT", "ACTOR", "REASON"], rows)
    text = f"{head}\n\nhistory:\n{events}"
    if webhooks:
        attempts = [
            (
                w["at"],
                w["job_event"],
                w["attempt"],
                _WEBHOOK_OUTCOMES.get(w["event"], w["event"]),
                w.get("status"),
                w.get("error"),
            )
            for w in webhooks
        ]
        headers = ["AT", "NOTIFIED", "ATTEMPT", "OUTCOME", "STATUS", "ERROR"]
        text += "\n\nwebhooks:\n" + table(headers, attempts)
    return text


_WEBHOOK_OUTCOMES = {
    "WebhookDelivered": "delivered",
    "WebhookAttemptFailed": "retrying",
    "WebhookFailed": "gave up",
}


def log_text(line: Mapping[str, Any], raw: bool = True) -> str:
    """The same form as the API's plain-text logs; unless `raw`, the launcher's reports (stdout
    protocol lines) readable, as `report` lines."""
    stream, text = line["stream"], line["line"]
    if not raw and stream == "stdout" and (readable := report_text(text)) is not None:
        stream, text = "report", readable
    return f"[attempt {line['attempt']} learner {line['learner']} {stream}] {text}"


def report_text(text: str) -> str | None:
    """A launcher's report to the agent (a protocol line) as people read it, like `trainyard
    up` shows its demo's; None for anything else (the user's own output)."""
    match protocol.parse(text):
        case protocol.Metric(step=step, values=values):
            shown = ", ".join(f"{name} {value:.4g}" for name, value in values.items())
            return f"step {step}: {shown}"
        case protocol.CheckpointSaved(step=step, size_bytes=size, path=path):
            return f"checkpoint saved at step {step} ({size / 1024:.0f} KiB, {path})"
        case protocol.CheckpointRestored(step=step):
            return f"resumed from the checkpoint at step {step}"
        case protocol.PhaseStarted(phase=phase):
            return f"{phase} started"
        case protocol.PhaseEnded(phase=phase, outcome=outcome, duration_s=took, error=why):
            return f"{phase} {outcome} after {took:.1f}s" + (f": {why}" if why else "")
    return None


def status_text(state: str, attempt: int, restarts: int, detail: str | None) -> str:
    suffix = f" ({detail})" if detail else ""
    return f"[status] {state}, attempt {attempt}, restarts {restarts}{suffix}"


class FollowView(Protocol):
    """What a followed job shows: its state changes and its log lines."""

    def status(self, state: str, attempt: int, restarts: int, detail: str | None) -> None: ...

    def line(self, line: Mapping[str, Any]) -> None: ...

    def __enter__(self) -> FollowView: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class PlainView:
    """One line per state change and per log line: for pipes and files."""

    def __init__(self, raw: bool = False) -> None:
        self._raw = raw

    def status(self, state: str, attempt: int, restarts: int, detail: str | None) -> None:
        print(status_text(state, attempt, restarts, detail), flush=True)

    def line(self, line: Mapping[str, Any]) -> None:
        print(log_text(line, self._raw), flush=True)

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *_: object) -> None:
        return None


class JsonLinesView(PlainView):
    """Only the log lines, each as a JSON object (for `logs -f --output json`)."""

    def status(self, state: str, attempt: int, restarts: int, detail: str | None) -> None:
        return None

    def line(self, line: Mapping[str, Any]) -> None:
        print(json.dumps(line), flush=True)


class LiveView:
    """Log lines scroll by above a status line that stays at the bottom of the terminal."""

    def __init__(self, raw: bool = False) -> None:
        self._raw = raw
        self._console = Console()
        self._live = Live(Text("[status] connecting"), console=self._console, transient=False)

    def status(self, state: str, attempt: int, restarts: int, detail: str | None) -> None:
        self._live.update(Text(status_text(state, attempt, restarts, detail), style="bold"))

    def line(self, line: Mapping[str, Any]) -> None:
        # Text(...) so that brackets in a learner's output are not read as rich markup.
        self._console.print(Text(log_text(line, self._raw)))

    def __enter__(self) -> LiveView:
        self._live.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._live.stop()


def follow_view(json_output: bool, raw: bool = False) -> FollowView:
    """JSON lines as the server sends them, or text with the launcher's reports readable unless
    `raw`."""
    if json_output:
        return JsonLinesView()
    return LiveView(raw) if sys.stdout.isatty() else PlainView(raw)
