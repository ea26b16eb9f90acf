"""Runs in the agent: each GPU's hardware health, read through NVML, or from the fake-GPU
testing seam.

What counts as a fault (the GPU is then quarantined: see `gpuhop.agent.duties.gpuhealth`):
- an XID error the driver reports as a hardware or driver failure (XID 79, "fell off the
  bus"; 48, 94 and 95, uncorrectable ECC; 63 and 64, page retirement; 74, NVLink; 119 and
  120, GSP). XIDs that a job's own bug causes (13, 31, 43: an illegal memory access) are not
  faults: a job must not be able to take a GPU out of service.
- uncorrectable (double-bit) ECC errors since the driver loaded (the volatile count);
- retired pages pending a reset, or a row remap pending or failed (A100 and later);
- a GPU that answers NVML with GPU_IS_LOST.

The fake seam: an agent started with `--fake-gpus` reads `fake-gpus.json` in its state dir
(see `FakeGpuHost`) each time it looks, so tests (and demos) can give a fake GPU a load,
energy readings that move, or a fault. Jobs never see that dir.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from gpuhop.api import GpuInfo
from gpuhop.backends.base import Energy, Fault, GpuHost, Usage

log = logging.getLogger("gpuhop.agent")

# XIDs of a hardware or driver failure (NVIDIA's XID catalogue); others are the job's own.
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
_XID_WORDS = {
    48: "uncorrectable ECC error",
    63: "page retirement or row remap",
    64: "page retirement or row remap failed",
    74: "NVLink error",
    79: "GPU fell off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
}


def describe(
    *,
    xid: int | None = None,
    ecc_uncorrected: int | None = None,
    pages_pending: bool = False,
    lost: bool = False,
) -> Fault | None:
    """The fault these readings of one GPU show (the gravest first), or None."""
    if lost:
        return Fault("lost", "the GPU fell off the bus (NVML: GPU is lost)")
    if xid is not None and xid in HARDWARE_XIDS:
        words = _XID_WORDS.get(xid, "hardware or driver failure")
        return Fault("xid", f"XID {xid} ({words})")
    if ecc_uncorrected:
        return Fault("ecc", f"{ecc_uncorrected} uncorrectable ECC error(s) since the driver loaded")
    if pages_pending:
        return Fault("retired-pages", "retired or remapped memory pages pending a GPU reset")
    return None


class FakeGpuHost(GpuHost):
    """Made-up GPUs (`--fake-gpus`). Their load, energy and faults come from `seam`, a JSON
    file read each time it is asked (missing: all idle and healthy, no energy readings), e.g.

        {"0": {"utilization": 80}, "1": {"xid": 79}, "2": {"ecc_uncorrected": 2},
         "3": {"pages_pending": true}, "4": {"lost": true},
         "5": {"processes": {"4242": 3072}},
         "6": {"energy_mj": 123456, "process_utilization": {"4242": 75, "4343": 25}},
         "7": {"power_mw": 250000}}

    ("processes": host pid -> MiB it holds, as NVML tells them; "energy_mj": the GPU's
    total-energy counter, "power_mw" its power draw, read where it has no counter;
    "process_utilization": host pid -> its load since the last look. A GPU without
    "energy_mj" or "power_mw" reads as one without NVML's energy readings.)
    """

    def __init__(self, gpus: list[GpuInfo], seam: Path | None):
        super().__init__("fake", gpus)
        self.seam = seam

    def _readings(self) -> dict[int, dict[str, Any]]:
        if self.seam is None:
            return {}
        try:
            data = json.loads(self.seam.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("cannot read %s (%s); fake GPUs read as idle and healthy", self.seam, e)
            return {}
        out: dict[int, dict[str, Any]] = {}
        if isinstance(data, dict):
            for key, value in data.items():
                with contextlib.suppress(ValueError):
                    if isinstance(value, dict):
                        out[int(key)] = value
        return out

    def usage(self) -> dict[int, Usage]:
        readings = self._readings()
        out = {}
        for gpu in self.gpus:
            util = readings.get(gpu.index, {}).get("utilization", 0)
            out[gpu.index] = Usage(0, util if isinstance(util, int) else None)
        return out

    def processes(self) -> dict[int, dict[int, int]]:
        out = {}
        for index, r in self._readings().items():
            held = r.get("processes")
            if isinstance(held, dict):
                with contextlib.suppress(TypeError, ValueError):
                    out[index] = {int(pid): int(mb) for pid, mb in held.items()}
        return out

    def energy(self, indices: list[int]) -> dict[int, Energy]:
        out = {}
        for index, r in self._readings().items():
            try:
                reading = Energy(_opt_int(r.get("energy_mj")), _opt_int(r.get("power_mw")))
            except (TypeError, ValueError):
                log.warning("fake GPU %d: cannot read %r from %s", index, r, self.seam)
                continue
            if index in indices and reading != Energy(None, None):
                out[index] = reading if reading.total_mj is None else Energy(reading.total_mj)
        return out

    def process_utilization(self, index: int) -> dict[int, int] | None:
        held = self._readings().get(index, {}).get("process_utilization")
        if not isinstance(held, dict):
            return None
        try:
            return {int(pid): int(load) for pid, load in held.items()}
        except (TypeError, ValueError):
            return None

    def faults(self) -> dict[int, Fault]:
        out = {}
        for index, r in self._readings().items():
            try:
                fault = describe(
                    xid=_opt_int(r.get("xid")),
                    ecc_uncorrected=_opt_int(r.get("ecc_uncorrected")),
                    pages_pending=bool(r.get("pages_pending")),
                    lost=bool(r.get("lost")),
                )
            except (TypeError, ValueError):
                log.warning("fake GPU %d: cannot read %r from %s", index, r, self.seam)
                continue
            if fault is not None and any(g.index == index for g in self.gpus):
                out[index] = fault
        return out


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


class NvmlHealth:
    """Reads the faults of real GPUs through NVML (the `pynvml` module of nvidia-ml-py).

    XID errors arrive as events: a set is registered once for every GPU that supports it,
    and each `faults()` drains what came since the last. Counts and flags are read each
    time; a reading a GPU does not support is skipped.
    """

    def __init__(self, nvml: Any, indices: list[int]):
        self._nvml = nvml
        self._indices = indices
        self._events: Any = None
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as e:
            log.info("NVML events unavailable (%s): XID errors are not watched", e)
            return
        for index in indices:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            except nvml.NVMLError as e:
                log.info("GPU %d: XID events unavailable (%s)", index, e)
        self._events = events

    def faults(self) -> dict[int, Fault]:
        xids = self._drain_xids()
        out = {}
        for index in self._indices:
            fault = self._read(index, xids.get(index))
            if fault is not None:
                out[index] = fault
        return out

    def close(self) -> None:
        if self._events is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(self._events)
            self._events = None

    def _drain_xids(self) -> dict[int, int]:
        nvml = self._nvml
        seen: dict[int, int] = {}
        if self._events is None:
            return seen
        for _ in range(1000):  # a storm of events must not hold the duty for ever
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError:
                break  # NVML_ERROR_TIMEOUT: nothing more
            try:
                index = int(nvml.nvmlDeviceGetIndex(data.device))
            except nvml.NVMLError:
                continue
            xid = int(data.eventData)
            if xid in HARDWARE_XIDS or index not in seen:
                seen[index] = xid
        return seen

    def _read(self, index: int, xid: int | None) -> Fault | None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            nvml.nvmlDeviceGetMemoryInfo(handle)  # a lost GPU fails any query
        except nvml.NVMLError as e:
            if getattr(e, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
                return describe(lost=True)
            return describe(xid=xid)
        ecc = _try(
            nvml,
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        )
        pending = _try(nvml, lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        remap = _try(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        remap_bad = bool(remap and (remap[2] or remap[3]))  # pending, or failure occurred
        return describe(
            xid=xid,
            ecc_uncorrected=int(ecc) if ecc else None,
            pages_pending=bool(pending == nvml.NVML_FEATURE_ENABLED) or remap_bad,
        )


def _try(nvml: Any, read: Any) -> Any:
    """A reading, or None where the GPU does not support it."""
    try:
        return read()
    except nvml.NVMLError:
        return None
