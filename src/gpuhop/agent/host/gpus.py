"""Runs in the agent: finds the host's GPUs and reads their memory use, load and energy, live.

Discovery tries NVML first (the `nvidia-ml-py` package, imported as `pynvml`), then the
`nvidia-smi` program, and else reports no GPU; `--fake-gpus N` makes N made-up GPUs and
looks at no hardware (their load and faults come from a file: see `health.FakeGpuHost`).
The GPUs themselves (index, name, memory) are found once, at agent start; what they are
doing (and their faults) is read each time it is asked for, since other programs on the
host use them too.

Indices are NVML's, which follow the PCI bus order, as nvidia-smi's do; the supervisor sets
`CUDA_DEVICE_ORDER=PCI_BUS_ID` for jobs so that CUDA_VISIBLE_DEVICES means the same GPUs.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from gpuhop.agent.host.health import FakeGpuHost, NvmlHealth
from gpuhop.api import GpuInfo
from gpuhop.backends.base import Energy, Fault, GpuHost, Usage

log = logging.getLogger("gpuhop.agent")

FAKE_GPU_MEMORY_MB = 8192
SMI_TIMEOUT = 20.0


class _NvmlHost(GpuHost):
    def __init__(self, nvml: Any, **facts: Any):
        super().__init__("nvml", **facts)
        self._nvml = nvml
        self._health = NvmlHealth(nvml, [g.index for g in self.gpus])
        # GPUs without a total-energy counter (before Volta): their power is read instead.
        self._no_counter: set[int] = set()
        # Per GPU, the newest per-process utilisation sample seen (NVML's µs timestamp).
        self._util_seen: dict[int, int] = {}

    def usage(self) -> dict[int, Usage]:
        out = {}
        for gpu in self.gpus:
            memory: int | None = None
            util: int | None = None
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(gpu.index)
                memory = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used) // 2**20
                util = int(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except self._nvml.NVMLError:
                pass  # e.g. utilisation is not supported on this GPU (MIG): unknown
            out[gpu.index] = Usage(memory, util)
        return out

    def energy(self, indices: list[int]) -> dict[int, Energy]:
        nvml = self._nvml
        out = {}
        for index in indices:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError:
                continue
            if index not in self._no_counter:
                try:
                    out[index] = Energy(int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)))
                    continue
                except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
                    self._no_counter.add(index)  # asked once: the GPU or driver is too old
                except nvml.NVMLError:
                    continue  # this time only
            with contextlib.suppress(nvml.NVMLError):
                out[index] = Energy(None, int(nvml.nvmlDeviceGetPowerUsage(handle)))
        return out

    def process_utilization(self, index: int) -> dict[int, int] | None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._util_seen.get(index, 0))
        except nvml.NVMLError as e:
            # NOT_FOUND: no process sampled since the last call (pynvml raises even where
            # NVML answers "none" with SUCCESS); anything else: not told on this GPU.
            if getattr(e, "value", None) in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_SUCCESS):
                return {}
            return None
        out: dict[int, int] = {}
        for sample in samples:
            out[int(sample.pid)] = out.get(int(sample.pid), 0) + int(sample.smUtil)
            self._util_seen[index] = max(self._util_seen.get(index, 0), int(sample.timeStamp))
        return out

    def processes(self) -> dict[int, dict[int, int]]:
        out = {}
        for gpu in self.gpus:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(gpu.index)
                running = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except self._nvml.NVMLError:
                continue  # unknown on this GPU: its figure stays the whole GPU's
            # usedGpuMemory is None where the driver keeps it from us (some VMs, MIG).
            if all(p.usedGpuMemory is not None for p in running):
                out[gpu.index] = {int(p.pid): int(p.usedGpuMemory) // 2**20 for p in running}
        return out

    def faults(self) -> dict[int, Fault]:
        return self._health.faults()

    def close(self) -> None:
        self._health.close()
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


class _SmiHost(GpuHost):
    def __init__(self, exe: str, **facts: Any):
        super().__init__("nvidia-smi", **facts)
        self._exe = exe

    def usage(self) -> dict[int, Usage]:
        out = {g.index: Usage(None, None) for g in self.gpus}
        rows = _smi_query(self._exe, "index,memory.used,utilization.gpu")
        for index, used, util in rows or []:
            if _int(index) in out:
                out[int(index)] = Usage(_int(used), _int(util))
        return out


def discover(
    fake: int | None = None,
    fake_memory_mb: int = FAKE_GPU_MEMORY_MB,
    fake_models: str | None = None,
    fake_seam: Path | None = None,
) -> GpuHost:
    """The host's GPUs. `fake=N` returns N made-up GPUs and looks at no hardware;
    `fake_models` names each one's model, and optionally topology group, as
    "MODEL[@GROUP],..." (e.g. "A100@0,A100@0,V100,V100"); `fake_seam` is the file their
    load and faults are read from (see `health.FakeGpuHost`)."""
    if fake is not None:
        kinds = parse_fake_models(fake_models, fake)
        gpus = [
            GpuInfo(index=i, name=name, memory_mb=fake_memory_mb, group=group)
            for i, (name, group) in enumerate(kinds)
        ]
        return FakeGpuHost(gpus, fake_seam)
    nvml_error: str | None = None
    try:
        return _nvml_host()
    except _NoDriver:
        pass
    except Exception as e:  # NVML is there but failed: nvidia-smi may still answer
        nvml_error = f"NVML: {e}"
        log.warning("NVML failed (%s); trying nvidia-smi", e)
    host = _smi_host()
    if host.error is None and nvml_error is not None and host.source == "none":
        host.error = nvml_error
    return host


def parse_fake_models(spec: str | None, count: int) -> list[tuple[str, str | None]]:
    """Each fake GPU's (model, group) from "MODEL[@GROUP],..."; "Fake GPU" for all without."""
    if spec is None:
        return [("Fake GPU", None)] * count
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) != count or not all(parts):
        raise ValueError(
            f"--fake-gpu-models {spec!r}: give one non-empty MODEL[@GROUP] per fake GPU"
            f" ({count}), separated by commas"
        )
    out: list[tuple[str, str | None]] = []
    for part in parts:
        name, _, group = part.partition("@")
        out.append((name, group or None))
    return out


class _NoDriver(Exception):
    """No NVML library or no NVIDIA driver: a host without NVIDIA GPUs, not an error."""


def _nvml_host() -> GpuHost:
    try:
        import pynvml
    except ImportError:
        raise _NoDriver from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        raise _NoDriver from None  # a driver that is loaded but fails is reported instead
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append(
                GpuInfo(
                    index=i,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_mb=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20,
                )
            )
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        get_cuda = getattr(
            pynvml, "nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion
        )
        cuda = int(get_cuda())  # e.g. 12040 for 12.4
    except Exception:
        pynvml.nvmlShutdown()
        raise
    return _NvmlHost(
        pynvml,
        gpus=gpus,
        driver_version=driver,
        cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
    )


def _smi_host() -> GpuHost:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return GpuHost("none")
    rows = _smi_query(exe, "index,name,memory.total,driver_version")
    if rows is None:
        return GpuHost("none", error=f"{exe} is installed but failed; is the driver loaded?")
    gpus = []
    driver = None
    for index, name, total, driver_version in rows:
        if _int(index) is None or _int(total) is None:
            continue
        gpus.append(GpuInfo(index=int(index), name=name, memory_mb=int(total)))
        driver = driver_version
    if not gpus:
        return GpuHost("none", driver_version=driver)
    return _SmiHost(exe, gpus=gpus, driver_version=driver, cuda_version=_smi_cuda(exe))


def _smi_query(exe: str, fields: str) -> list[list[str]] | None:
    """nvidia-smi's answer to a --query-gpu, one list of fields per GPU; None if it failed."""
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    width = fields.count(",") + 1
    rows = [[p.strip() for p in line.split(",")] for line in out.splitlines()]
    return [r for r in rows if len(r) == width]


def _smi_cuda(exe: str) -> str | None:
    # Only the banner of a plain `nvidia-smi` says which CUDA the driver supports.
    try:
        out = subprocess.run(
            [exe], capture_output=True, text=True, timeout=SMI_TIMEOUT, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"CUDA Version:\s*([0-9.]+)", out)
    return match.group(1) if match else None


def _int(text: str) -> int | None:
    """A number from nvidia-smi, or None for "[N/A]", "[Not Supported]" and the like."""
    try:
        return int(float(text))
    except ValueError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
