"""Running a node agent with everything it needs, until asked to stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from uuid import UUID

from controlplane.agent_port.protocol import AgentPort
from controlplane.agent_port.startup import connect
from controlplane.agent_port.vocabulary import CommandFailed
from controlplane.agent_port.wakes import LogListener, Wakeups, agent_wakeups
from node_agent.agent import Agent, AgentConfig
from node_agent.folders import make_base
from node_agent.identity import agent_identity
from node_agent.inventory import open_inventory
from node_agent.log_shipper import LogShipper
from node_agent.log_sink import NumberedSink
from node_agent.packages import Packages, in_image
from node_agent.runtimes import PACKAGES_DIR, open_runtime
from node_agent.serving import Serving
from node_agent.serving_channel import open_channel
from node_agent.warm import WarmSettings

log = logging.getLogger("node_agent")


POOL_MIN = 1
POOL_MAX = 2
"""The agent's pool, shared by heartbeats, claims, log lines and serving, each a short
transaction. A second connection, opened when they meet, keeps a log write that the server
holds up (a lock, a full disk) from holding up the job's reports and the node's heartbeats
behind it; more would only raise what a fleet costs the server (docs/operations.md,
"Connection budget")."""
AGENT_CONNECTIONS = POOL_MAX + 1
"""The most server connections an agent opens directly: its pool and its one LISTEN connection
(through pgBouncer, its pool's are pgBouncer's, and a polling agent has no LISTEN one)."""


class LeaseLost(CommandFailed):
    """The agent's node was declared lost while it ran."""


async def run_agent(
    url: str,
    config: AgentConfig,
    *,
    fake_gpus: int | None,
    stop: asyncio.Event,
    registered: asyncio.Event | None = None,
    pooled_url: str | None = None,
) -> None:
    """Register the node (NodeNameTaken if its name is held; WorkDirInUse if another agent
    runs on the work directory), take back what an earlier agent of the node left running, work
    until `stop` is set, then stop the learners, ship the last lines and deregister.

    `url` is the server's, for LISTEN (and for the queries unless `pooled_url`); `pooled_url`
    is pgBouncer's in transaction mode, as the same login, for every query (LoginUnprepared
    when the login lacks its settings)."""
    with agent_identity(config.work_dir) as agent_id:
        make_base(config.work_dir)
        make_base(config.checkpoint_root)
        # One LISTEN connection for all of the agent's channels: its claim and request hints
        # (see `node_agent.wakes`) and its replicas' serving hints. None at all when the agent
        # polls (`config.listen` False): every wait then ends at the poll interval.
        listener = agent_wakeups(url, poll_s=config.poll_s, listen=config.listen)
        async with connect(
            url, pooled_url=pooled_url, min_size=POOL_MIN, max_size=POOL_MAX
        ) as port:
            await _run(
                port,
                listener,
                config,
                agent_id,
                fake_gpus=fake_gpus,
                stop=stop,
                registered=registered,
            )


async def run_agent_on(
    port: AgentPort,
    listener: Wakeups,
    config: AgentConfig,
    *,
    fake_gpus: int | None,
    stop: asyncio.Event,
    registered: asyncio.Event | None = None,
) -> None:
    """`run_agent` on a port of the caller's (the in-memory twin, say), woken by `listener`."""
    with agent_identity(config.work_dir) as agent_id:
        make_base(config.work_dir)
        make_base(config.checkpoint_root)
        await _run(
            port,
            listener,
            config,
            agent_id,
            fake_gpus=fake_gpus,
            stop=stop,
            registered=registered,
        )


async def _run(
    port: AgentPort,
    listener: Wakeups,
    config: AgentConfig,
    agent_id: UUID,
    *,
    fake_gpus: int | None,
    stop: asyncio.Event,
    registered: asyncio.Event | None,
) -> None:
    inventory = open_inventory(fake_gpus, config.name, log)
    # Models' requirements: fetched as wheels by the node, installed into a folder a process
    # replica puts on its path, or into the image a container replica runs.
    packages = Packages(config.work_dir / PACKAGES_DIR)
    site = packages.site if config.runtime == "process" else in_image
    try:
        async with (
            open_runtime(
                config.runtime,
                work_dir=config.work_dir,
                request_gpus=config.request_gpus,
                images=config.images,
                packages=packages,
                warm=WarmSettings(
                    python=config.launcher[0],
                    imports=config.warm_imports,
                    roots=(config.work_dir, config.checkpoint_root),
                ),
            ) as runtime,
            contextlib.AsyncExitStack() as opened,
        ):
            channel = (
                None
                if config.serving_listen is None
                else await opened.enter_async_context(open_channel(config.serving_listen))
            )
            serving = Serving(
                port, listener, config.artifacts_dir, site, config.name, channel=channel
            )
            shipper = LogShipper(port)
            sink = NumberedSink(shipper)
            agent = Agent(
                config, port, listener, inventory, runtime, sink, agent_id, serving=serving
            )
            await _serve(agent, listener, shipper, stop, registered)
    finally:
        inventory.close()
    if agent.fenced:
        raise LeaseLost(
            f"node {config.name} lost its lease (declared LOST; its jobs were restarted "
            "elsewhere); its learners were killed. Restart the agent to rejoin."
        )


async def _serve(
    agent: Agent,
    listener: LogListener,
    shipper: LogShipper,
    stop: asyncio.Event,
    registered: asyncio.Event | None,
) -> None:
    await agent.register()
    async with asyncio.TaskGroup() as group:
        group.create_task(listener.run(), name=f"listener-{listener.name}")
        shipping = group.create_task(shipper.run(), name="log-shipper")
        # Before any claim: what an earlier agent of this node left is accounted for.
        await agent.reconcile()
        if registered is not None:
            registered.set()
        working = group.create_task(agent.run(), name="agent")
        stopping = asyncio.ensure_future(stop.wait())
        # Until asked to stop, or until the agent stops by itself (its lease was lost).
        await asyncio.wait({working, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        agent.stop()
        # The agent's learners have ended (and their jobs went back to the queue) before
        # the last lines are shipped and the listener closes.
        await working
        shipper.stop()
        await shipping
        listener.stop()
