"""Where the client finds its server and token: flags, then the environment, then the config
file that `trainyard login` writes (`$TRAINYARD_HOME/client.json`, mode 0600)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from controlplane.secret_arguments import read_secret_file
from controlplane.settings import ADMIN_TOKEN_FILE
from trainyard.api import UsageError

SERVER_ENV = "TRAINYARD_SERVER"
TOKEN_ENV = "TRAINYARD_TOKEN"
CONFIG_FILE = "client.json"


@dataclass(frozen=True, slots=True)
class Target:
    server: str
    token: str


def config_path(home: Path) -> Path:
    return home / CONFIG_FILE


def read_config(home: Path) -> dict[str, str]:
    path = config_path(home)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object; run `trainyard login` again")
    return {key: value for key, value in data.items() if isinstance(value, str)}


def write_config(home: Path, target: Target) -> Path:
    return _write(home, {"server": target.server, "token": target.token})


def forget_token(home: Path, token: str) -> Path | None:
    """Remove `token` from the saved config, keeping the server (a later `login` asks only for
    a token); the file's path if it held that token, else None."""
    saved = read_config(home)
    if saved.get("token") != token:
        return None
    return _write(home, {key: value for key, value in saved.items() if key != "token"})


def _write(home: Path, config: dict[str, str]) -> Path:
    """Write atomically, the token never readable by others, not even for a moment."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = config_path(home)
    partial = path.with_suffix(".json.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # A leftover partial file keeps its old mode through O_CREAT: set it explicitly.
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(config, file)
        file.write("\n")
    partial.replace(path)
    return path


def resolve(
    server: str | None, token_file: str | None, home: Path, *, admin: bool = False
) -> Target:
    """The first of flag, environment and config file that names each of server and token
    (the token's flag names a file: a token in the arguments would be visible to every user of
    the machine, in `ps`); with `admin`, the admin token file (on the control plane's machine)
    before the config."""
    saved = read_config(home)
    server = server or os.environ.get(SERVER_ENV) or saved.get("server")
    token = (
        (read_token_file(token_file) if token_file is not None else None)
        or os.environ.get(TOKEN_ENV)
        or (read_admin_token(home) if admin else None)
        or saved.get("token")
    )
    if not server:
        raise UsageError(f"no server: pass --server, set {SERVER_ENV} or run `trainyard login`")
    if not token:
        raise UsageError(
            f"no token: pass --token-file FILE, set {TOKEN_ENV} or run `trainyard login`"
        )
    return Target(normalize_server(server), token)


def read_token_file(path: str) -> str:
    """The token in the file `path` (`-`: standard input); UsageError otherwise."""
    try:
        return read_secret_file(path, "token")
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def read_admin_token(home: Path) -> str | None:
    """The admin token the control plane wrote on its first start, if this is its machine."""
    path = home / ADMIN_TOKEN_FILE
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the admin token in {path}: {exc}") from exc


def normalize_server(server: str) -> str:
    if not server.startswith(("http://", "https://")):
        raise UsageError(f"the server must be an http:// or https:// URL, not {server!r}")
    return server.rstrip("/")
