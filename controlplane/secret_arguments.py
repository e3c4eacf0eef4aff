"""Secrets on the command line: never as arguments, which every user of the machine can read
(`ps`, /proc/PID/cmdline) and shells keep in their history; from a file or the environment."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


class RefusedSecret(argparse.Action):
    """An option that would take a secret as its value: refused (exit code 2), saying what to
    use instead."""

    def __init__(self, *args: Any, instead: str, **kwargs: Any) -> None:
        self.instead = instead
        super().__init__(*args, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"{option_string} takes no secret on the command line (other users can read it "
            f"there); use {self.instead}"
        )


def read_secret_file(path: str, what: str) -> str:
    """The secret in the file `path`, without surrounding white space (`-`: standard input);
    ValueError with a one-line message otherwise."""
    name = "standard input" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the {what} from {name}: {exc}") from exc
    if not text.strip():
        raise ValueError(f"{name} holds no {what}")
    return text.strip()
