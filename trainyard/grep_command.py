"""`trainyard grep PATTERN`: the lines of all the tenant's jobs and attempts that hold PATTERN (or
match it, with --regex), newest first, each with its time, job, attempt, learner and stream;
with --follow, new matches as they come. Built on the SDK (`AsyncClient.grep`). Like grep, the
exit code is 1 when nothing matched (0 when something did)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from typing import Any

from controlplane.failures import EXIT_FAILED
from controlplane.settings import Settings
from trainyard.api import UsageError
from trainyard.commands import (
    client_for,
    output_options,
    parse_labels,
    target_options,
)
from trainyard.config import TOKEN_ENV

_AGO = re.compile(r"([0-9]{1,9})([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
DEFAULT_LIMIT = 100


def add_grep_command(commands: Any) -> None:
    """Add `grep` to the top-level subparsers. Its errors reach the front door (`cli.main`), which
    prints one line and exits with the documented code."""
    target = target_options(
        f"a file holding the bearer token, - for standard input (else ${TOKEN_ENV}, else login's)"
    )
    grep = commands.add_parser(
        "grep",
        help="search the logs of all your jobs",
        description="Print the log lines of all your jobs and attempts that hold PATTERN (a "
        "Postgres regular expression with --regex), newest first, as `TIME JOB [attempt N "
        "learner I STREAM] LINE`; with --follow, new matching lines as they come (oldest "
        "first) until interrupted. Exit code 1 when nothing matched.",
        parents=[target, output_options()],
    )
    grep.add_argument("pattern", metavar="PATTERN", help="what to look for")
    grep.add_argument("--regex", action="store_true", help="PATTERN is a regular expression")
    grep.add_argument("--ignore-case", action="store_true", help="ignore case")
    grep.add_argument(
        "--job", action="append", default=[], metavar="JOB", help="only this job (repeatable)"
    )
    grep.add_argument(
        "--label",
        action="append",
        metavar="KEY=VALUE",
        help="only jobs with this label (repeatable: all must hold)",
    )
    grep.add_argument(
        "--since",
        metavar="T",
        help="only lines printed at or after T: an RFC 3339 time, or an age (30s, 10m, 2h, 7d)",
    )
    grep.add_argument(
        "-f", "--follow", action="store_true", help="print new matching lines as they come"
    )
    grep.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"print at most N lines (default {DEFAULT_LIMIT}; 0: all; not with --follow)",
    )
    grep.add_argument(
        "--raw", action="store_true", help="include the launcher's protocol lines (@@trainyard/1)"
    )
    grep.add_argument("--tenant", metavar="NAME", help="the tenant searched (admin only)")
    grep.set_defaults(handler=cmd_grep)


def parse_since(text: str | None, now: datetime) -> datetime | None:
    """--since as an instant: an RFC 3339 time with its offset, or an age before `now`."""
    if text is None:
        return None
    if match := _AGO.fullmatch(text):
        return now - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--since takes an RFC 3339 time or an age like 10m, not {text!r}"
        ) from None
    if when.tzinfo is None:
        raise UsageError("--since needs a time zone offset (e.g. 2026-11-01T12:00:00Z)")
    return when


def line_text(line: dict[str, Any]) -> str:
    at = datetime.fromisoformat(line["at"]).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    where = f"attempt {line['attempt']} learner {line['learner']} {line['stream']}"
    return f"{at} {line['job_id']} [{where}] {line['line']}"


async def cmd_grep(args: argparse.Namespace, settings: Settings) -> int:
    if args.limit < 0:
        raise UsageError("--limit must be 0 (all) or more")
    since = parse_since(args.since, datetime.now(UTC))
    printed = 0
    async with client_for(args, settings) as client:
        lines = client.grep(
            args.pattern,
            regex=args.regex,
            ignore_case=args.ignore_case,
            jobs=args.job,
            labels=parse_labels(args.label),
            since=since,
            follow=args.follow,
            protocol=args.raw,
            tenant=args.tenant,
            page_size=min(args.limit or 1000, 1000),
        )
        async with aclosing(lines):
            async for line in lines:
                text = json.dumps(line) if args.output == "json" else line_text(line)
                print(text, flush=args.follow)
                printed += 1
                if not args.follow and printed == args.limit:
                    break
    if not printed and not args.raw:
        # The metrics and phases `trainyard logs` shows as `report` lines are the launcher's
        # protocol lines, which a search leaves out unless asked: say so, or a person who just
        # saw "loss 0.45" in the logs is told it is nowhere.
        print(
            "no line matched (the launcher's reports, metrics and phases, are searched with --raw)",
            file=sys.stderr,
        )
    return 0 if printed else EXIT_FAILED
