"""Users' warm uids (node_agent/users.py) over the in-memory port: an agent that is root holds,
hands on and gives back uids of its range; one that is not has none to hold."""

from __future__ import annotations

from controlplane.agent_port.memory import MemoryPort
from node_agent.users import UidRange, Users
from tests.controlplane.agent_port.test_contract import manifest, node


async def test_a_root_agent_s_warm_uid_becomes_the_claimed_job_s() -> None:
    port = MemoryPort()
    users = Users(port, UidRange(300000, 3), root=True)
    await port.register(node("n1", 1), ttl_s=60)
    job_id = port.submit("acme", manifest())
    warm = await users.hold_warm("n1")
    assert warm is not None and warm.uid in range(300000, 300003)
    (won,) = await port.claim("n1", uids=users.claimed)
    assert won.job.job_id == job_id
    assert await users.of(job_id) != (warm.uid, warm.uid)  # the claim's own uid
    assert await users.adopt_warm(job_id, "n1", warm.placeholder, job_id) == warm.uid
    assert await users.of(job_id) == (warm.uid, warm.uid)
    spare = await users.hold_warm("n1")
    assert spare is not None
    assert await users.release_warm("n1", [spare.placeholder]) == 1
    assert await users.release_warm("n1") == 0  # the adopted one is the job's


async def test_an_agent_that_is_not_root_holds_no_warm_uid() -> None:
    port = MemoryPort()
    users = Users(port, UidRange(300000, 3), root=False)
    await port.register(node("n1", 1), ttl_s=60)
    job_id = port.submit("acme", manifest())
    await port.claim("n1", uids=users.claimed)
    assert await users.hold_warm("n1") is None
    assert await users.adopt_warm(job_id, "n1", job_id, job_id) is None
    assert await users.release_warm("n1") == 0
    assert await port.allocate_uid(job_id, range(300000, 300003)) == 300000  # all still free
