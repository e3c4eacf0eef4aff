"""The node's GPUs: which it has, and whether each may take new work.

`NvmlInventory` reads real GPUs through NVML; `FakeInventory` stands in for them on machines
without GPUs (`--fake-gpus N`); `open_inventory` picks one when the agent starts.

Health is sticky. A GPU that has shown a critical XID or an uncorrected ECC error, or that has
been lost, stays unhealthy until the agent restarts: these faults need an operator (a reset, a
reboot, a replacement), and a GPU that flapped back to healthy would be handed to the next job
only to fail it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Protocol

import pynvml

# XIDs that the program running on the GPU causes (13 graphics engine exception, 31 memory page
# fault, 43 GPU stopped processing, 45 preemptive cleanup after those, 68 video processor
# exception, 109 context switch timeout). NVIDIA's Kubernetes device plugin ignores the same
# set: the GPU itself is fine, and since learners run arbitrary user code, letting these take a
# GPU out for good would let one buggy job drain a node.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

# gpus() runs on every heartbeat, so one poll takes a bounded number of events; an event storm
# is finished on the next poll instead of stalling the heartbeat.
_MAX_EVENTS_PER_POLL = 256

_MIB = 1024 * 1024

# Fake UUIDs are uuid5 names in this namespace, so they look like real ones and are stable.
_FAKE_GPU_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "trainyard:fake-gpu")


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as the node offers it. `memory_mb` is 0 where the GPU does not report its memory.
    `health_reason` says why an unhealthy GPU is unhealthy: `xid <n>`, `uncorrected ecc <n>`,
    `lost`, or `nvml events failed`."""

    index: int
    uuid: str
    model: str
    memory_mb: int
    healthy: bool
    health_reason: str | None


class GpuInventory(Protocol):
    """What the agent needs to know about its GPUs. Implementations are safe to call from any
    thread; their calls block briefly (a few NVML queries per GPU at most)."""

    def gpus(self) -> list[Gpu]:
        """The GPUs with their current health, by index. Cheap enough for every heartbeat."""

    def utilization(self) -> dict[str, int]:
        """GPU UUID -> percent of recent time a kernel was running, for metrics."""

    def close(self) -> None:
        """Release the inventory's resources; it may not be used afterwards."""


class FakeInventory:
    """`count` healthy GPUs that do not exist, for machines without GPUs.

    UUIDs derive from the node name and the index, so they are stable across agent restarts and
    two fake nodes never offer the same UUID (the control plane keeps GPU UUIDs unique)."""

    def __init__(
        self,
        count: int,
        *,
        node: str,
        model: str = "Fake GPU",
        memory_mb: int = 81920,
    ) -> None:
        if count < 0:
            raise ValueError(f"a node cannot have {count} fake GPUs")
        self._gpus = [
            Gpu(
                index=index,
                uuid=f"GPU-{uuid.uuid5(_FAKE_GPU_NAMESPACE, f'{node}:{index}')}",
                model=model,
                memory_mb=memory_mb,
                healthy=True,
                health_reason=None,
            )
            for index in range(count)
        ]
        # Fault injection and the agent may run on different threads.
        self._lock = threading.Lock()

    def gpus(self) -> list[Gpu]:
        with self._lock:
            return list(self._gpus)

    def utilization(self) -> dict[str, int]:
        with self._lock:
            return {gpu.uuid: 0 for gpu in self._gpus}

    def mark_unhealthy(self, gpu_uuid: str, reason: str) -> None:
        """Make a GPU unhealthy as a real fault would; like a real fault, it stays so and keeps
        its first reason. Raises KeyError for a UUID this inventory does not have."""
        with self._lock:
            for position, gpu in enumerate(self._gpus):
                if gpu.uuid == gpu_uuid:
                    if gpu.healthy:
                        self._gpus[position] = dataclasses.replace(
                            gpu, healthy=False, health_reason=reason
                        )
                    return
        raise KeyError(gpu_uuid)

    def close(self) -> None:
        """Nothing to release."""


class EmptyInventory:
    """No GPUs: what a node offers when NVML is unavailable and no fake GPUs were asked for."""

    def gpus(self) -> list[Gpu]:
        return []

    def utilization(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        """Nothing to release."""


@dataclass(slots=True)
class _Device:
    index: int
    uuid: str
    model: str
    memory_mb: int
    handle: object  # pynvml's device handle, valid until nvmlShutdown
    has_ecc: bool = True


class NvmlInventory:
    """The GPUs NVML sees when the agent starts, with health checked on every `gpus()` call:
    critical XIDs from an NVML event set, volatile uncorrected ECC counters, and whether the GPU
    still answers. Raises pynvml.NVMLError when NVML cannot start (no library, no driver).

    GPUs are named by UUID, which is what learners must be pinned by: NVML's index order is PCI
    bus order, which CUDA's default order need not follow."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._closed = False
        self._unhealthy: dict[str, str] = {}
        pynvml.nvmlInit()
        try:
            self._devices = self._enumerate()
        except pynvml.NVMLError:
            pynvml.nvmlShutdown()
            raise
        self._events = self._watch_xids()

    def _enumerate(self) -> list[_Device]:
        devices: list[_Device] = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                devices.append(
                    _Device(
                        index=index,
                        uuid=str(pynvml.nvmlDeviceGetUUID(handle)),
                        model=str(pynvml.nvmlDeviceGetName(handle)),
                        memory_mb=_total_memory_mb(handle),
                        handle=handle,
                    )
                )
            except pynvml.NVMLError as err:
                # A GPU that cannot be described now can be neither registered nor pinned; it is
                # left out, loudly, for the operator to look at.
                self._log.error(
                    "GPU %d does not answer NVML (%s); this node does not offer it", index, err
                )
        return devices

    def _watch_xids(self) -> object | None:
        try:
            events: object = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as err:
            self._log.warning(
                "NVML cannot report XID errors here (%s); GPU health rests on ECC counters "
                "and loss checks alone",
                err,
            )
            return None
        for device in self._devices:
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    device.handle, pynvml.nvmlEventTypeXidCriticalError, events
                )
            except pynvml.NVMLError as err:
                self._log.warning(
                    "GPU %d (%s) cannot report XID errors (%s); its health rests on ECC "
                    "counters and loss checks alone",
                    device.index,
                    device.uuid,
                    err,
                )
        return events

    def gpus(self) -> list[Gpu]:
        with self._lock:
            self._check_open()
            # Probing before draining events names a lost GPU `lost` rather than by the XID
            # its fall off the bus also raises.
            for device in self._devices:
                if device.uuid not in self._unhealthy:
                    self._probe(device)
            self._drain_xid_events()
            return [
                Gpu(
                    index=device.index,
                    uuid=device.uuid,
                    model=device.model,
                    memory_mb=device.memory_mb,
                    healthy=device.uuid not in self._unhealthy,
                    health_reason=self._unhealthy.get(device.uuid),
                )
                for device in self._devices
            ]

    def utilization(self) -> dict[str, int]:
        with self._lock:
            self._check_open()
            percent: dict[str, int] = {}
            for device in self._devices:
                # Metrics are best effort: a GPU that cannot say (unsupported, or lost, which
                # gpus() reports) is left out.
                with contextlib.suppress(pynvml.NVMLError):
                    percent[device.uuid] = int(
                        pynvml.nvmlDeviceGetUtilizationRates(device.handle).gpu
                    )
            return percent

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._events is not None:
                # The event set dies with the NVML session anyway; freeing it is tidiness.
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(self._events)
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as err:
                self._log.warning("NVML did not shut down cleanly: %s", err)

    def _check_open(self) -> None:
        # After nvmlShutdown every query fails, which would read as every GPU lost.
        if self._closed:
            raise RuntimeError("the GPU inventory is closed")

    def _probe(self, device: _Device) -> None:
        try:
            # Once a GPU has fallen off the bus, queries to it fail. The memory query is the
            # liveness check because GPUs answer it with or without ECC; "not supported" is an
            # answer too.
            with contextlib.suppress(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetMemoryInfo(device.handle)
            errors = self._uncorrected_ecc_errors(device)
        except pynvml.NVMLError as err:
            self._mark(device, "lost", err)
            return
        if errors > 0:
            self._mark(device, f"uncorrected ecc {errors}")

    def _uncorrected_ecc_errors(self, device: _Device) -> int:
        if not device.has_ecc:
            return 0
        try:
            # Volatile: counted since the driver loaded, so a reboot after repair clears it.
            return int(
                pynvml.nvmlDeviceGetTotalEccErrors(
                    device.handle,
                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    pynvml.NVML_VOLATILE_ECC,
                )
            )
        except pynvml.NVMLError_NotSupported:
            # No ECC on this GPU, or ECC disabled (changing that takes a reboot): stop asking.
            device.has_ecc = False
            return 0

    def _drain_xid_events(self) -> None:
        if self._events is None:
            return
        for _ in range(_MAX_EVENTS_PER_POLL):
            try:
                event = pynvml.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError_Timeout:
                return
            except pynvml.NVMLError as err:
                # As NVIDIA's device plugin does: without the event stream a critical XID would
                # go unseen, and failing jobs on a faulty GPU costs more than idling good ones.
                for device in self._devices:
                    self._mark(device, "nvml events failed", err)
                return
            self._on_xid(int(event.eventData), event.device)

    def _on_xid(self, xid: int, handle: object) -> None:
        try:
            source: str | None = str(pynvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError:
            source = None
        if xid in APPLICATION_XIDS:
            self._log.info(
                "GPU %s reported XID %d, an error of the program running on it; the GPU stays "
                "healthy",
                source or "(unidentified)",
                xid,
            )
            return
        if source is None:
            # A fault that cannot be placed on one GPU may be on any of them.
            for device in self._devices:
                self._mark(device, f"xid {xid}", "reported for a GPU NVML could not identify")
            return
        for device in self._devices:
            if device.uuid == source:
                self._mark(device, f"xid {xid}")
                return
        self._log.warning("GPU %s, which this node does not offer, reported XID %d", source, xid)

    def _mark(self, device: _Device, reason: str, cause: object = None) -> None:
        if device.uuid in self._unhealthy:
            return
        self._unhealthy[device.uuid] = reason
        self._log.error(
            "GPU %d (%s) is unhealthy: %s%s; it takes no new work until the agent restarts",
            device.index,
            device.uuid,
            reason,
            "" if cause is None else f" ({cause})",
        )


def _total_memory_mb(handle: object) -> int:
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
    except pynvml.NVMLError_NotSupported:
        # Some products (those sharing memory with the CPU) do not report it: 0 means unknown.
        return 0


def open_inventory(fake_gpus: int | None, node: str, log: logging.Logger) -> GpuInventory:
    """The inventory the agent runs with: `fake_gpus` fake GPUs when given (`--fake-gpus`), else
    the GPUs NVML sees, else none; a node without GPUs says so once, here."""
    if fake_gpus is not None:
        fake = FakeInventory(fake_gpus, node=node)
        log.info("offering %d fake GPUs (--fake-gpus); learners get no real GPU", fake_gpus)
        return fake
    try:
        inventory = NvmlInventory(log)
    except pynvml.NVMLError as err:
        log.warning(
            "NVML is unavailable (%s): this node offers zero GPUs; start the agent with "
            "--fake-gpus N to offer N fake GPUs instead",
            err,
        )
        return EmptyInventory()
    gpus = inventory.gpus()
    if gpus:
        log.info("NVML sees %d GPUs: %s", len(gpus), ", ".join(gpu.uuid for gpu in gpus))
    else:
        log.warning("NVML sees no GPUs: this node offers zero GPUs")
    return inventory
