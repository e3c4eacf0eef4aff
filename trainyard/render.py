"""How the client shows jobs, nodes, a followed job and model versions: plain aligned text for
reading (and for pipes), a rich live status line when stdout is a terminal. Text that tenants
wrote (a model's metadata is another tenant's, when public) is shown with its control
characters escaped."""

from __future__ import annotations

import json
import re
import shlex
import sys
import textwrap
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

from rich.console import Console
from rich.live import Live
from rich.text import Text

from runners import protocol

_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""Control characters, which a terminal obeys (escape sequences move the cursor, rewrite the
screen, set the window's title); bidirectional overrides, which show text in another order
than it is; and lone surrogates, which no terminal encoding can print."""
SHOWN_METRICS = 3
"""Metrics a table row shows, before `+N` more."""
TITLE_CHARS = 48


def printable(text: str, *, layout: bool = False) -> str:
    """`text` safe to print: each unsafe character as its escape (`\\x1b`); with `layout`,
    line breaks and tabs are kept."""

    def escaped(match: re.Match[str]) -> str:
        char = match.group()
        return char if layout and char in "\n\t" else ascii(char)[1:-1]

    return _UNSAFE.sub(escaped, text)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def fields(rows: Sequence[tuple[str, object]]) -> str:
    """`label  value` lines, the values aligned (a table without its header)."""
    return table(["FIELD", "VALUE"], rows).split("\n", 1)[1]


def milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(printable(str(v)) for v in value) or "-"
    # One line, whatever it holds: a line break would break the table.
    return printable(str(value))


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
            # The lease's state says whether it runs; draining, whether it takes work.
            "DRAINING" if node["state"] == "READY" and node.get("draining") else node["state"],
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
    pending: Mapping[str, Any] | None = None,
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
        ("queue position", pending and pending.get("position")),
        ("estimated start", pending and pending.get("estimated_start")),
        ("submitted", job["submitted_at"]),
        ("updated", job["updated_at"]),
    ]
    head = table(["FIELD", "VALUE"], fields).split("\n", 1)[1]
    text = head
    # A server older than ranks sends none.
    ranks = job.get("ranks", [])
    if len(ranks) > 1:
        shown = [(r["rank"], r["node"], r["gpus"], r["state"], r["exit_code"]) for r in ranks]
        text += "\n\nranks:\n" + table(["RANK", "NODE", "GPUS", "STATE", "EXIT"], shown)
    rows = [
        (e["at"], e["event"], e["state"], e["attempt"], e["actor"], e.get("reason"))
        for e in history
    ]
    events = table(["AT", "EVENT", "STATE", "ATTEMPT", "ACTOR", "REASON"], rows)
    text += f"\n\nhistory:\n{events}"
    if pending and pending.get("reasons"):
        now = [(r["reason"], r["blocking"], r["since"], r["detail"]) for r in pending["reasons"]]
        text += "\n\npending:\n" + table(["REASON", "BLOCKING", "SINCE", "DETAIL"], now)
    if pending and pending.get("seconds"):
        spent = [(reason, f"{seconds:.1f}") for reason, seconds in pending["seconds"].items()]
        text += "\n\ntime pending:\n" + table(["REASON", "SECONDS"], spent)
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


def log_text(line: Mapping[str, Any], raw: bool = True, ranks: bool = False) -> str:
    """The same form as the API's plain-text logs; unless `raw`, the launcher's reports (stdout
    protocol lines) readable, as `report` lines. With `ranks` (a job of several learners, which
    train together), the line names its learner by its rank, which is its learner index."""
    stream, text = line["stream"], line["line"]
    if not raw and stream == "stdout" and (readable := report_text(text)) is not None:
        stream, text = "report", readable
    who = "rank" if ranks else "learner"
    return f"[attempt {line['attempt']} {who} {line['learner']} {stream}] {text}"


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

    def __init__(self, raw: bool = False, ranks: bool = False) -> None:
        self._raw = raw
        self._ranks = ranks

    def status(self, state: str, attempt: int, restarts: int, detail: str | None) -> None:
        print(status_text(state, attempt, restarts, detail), flush=True)

    def line(self, line: Mapping[str, Any]) -> None:
        print(log_text(line, self._raw, self._ranks), flush=True)

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

    def __init__(self, raw: bool = False, ranks: bool = False) -> None:
        self._raw = raw
        self._ranks = ranks
        self._console = Console()
        self._live = Live(Text("[status] connecting"), console=self._console, transient=False)

    def status(self, state: str, attempt: int, restarts: int, detail: str | None) -> None:
        self._live.update(Text(status_text(state, attempt, restarts, detail), style="bold"))

    def line(self, line: Mapping[str, Any]) -> None:
        # Text(...) so that brackets in a learner's output are not read as rich markup.
        self._console.print(Text(log_text(line, self._raw, self._ranks)))

    def __enter__(self) -> LiveView:
        self._live.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._live.stop()


def follow_view(json_output: bool, raw: bool = False, ranks: bool = False) -> FollowView:
    """JSON lines as the server sends them, or text with the launcher's reports readable unless
    `raw`, and each line's rank named with `ranks`."""
    if json_output:
        return JsonLinesView()
    return LiveView(raw, ranks) if sys.stdout.isatty() else PlainView(raw, ranks)


def versions_table(versions: Sequence[Mapping[str, Any]]) -> str:
    """Model versions of any models, one a row (a search's page)."""
    rows = [
        (
            version["reference"],
            _shortened(version["metadata"]["title"], TITLE_CHARS),
            version["metadata"]["framework"],
            _metrics(version["metadata"].get("metrics", {}), SHOWN_METRICS),
            version["created"],
        )
        for version in versions
    ]
    return table(["REFERENCE", "TITLE", "FRAMEWORK", "METRICS", "CREATED"], rows)


def search_page(page: Mapping[str, Any], next_page: Sequence[str] | None) -> str:
    """A search's page, then how many versions match in all, their facets' counts, and
    `next_page` (the command line that shows the next page, when there is one)."""
    versions = page["versions"]
    lines = [versions_table(versions), ""] if versions else []
    lines.append(f"{page['total']} matching version(s), {len(versions)} shown")
    for facet, counts in page["facets"].items():
        if counts:
            shown = ", ".join(f"{printable(value)} {count}" for value, count in counts.items())
            lines.append(f"{facet}: {shown}")
    if next_page is not None:
        lines.append(f"next page: {printable(shlex.join(next_page))}")
    return "\n".join(lines)


def model_versions(model: Mapping[str, Any], limit: int) -> str:
    """One model's versions (at most `limit`, newest first), each with the aliases naming it,
    `latest` included."""
    aliases: dict[int, list[str]] = {}
    if model["latest"] is not None:
        aliases[model["latest"]] = ["latest"]
    for alias, number in model["aliases"].items():
        aliases.setdefault(number, []).append(alias)
    rows = [
        (
            version["version"],
            aliases.get(version["version"]),
            _shortened(version["metadata"]["title"], TITLE_CHARS),
            _metrics(version["metadata"].get("metrics", {}), SHOWN_METRICS),
            version["visibility"],
            version["deprecated"],
            version["created"],
        )
        for version in model["versions"][:limit]
    ]
    headers = ["VERSION", "ALIASES", "TITLE", "METRICS", "VISIBILITY", "DEPRECATED", "CREATED"]
    latest = model["latest"] or "none (every version is deprecated)"
    head = f"{printable(model['tenant'])}/{printable(model['name'])}: latest {latest}"
    more = len(model["versions"]) - limit
    tail = f"\n({more} older version(s) not shown)" if more > 0 else ""
    return f"{head}\n{table(headers, rows)}{tail}"


def version_view(version: Mapping[str, Any], aliases: Sequence[str]) -> str:
    """One model version whole: its metadata, artifact, visibility and the aliases naming it."""
    metadata = version["metadata"]
    servable = metadata["servable"]
    fields: list[tuple[str, object]] = [
        ("reference", version["reference"]),
        ("title", metadata["title"]),
        ("creators", "; ".join(_creator(creator) for creator in metadata["creators"])),
        ("license", metadata.get("license")),
        ("citation", _citation(metadata.get("citation"))),
        ("domains", metadata.get("domains")),
        ("tags", metadata.get("tags")),
        ("framework", metadata["framework"]),
        ("entry point", servable["entry_point"]),
        ("input", _data_type(servable["input"])),
        ("output", _data_type(servable["output"])),
        ("requirements", servable.get("requirements")),
        ("metrics", _metrics(metadata.get("metrics", {}), None)),
        ("provenance", _provenance(metadata.get("provenance"))),
        ("artifact sha256", version["artifact_sha256"]),
        ("size", _size(version["size_bytes"])),
        ("visibility", version["visibility"]),
        ("deprecated", version["deprecated"]),
        ("aliases", list(aliases)),
        ("published", f"{version['created']} by {version['published_by']}"),
        ("updated", version["updated_at"]),
    ]
    text = table(["FIELD", "VALUE"], fields).split("\n", 1)[1]
    description = metadata.get("description")
    if description:
        text += "\n\ndescription:\n" + textwrap.indent(printable(description, layout=True), "  ")
    return text


def _shortened(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _metrics(metrics: Mapping[str, float], shown: int | None) -> str | None:
    """`name value` pairs by name, the first `shown` of them (None: all) and how many more."""
    names = sorted(metrics)
    listed = ", ".join(f"{name} {metrics[name]:.4g}" for name in names[:shown])
    more = len(names) - len(names[:shown])
    return (listed + (f" +{more}" if more else "")) or None


def _creator(creator: Mapping[str, Any]) -> str:
    name: str = creator["name"]
    details = [creator[key] for key in ("affiliation", "orcid") if creator.get(key)]
    return name + (f" ({', '.join(details)})" if details else "")


def _citation(citation: Mapping[str, Any] | None) -> str | None:
    if citation is None:
        return None
    parts = [f"doi:{citation['doi']}" if citation.get("doi") else None, citation.get("text")]
    return "; ".join(part for part in parts if part)


def _data_type(data: Mapping[str, Any]) -> str:
    """`ndarray float32 [?, 3, 224, 224]: what it means` (`?`: a dimension of any size)."""
    words = [data["type"]]
    if data.get("dtype"):
        words.append(data["dtype"])
    if data.get("shape") is not None:
        words.append("[" + ", ".join("?" if n is None else str(n) for n in data["shape"]) + "]")
    description = data.get("description")
    return " ".join(words) + (f": {description}" if description else "")


def _provenance(provenance: Mapping[str, Any] | None) -> str | None:
    if provenance is None:
        return None
    step = provenance.get("checkpoint_step")
    source = "final results" if step is None else f"checkpoint step {step}"
    text = f"job {provenance['job_id']}, attempt {provenance['attempt']}, {source}"
    if provenance.get("data_sha256"):
        text += f", data sha256 {provenance['data_sha256']}"
    return text


def _size(size: int) -> str:
    scaled, unit = float(size), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if scaled < 1024:
            break
        scaled, unit = scaled / 1024, bigger
    return f"{size} bytes" if unit == "bytes" else f"{size} bytes ({scaled:.1f} {unit})"
