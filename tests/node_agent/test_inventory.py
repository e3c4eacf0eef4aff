"""GPU inventory: fake GPUs, allocation, the no-GPU fallback and NVML health.

NVML's health logic is driven here through a simulated driver that replaces pynvml's functions
(the third-party boundary, raising pynvml's own error classes), so XIDs, ECC errors and lost
GPUs are tested on machines without GPUs; `test_nvml_real_gpus` checks the real thing where NVML
works.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml
import pytest

from controlplane.scheduling.placement import allocatable
from node_agent.inventory import (
    FakeInventory,
    Gpu,
    NvmlInventory,
    open_inventory,
)

UUID_FORMAT = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
LOG = logging.getLogger("tests.inventory")


def _nvml_unavailable() -> str | None:
    """Why NVML cannot start on this machine, or None when it can."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return str(err)
    pynvml.nvmlShutdown()
    return None


NVML_UNAVAILABLE = _nvml_unavailable()


def _gpu(index: int, *, healthy: bool = True) -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-{index}",
        model="m",
        memory_mb=1,
        healthy=healthy,
        health_reason=None if healthy else "lost",
    )


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


# --- fake GPUs and allocation -------------------------------------------------------------------


def test_fake_inventory_offers_healthy_gpus_by_index() -> None:
    inventory = FakeInventory(4, node="node-a", model="Fake H100", memory_mb=1024)

    gpus = inventory.gpus()

    assert [gpu.index for gpu in gpus] == [0, 1, 2, 3]
    assert all(UUID_FORMAT.fullmatch(gpu.uuid) for gpu in gpus)
    assert len({gpu.uuid for gpu in gpus}) == 4
    assert {(gpu.model, gpu.memory_mb, gpu.healthy, gpu.health_reason) for gpu in gpus} == {
        ("Fake H100", 1024, True, None)
    }
    assert inventory.utilization() == {gpu.uuid: 0 for gpu in gpus}
    assert FakeInventory(0, node="node-a").gpus() == []


def test_fake_uuids_are_stable_per_node_and_distinct_across_nodes() -> None:
    def uuids(node: str) -> list[str]:
        return [gpu.uuid for gpu in FakeInventory(8, node=node).gpus()]

    assert uuids("node-a") == uuids("node-a")
    assert not set(uuids("node-a")) & set(uuids("node-b"))
    # Joining node and index must not make ("a:1", 2) collide with ("a", ...).
    assert not set(uuids("a")) & set(uuids("a:1"))


def test_fake_unhealthy_gpu_stays_unhealthy_with_its_first_reason() -> None:
    inventory = FakeInventory(3, node="node-a")
    victim = inventory.gpus()[1].uuid

    inventory.mark_unhealthy(victim, "xid 79")
    inventory.mark_unhealthy(victim, "lost")

    assert [(gpu.healthy, gpu.health_reason) for gpu in inventory.gpus()] == [
        (True, None),
        (False, "xid 79"),
        (True, None),
    ]
    assert [gpu.index for gpu in allocatable(inventory.gpus(), set())] == [0, 2]
    with pytest.raises(KeyError):
        inventory.mark_unhealthy("GPU-not-here", "lost")


def test_fake_inventory_refuses_a_negative_count() -> None:
    with pytest.raises(ValueError):
        FakeInventory(-1, node="node-a")


def test_allocatable_is_healthy_and_unallocated_by_index() -> None:
    gpus = [_gpu(3), _gpu(0), _gpu(2, healthy=False), _gpu(1), _gpu(4)]

    assert [gpu.index for gpu in allocatable(gpus, {"GPU-1"})] == [0, 3, 4]
    assert [gpu.index for gpu in allocatable(gpus, frozenset())] == [0, 1, 3, 4]
    assert allocatable([], set()) == []


# --- open_inventory -----------------------------------------------------------------------------


def test_open_inventory_with_fake_gpus(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)

    inventory = open_inventory(2, "node-a", LOG)

    assert [gpu.uuid for gpu in inventory.gpus()] == [
        gpu.uuid for gpu in FakeInventory(2, node="node-a").gpus()
    ]
    assert _warnings(caplog) == []
    assert len(open_inventory(0, "node-a", LOG).gpus()) == 0
    assert _warnings(caplog) == []


@pytest.mark.skipif(
    NVML_UNAVAILABLE is None, reason="NVML works here; this test needs a machine without it"
)
def test_open_inventory_without_nvml_offers_zero_gpus_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)

    inventory = open_inventory(None, "node-a", LOG)
    for _ in range(3):
        assert inventory.gpus() == []
    assert inventory.utilization() == {}
    inventory.close()

    [warning] = _warnings(caplog)
    assert "zero GPUs" in warning
    assert "--fake-gpus" in warning
    assert str(NVML_UNAVAILABLE) in warning


@pytest.mark.skipif(
    NVML_UNAVAILABLE is not None, reason=f"NVML is unavailable here: {NVML_UNAVAILABLE}"
)
def test_nvml_real_gpus() -> None:
    inventory = open_inventory(None, "node-a", LOG)
    try:
        gpus = inventory.gpus()
        assert isinstance(inventory, NvmlInventory)
        assert [gpu.index for gpu in gpus] == list(range(len(gpus)))
        assert len({gpu.uuid for gpu in gpus}) == len(gpus)
        for gpu in gpus:
            assert gpu.uuid.startswith("GPU-")
            assert gpu.model
            assert gpu.memory_mb > 0
            assert gpu.healthy, gpu.health_reason
        assert set(inventory.utilization()) <= {gpu.uuid for gpu in gpus}
        assert all(0 <= percent <= 100 for percent in inventory.utilization().values())
    finally:
        inventory.close()


# --- NVML health, through a simulated driver ----------------------------------------------------


@dataclass
class SimGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_bytes: int | None = 80 * 1024**3  # None: the GPU does not report its memory
    ecc_errors: int | None = 0  # None: the GPU has no ECC
    lost: bool = False
    unreadable_at_start: bool = False
    utilization: int = 40


def _nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class SimulatedNvml:
    """pynvml's functions as the inventory calls them, backed by simulated GPUs."""

    gpus: list[SimGpu]
    init_error: int | None = None
    events_supported: bool = True
    wait_error: int | None = None
    pending: deque[tuple[SimGpu | None, int]] = field(default_factory=deque)
    sessions: int = 0
    registered: list[str] = field(default_factory=list)
    event_set_freed: bool = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> SimulatedNvml:
        for name in (
            "nvmlInit",
            "nvmlShutdown",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetUtilizationRates",
            "nvmlEventSetCreate",
            "nvmlDeviceRegisterEvents",
            "nvmlEventSetWait_v2",
            "nvmlEventSetFree",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))
        return self

    def xid(self, gpu: SimGpu | None, xid: int) -> None:
        """Queue an XID event; None stands for a device NVML cannot identify."""
        self.pending.append((gpu, xid))

    @staticmethod
    def _reach(handle: SimGpu) -> SimGpu:
        if handle.lost:
            raise _nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _nvml_error(self.init_error)
        self.sessions += 1

    def nvmlShutdown(self) -> None:
        self.sessions -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimGpu:
        if self.gpus[index].unreadable_at_start:
            raise _nvml_error(pynvml.NVML_ERROR_UNKNOWN)
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: SimGpu | None) -> str:
        if handle is None:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.uuid

    def nvmlDeviceGetName(self, handle: SimGpu) -> str:
        return self._reach(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: SimGpu) -> SimpleNamespace:
        total = self._reach(handle).memory_bytes
        if total is None:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(total=total)

    def nvmlDeviceGetTotalEccErrors(self, handle: SimGpu, error_type: int, counter: int) -> int:
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter == pynvml.NVML_VOLATILE_ECC
        errors = self._reach(handle).ecc_errors
        if errors is None:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return errors

    def nvmlDeviceGetUtilizationRates(self, handle: SimGpu) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._reach(handle).utilization, memory=0)

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: SimGpu, types: int, event_set: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        assert event_set == "event-set"
        if not self.events_supported:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append(handle.uuid)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0, "a heartbeat must never wait for events"
        if self.wait_error is not None:
            raise _nvml_error(self.wait_error)
        if not self.pending:
            raise _nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        device, xid = self.pending.popleft()
        return SimpleNamespace(
            device=device, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
        )

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.event_set_freed = True


def _simulate(
    monkeypatch: pytest.MonkeyPatch,
    count: int = 3,
    *,
    init_error: int | None = None,
    events_supported: bool = True,
) -> SimulatedNvml:
    gpus = [SimGpu(uuid=f"GPU-00000000-0000-0000-0000-00000000000{i}") for i in range(count)]
    nvml = SimulatedNvml(gpus, init_error=init_error, events_supported=events_supported)
    return nvml.install(monkeypatch)


def _health(inventory: NvmlInventory) -> list[str | None]:
    """Each GPU's health reason, None while healthy."""
    gpus = inventory.gpus()
    assert all(gpu.healthy == (gpu.health_reason is None) for gpu in gpus)
    return [gpu.health_reason for gpu in gpus]


def test_nvml_reads_gpus_and_watches_each_for_xids(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _simulate(monkeypatch)
    nvml.gpus[2].ecc_errors = None

    inventory = NvmlInventory(LOG)
    gpus = inventory.gpus()

    assert gpus == [
        Gpu(i, sim.uuid, "NVIDIA H100 80GB HBM3", 81920, True, None)
        for i, sim in enumerate(nvml.gpus)
    ]
    assert nvml.registered == [sim.uuid for sim in nvml.gpus]
    assert inventory.utilization() == {sim.uuid: 40 for sim in nvml.gpus}


def test_nvml_gpu_without_memory_or_ecc_reports_is_healthy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = _simulate(monkeypatch, count=1)
    nvml.gpus[0].memory_bytes = None
    nvml.gpus[0].ecc_errors = None
    inventory = NvmlInventory(LOG)

    [gpu] = inventory.gpus()

    assert (gpu.memory_mb, gpu.healthy) == (0, True)
    assert _health(inventory) == [None]
    nvml.gpus[0].lost = True
    assert _health(inventory) == ["lost"]


def test_nvml_critical_xid_makes_its_gpu_unhealthy_for_good(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = _simulate(monkeypatch)
    inventory = NvmlInventory(LOG)

    nvml.xid(nvml.gpus[1], 79)
    assert _health(inventory) == [None, "xid 79", None]
    nvml.xid(nvml.gpus[1], 48)
    assert _health(inventory) == [None, "xid 79", None]
    assert [gpu.index for gpu in allocatable(inventory.gpus(), set())] == [0, 2]
    [error] = _errors(caplog)
    assert nvml.gpus[1].uuid in error
    assert "xid 79" in error


def test_nvml_application_xids_leave_the_gpu_healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _simulate(monkeypatch)
    inventory = NvmlInventory(LOG)

    for xid in (13, 31, 43, 45, 68, 109):
        nvml.xid(nvml.gpus[0], xid)
    nvml.xid(None, 31)

    assert _health(inventory) == [None, None, None]


def test_nvml_xid_on_an_unidentified_gpu_makes_every_gpu_unhealthy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = _simulate(monkeypatch)
    inventory = NvmlInventory(LOG)

    nvml.xid(None, 79)

    assert _health(inventory) == ["xid 79", "xid 79", "xid 79"]


def test_nvml_uncorrected_ecc_errors_make_the_gpu_unhealthy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = _simulate(monkeypatch)
    nvml.gpus[2].ecc_errors = None
    inventory = NvmlInventory(LOG)
    assert _health(inventory) == [None, None, None]

    nvml.gpus[0].ecc_errors = 2
    assert _health(inventory) == ["uncorrected ecc 2", None, None]
    nvml.gpus[0].ecc_errors = 0
    assert _health(inventory) == ["uncorrected ecc 2", None, None]


def test_nvml_lost_gpu_is_unhealthy_for_good(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = _simulate(monkeypatch)
    inventory = NvmlInventory(LOG)

    nvml.gpus[1].lost = True
    nvml.xid(nvml.gpus[1], 79)
    assert _health(inventory) == [None, "lost", None]
    assert set(inventory.utilization()) == {nvml.gpus[0].uuid, nvml.gpus[2].uuid}

    nvml.gpus[1].lost = False
    assert _health(inventory) == [None, "lost", None]
    [error] = _errors(caplog)
    assert "GPU is lost" in error


def test_nvml_event_failure_makes_every_gpu_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _simulate(monkeypatch, count=2)
    inventory = NvmlInventory(LOG)

    nvml.wait_error = pynvml.NVML_ERROR_UNKNOWN

    assert _health(inventory) == ["nvml events failed", "nvml events failed"]


def test_nvml_without_xid_events_still_checks_ecc(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = _simulate(monkeypatch, count=2, events_supported=False)
    inventory = NvmlInventory(LOG)

    assert _health(inventory) == [None, None]
    assert len(_warnings(caplog)) == 2
    nvml.gpus[1].ecc_errors = 1
    assert _health(inventory) == [None, "uncorrected ecc 1"]


def test_nvml_leaves_out_a_gpu_it_cannot_read_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = _simulate(monkeypatch)
    nvml.gpus[1].unreadable_at_start = True

    inventory = NvmlInventory(LOG)

    assert [(gpu.index, gpu.uuid) for gpu in inventory.gpus()] == [
        (0, nvml.gpus[0].uuid),
        (2, nvml.gpus[2].uuid),
    ]
    [error] = _errors(caplog)
    assert "GPU 1" in error


def test_nvml_close_ends_the_session_once(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _simulate(monkeypatch)
    inventory = NvmlInventory(LOG)
    assert nvml.sessions == 1

    inventory.close()
    inventory.close()

    assert nvml.sessions == 0
    assert nvml.event_set_freed
    with pytest.raises(RuntimeError):
        inventory.gpus()


def test_open_inventory_when_nvml_fails_to_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _simulate(monkeypatch, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    inventory = open_inventory(None, "node-a", LOG)

    assert inventory.gpus() == []
    [warning] = _warnings(caplog)
    assert "Driver Not Loaded" in warning
    assert "zero GPUs" in warning


def test_open_inventory_when_nvml_sees_no_gpus(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _simulate(monkeypatch, count=0)

    inventory = open_inventory(None, "node-a", LOG)

    assert inventory.gpus() == []
    [warning] = _warnings(caplog)
    assert "zero GPUs" in warning
    inventory.close()


def test_open_inventory_with_nvml(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = _simulate(monkeypatch, count=2)

    inventory = open_inventory(None, "node-a", LOG)

    assert isinstance(inventory, NvmlInventory)
    assert [gpu.uuid for gpu in inventory.gpus()] == [sim.uuid for sim in nvml.gpus]
    assert _warnings(caplog) == []
    inventory.close()
