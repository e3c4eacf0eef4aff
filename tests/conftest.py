"""A real Postgres for every test: a fresh database per test, cloned from a migrated template.

The server is chosen as the product chooses it (TRAINYARD_DATABASE_URL, else the embedded
Postgres under TRAINYARD_HOME), or a testcontainers Postgres with `--pg=container`.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiodocker
import asyncpg
import pytest

from controlplane.database import connect, create_pool, embedded_server_url, with_database
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.images import IMAGES_ENV
from controlplane.migrate import available, migrate
from controlplane.projections.runner import ProjectionRunner
from controlplane.settings import Settings
from controlplane.tenants.admin import bootstrap_admin_token
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import create_tenant
from harness.served import ServedControlPlane
from tests.cluster import TEST_IMAGES, Plane, RunningAgent, agent_config
from tests.docker_engine import (
    Engine,
    docker_agent_config,
    node_name,
    remove_containers_of,
    require_engine,
)
from tests.events import TEST_REGISTRY
from tests.tenancy import Cli, Tokens

MARKED_BY_FIXTURE = {
    "pg_server": "postgres",
    "docker_engine": "docker",
    "start_learner": "processes",
}
"""A test that uses one of these fixtures, however indirectly, needs what its marker names."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test by the fixtures it uses, so that no marker can be forgotten:
    `pytest -m "not postgres and not docker"` runs the pure tests only."""
    for item in items:
        for fixture, marker in MARKED_BY_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pg",
        choices=["default", "container"],
        default="default",
        help="default: TRAINYARD_DATABASE_URL or the embedded Postgres; "
        "container: a testcontainers Postgres (needs Docker and a local `postgres` image)",
    )


@pytest.fixture(scope="session", autouse=True)
def allowed_images() -> Iterator[None]:
    """Control planes the tests start, in process or as `trainyard serve`, allow the images
    the tests name."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(IMAGES_ENV, TEST_IMAGES)
        yield


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """A URL of the Postgres server the tests create their databases on."""
    if request.config.getoption("--pg") == "container":
        yield from _container_server()
        return
    settings = Settings.from_env()
    yield settings.database_url or embedded_server_url(settings)


def _container_server() -> Iterator[str]:
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True).returncode:
        pytest.skip("--pg=container: no Docker engine answers")
    if subprocess.run([docker, "image", "inspect", "postgres:16"], capture_output=True).returncode:
        pytest.skip("--pg=container: no local postgres:16 image (no registry to pull from)")
    from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:16", driver=None) as container:
        yield container.get_connection_url()


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> str:
    """A migrated database to clone; named by the migrations' checksum, so it is built once."""
    digest = hashlib.sha256("".join(m.checksum for m in available()).encode()).hexdigest()
    name = f"trainyard_template_{digest[:16]}"

    async def build() -> None:
        admin = await connect(pg_server, role=None)
        try:
            # Several test sessions may share the server: build the template under a lock.
            await admin.execute("SELECT pg_advisory_lock(hashtext($1))", name)
            exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
            if not exists:
                building = f"{name}_building"
                await admin.execute(f'DROP DATABASE IF EXISTS "{building}"')
                await admin.execute(f'CREATE DATABASE "{building}"')
                await migrate(with_database(pg_server, building))
                await admin.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
        finally:
            await admin.close()

    asyncio.run(build())
    return name


@asynccontextmanager
async def fresh_database(pg_server: str, template_db: str | None) -> AsyncIterator[str]:
    """A fresh database, dropped afterwards: cloned from the migrated template (cheap), or
    empty when `template_db` is None."""
    name = f"trainyard_test_{uuid.uuid4().hex[:12]}"
    template = f' TEMPLATE "{template_db}"' if template_db else ""
    admin = await connect(pg_server, role=None)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"{template}')
        yield with_database(pg_server, name)
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@asynccontextmanager
async def fresh_store(
    pg_server: str, template_db: str, *, pool_size: int
) -> AsyncIterator[tuple[str, asyncpg.Pool, EventStore]]:
    """A fresh migrated database, a pool of `pool_size` on it and the control plane's event
    store, closed and dropped afterwards: a property test's database per example (hypothesis
    runs many examples within one test)."""
    async with fresh_database(pg_server, template_db) as url:
        pool = await create_pool(url, min_size=1, max_size=pool_size)
        store = EventStore(pool, EVENT_REGISTRY)
        try:
            yield url, pool, store
        finally:
            await store.close()
            await pool.close()


@pytest.fixture
async def db_url(pg_server: str, template_db: str) -> AsyncIterator[str]:
    """A fresh migrated database for one test."""
    async with fresh_database(pg_server, template_db) as url:
        yield url


@pytest.fixture
async def empty_db_url(pg_server: str) -> AsyncIterator[str]:
    """A fresh database with no schema at all."""
    async with fresh_database(pg_server, None) as url:
        yield url


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(db_url, min_size=1, max_size=20)
    yield pool
    await pool.close()


@pytest.fixture
async def owner(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the schema's owner (not the application's role)."""
    conn = await connect(db_url, role=None)
    yield conn
    await conn.close()


@pytest.fixture
async def store(pool: asyncpg.Pool) -> AsyncIterator[EventStore]:
    store = EventStore(pool, TEST_REGISTRY)
    yield store
    await store.close()


@pytest.fixture
async def tokens(pool: asyncpg.Pool, store: EventStore, db_url: str, tmp_path: Path) -> Tokens:
    """Tokens of two tenants, acme and globex, and of the admin."""
    runner = ProjectionRunner(pool, store, LogListener(db_url), [TenantsProjection()])
    acme = await create_tenant(store, runner, "acme", actor="test")
    globex = await create_tenant(store, runner, "globex", actor="test")
    admin = await bootstrap_admin_token(store, runner, tmp_path)
    assert admin is not None
    return Tokens(acme.plaintext, globex.plaintext, admin)


@pytest.fixture
async def plane(pool: asyncpg.Pool, store: EventStore, db_url: str) -> AsyncIterator[Plane]:
    """Projections running and a job service, with tenant acme."""
    plane = Plane(pool, store, db_url)
    await create_tenant(store, plane.runner, "acme", actor="test")
    tasks = [asyncio.create_task(plane.listener.run()), asyncio.create_task(plane.runner.run())]
    yield plane
    plane.runner.stop()
    plane.listener.stop()
    plane.listener.wake()
    await asyncio.wait(tasks, timeout=5)


@pytest.fixture
async def agent(plane: Plane, tmp_path: Path) -> AsyncIterator[RunningAgent]:
    """A real agent, node n1 with two fake GPUs."""
    running = await RunningAgent(plane.url, agent_config(tmp_path), fake_gpus=2).started()
    yield running
    await running.finish()


@pytest.fixture
async def cli(db_url: str, tmp_path: Path) -> AsyncIterator[Cli]:
    """`trainyard tenants` against a served control plane on the test's database."""
    served = ServedControlPlane(db_url, tmp_path / "server")
    await served.start()
    yield Cli(served)
    await served.stop()


@pytest.fixture(scope="session")
def docker_engine() -> Engine:
    """A Docker engine with the project's images (see tests/docker_engine.py)."""
    return require_engine()


@pytest.fixture
async def docker(docker_engine: Engine) -> AsyncIterator[aiodocker.Docker]:
    async with aiodocker.Docker() as client:
        yield client


@pytest.fixture
def docker_node(docker_engine: Engine) -> Iterator[str]:
    """A node name of the test's own; its containers are removed afterwards, whatever the
    test left (the tests that promise to leave none check it themselves)."""
    name = node_name()
    yield name
    remove_containers_of(name)


@pytest.fixture
async def docker_agent(
    plane: Plane, tmp_path: Path, docker_engine: Engine, docker_node: str
) -> AsyncIterator[RunningAgent]:
    """A real agent with the Docker runtime and two fake GPUs."""
    config = docker_agent_config(tmp_path, docker_engine, name=docker_node)
    running = await RunningAgent(plane.url, config, fake_gpus=2).started()
    yield running
    await running.finish()
