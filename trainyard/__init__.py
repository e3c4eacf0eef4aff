"""Trainyard's user side: the Python SDK and the CLI's user commands, over the HTTP API.

    from trainyard import Client, read_manifest

    with Client("http://trainyard:8080", token) as client:
        job = client.submit(read_manifest("job.yaml"))
        for line in client.logs(job["id"], follow=True):
            print(line["line"])
        print(client.job(job["id"])["state"])

`AsyncClient` is the same for asyncio code. This package needs none of the server's
dependencies (asyncpg, pgserver, aiodocker, NVML).
"""

from trainyard.api import ApiError, NotFound, PredictionFailed, ServerUnreachable, UsageError
from trainyard.client import TERMINAL_STATES, AsyncClient, Client
from trainyard.manifest_file import read_manifest

__all__ = [
    "TERMINAL_STATES",
    "ApiError",
    "AsyncClient",
    "Client",
    "NotFound",
    "PredictionFailed",
    "ServerUnreachable",
    "UsageError",
    "read_manifest",
]
