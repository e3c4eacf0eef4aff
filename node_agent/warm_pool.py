"""The agent's warm sandboxes kept ready (`--warm N`), and handed to the claims that can use
one (`node_agent.warm` says what a warm sandbox is and which learners may start in one).

The pool makes sandboxes until it holds its size, one at a time (each imports torch, say: two
at once would only share the node's CPUs), and again as claims take them, once their learners
have started (making one would share the CPUs with those starts). Each runs as a uid
the database holds for it (`Users.hold_warm`); a claim that takes one makes that uid its job's
(`Users.adopt_warm`), or gives the sandbox back when the job has a uid in use already (it ran
here or elsewhere before). As the agent stops, the sandboxes no claim took are removed and
their uids given back; those of an agent that died are, as the next one starts
(`Agent.reconcile`), whatever its `--warm`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from uuid import UUID

from controlplane.agent_port.vocabulary import UNAVAILABLE
from node_agent.users import Users
from node_agent.warm import WarmError, WarmSandbox, WarmSandboxes

log = logging.getLogger(__name__)

RETRY_S = 5.0
"""How soon the pool tries again after a sandbox could not be made, or no uid was free."""


class WarmPool:
    def __init__(self, sandboxes: WarmSandboxes, users: Users, node: str, size: int) -> None:
        self._sandboxes = sandboxes
        self._users = users
        self._node = node
        self._size = size
        self._ready: list[WarmSandbox] = []
        self._dead: list[WarmSandbox] = []
        """Ready ones found ended (the node's OOM killer, say) as a claim looked for one."""
        self._wanted = asyncio.Event()

    def take(self) -> WarmSandbox | None:
        """A ready sandbox for a claim, if one is; the pool makes another once the claim's
        learner has started in it (`run`)."""
        while self._ready:
            self._wanted.set()
            warm = self._ready.pop(0)
            if self._sandboxes.alive(warm):
                self._sandboxes.hand(warm)
                return warm
            self._dead.append(warm)  # removed, and its uid given back, by `run`
        return None

    def give_back(self, warm: WarmSandbox) -> None:
        """A sandbox a claim took but could not use (nothing of the job was given to it)."""
        self._sandboxes.let_go(warm.name)
        self._ready.append(warm)

    async def run(self) -> None:
        """Keep the pool full until cancelled; then remove the sandboxes no claim took."""
        try:
            while True:
                await self._remove_dead()
                # Not while a learner starts in a sandbox a claim took: making one (bubblewrap,
                # cgroups, an interpreter's imports) would share the node's CPUs and the
                # kernel's cgroup lock with that start, which the pool is there to make fast (it
                # made a warm trial's start twice as long: 32 ms to DOWNLOADING against 16). At
                # most RETRY_S: a start that takes longer (a cold one, its sandbox found dead)
                # holds no pool empty.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETRY_S):
                        await self._sandboxes.quiet()
                while len(self._ready) < self._size and await self._make():
                    pass
                self._wanted.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETRY_S):
                        await self._wanted.wait()
        finally:
            # Shielded: a cancelled agent still removes what it made.
            await asyncio.shield(self._close())

    async def _make(self) -> bool:
        """One more ready sandbox; False when none could be made now."""
        try:
            held = await self._users.hold_warm(self._node)
        except Exception as exc:
            # Never the agent's end: it runs its learners cold meanwhile.
            if not isinstance(exc, UNAVAILABLE):
                log.exception("warm sandboxes: cannot hold a uid")
            log.warning("warm sandboxes: no uid from the database (%s); trying again", exc)
            return False
        if held is None:
            return False  # every uid is a job's: the claims need them more
        try:
            warm = await self._sandboxes.make(held.placeholder, held.uid)
        except Exception as exc:
            # Never the agent's end: it runs its learners cold meanwhile.
            if not isinstance(exc, WarmError):
                log.exception("warm sandboxes: cannot make one")
            log.warning("%s; trying again in %g s", exc, RETRY_S)
            await self._release([held.placeholder])
            return False
        self._ready.append(warm)
        return True

    async def _remove_dead(self) -> None:
        dead, self._dead = self._dead, []
        for warm in dead:
            await self._sandboxes.discard(warm)
        await self._release([warm.placeholder for warm in dead])

    async def _close(self) -> None:
        await self._remove_dead()
        ready, self._ready = self._ready, []
        # Taken by a claim whose learner never started in it (the agent stopped first): the
        # job's uid now, nothing to give back.
        taken = self._sandboxes.let_go_of_all()
        for warm in [*ready, *taken]:
            await self._sandboxes.discard(warm)
        await self._release([warm.placeholder for warm in ready])

    async def _release(self, placeholders: list[UUID]) -> None:
        if not placeholders:
            return
        try:
            await self._users.release_warm(self._node, placeholders)
        except UNAVAILABLE as exc:
            # Given back as the next agent of the node starts.
            log.warning("warm sandboxes: their uids not given back (%s)", exc)
