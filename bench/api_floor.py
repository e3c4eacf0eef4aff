"""The floor under a submit on this host: `bench api`'s reference in the same run.

A submit's latency depends on the host more than on anything the control plane does: the same
code gave a p99 of 6.3 ms on one machine and 30 ms on a slower one. This server does only what
any durable submit over HTTP to Postgres must do, on the same libraries (aiohttp, asyncpg): read
the JSON body, insert one row and wait for its commit to reach the disk, answer 201 with JSON.
Nothing checks, authorizes, records events, projects or streams. Submitted to by the same open
loop at the same rate, its latencies say what this host allows; the control plane's, divided by
them, say what the control plane adds, in a figure that can be compared across machines.

`python -m bench.api_floor DATABASE_URL PORT` serves until SIGTERM; it prints READY once it
listens."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid

import asyncpg
from aiohttp import web

READY = "ready"
POOL_SIZE = 10
"""As many connections as the control plane's pool (controlplane/database.py) opens at most."""
TABLE = """CREATE TABLE IF NOT EXISTS bench_floor_jobs (
    id uuid PRIMARY KEY, tenant text NOT NULL, manifest jsonb NOT NULL,
    submitted_at timestamptz NOT NULL DEFAULT now())"""
INSERT = "INSERT INTO bench_floor_jobs (id, tenant, manifest) VALUES ($1, $2, $3::text::jsonb)"


async def serve(url: str, port: int) -> None:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=POOL_SIZE)
    try:
        await pool.execute(TABLE)

        async def submit(request: web.Request) -> web.Response:
            manifest = await request.json()
            job_id = uuid.uuid4()
            await pool.execute(
                INSERT, job_id, request.query.get("tenant", ""), json.dumps(manifest)
            )
            return web.json_response({"id": str(job_id)}, status=201)

        app = web.Application()
        app.router.add_post("/v1/jobs", submit)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            print(READY, flush=True)
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()
    finally:
        await pool.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], int(sys.argv[2])))
