"""The memo's first tier: results this control plane process answered or stored lately, in its
memory, so that a hit costs no Postgres round trip. Keyed by tenant, deployment and the memo's
key (which holds the model version's artifact and entry point, and the input's canonical
bytes: `tasks.memo_key`), so a tenant never reads another's result, nor a version another's.
Bounded twice: each deployment keeps its `memo_max_entries` most recently used results (as
the durable memo, `serving_memo`, does), and the whole holds at most `max_bytes` of outputs,
the least recently used going first. The durable memo stays the one every process shares."""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_MAX_BYTES = 64 * 1024 * 1024

Key = tuple[str, str, bytes]
"""Tenant, deployment, memo key."""


class MemoCache:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._all: OrderedDict[Key, str] = OrderedDict()
        """Every entry, least recently used first (for the bound in bytes)."""
        self._each: dict[tuple[str, str], OrderedDict[bytes, None]] = {}
        """Each deployment's keys, least recently used first (for its bound in entries)."""

    def get(self, tenant: str, deployment: str, key: bytes) -> str | None:
        """The stored output's JSON text (now the most recently used), or None."""
        output = self._all.get((tenant, deployment, key))
        if output is not None:
            self._all.move_to_end((tenant, deployment, key))
            self._each[(tenant, deployment)].move_to_end(key)
        return output

    def put(self, tenant: str, deployment: str, key: bytes, output: str, max_entries: int) -> None:
        """Keep `output` (JSON text) as the most recently used; the bounds then evict."""
        if len(output) > self.max_bytes:
            return  # it would evict everything and still not fit
        self._remove((tenant, deployment, key))
        self._all[(tenant, deployment, key)] = output
        self._each.setdefault((tenant, deployment), OrderedDict())[key] = None
        self.bytes += len(output)
        keys = self._each[(tenant, deployment)]
        while len(keys) > max_entries:
            self._remove((tenant, deployment, next(iter(keys))))
        while self.bytes > self.max_bytes:
            self._remove(next(iter(self._all)))

    def __len__(self) -> int:
        return len(self._all)

    def _remove(self, entry: Key) -> None:
        output = self._all.pop(entry, None)
        if output is None:
            return
        self.bytes -= len(output)
        tenant, deployment, key = entry
        keys = self._each[(tenant, deployment)]
        del keys[key]
        if not keys:
            del self._each[(tenant, deployment)]
