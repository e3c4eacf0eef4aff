"""Archiving under Patroni (`harness.backups.archived_cluster` on `harness.ha`'s primary and
synchronous standby): a backup taken from the primary; the primary's postmaster killed, the
standby promoted; the new primary archives into the same repository on its new timeline, and
a restore to an instant after the failover has what was committed before it on either
primary, and nothing after. Needs pgBackRest, Patroni and etcd; skipped without them, except
under CI."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import datetime

import pytest

from controlplane.database import connect
from harness import backups, ha
from harness.backups import Repository, archived_cluster
from harness.ha import HaCluster, ha_cluster

pytestmark = [pytest.mark.postgres, pytest.mark.processes]


@pytest.fixture
async def cluster() -> AsyncIterator[HaCluster]:
    problem = backups.missing() or ha.missing()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the archiving failover test: {problem}")
        pytest.skip(problem)
    async with ha_cluster() as cluster:
        yield cluster


async def write(cluster: HaCluster, sql: str) -> datetime:
    """Run `sql` on the primary; the instant just after it committed."""
    conn = await connect(cluster.url(), role=None)
    try:
        await conn.execute(sql)
        after: datetime = await conn.fetchval("SELECT clock_timestamp()")
        return after
    finally:
        await conn.close()


async def test_a_restore_follows_the_archive_across_a_failover(cluster: HaCluster) -> None:
    repository: Repository
    async with archived_cluster(cluster) as repository:
        await repository.backup()
        await write(cluster, "CREATE TABLE drill (n int); INSERT INTO drill VALUES (1)")
        old = await cluster.kill_primary_postgres()
        await cluster.until_failed_over(old)
        target = await write(cluster, "INSERT INTO drill VALUES (2)")
        await write(cluster, "INSERT INTO drill VALUES (3)")
        await repository.check()

        restored_dir = repository.root / "restored"
        await repository.restore(target, restored_dir)
        restored = await repository.start_restored(restored_dir)
        conn = await connect(restored.url(), role=None)
        try:
            rows = await conn.fetch("SELECT n FROM drill ORDER BY n")
            timeline = await conn.fetchval("SELECT timeline_id FROM pg_control_checkpoint()")
        finally:
            await conn.close()
        assert [row["n"] for row in rows] == [1, 2]
        # The old primary's timeline, the new primary's, and the restore's own on promotion.
        assert timeline >= 3
