"""Runs in the agent: finds the host's GPUs (nvidia-smi), or makes fake ones for tests."""

from __future__ import annotations

import shutil
import subprocess

from gpuhop.api import GpuInfo


def discover(fake: int | None = None, fake_memory_mb: int = 8192) -> list[GpuInfo]:
    """Return the host's GPUs. `fake=N` returns N made-up GPUs and looks at no hardware."""
    if fake is not None:
        return [GpuInfo(index=i, name="Fake GPU", memory_mb=fake_memory_mb) for i in range(fake)]
    return _nvidia_smi()


def _nvidia_smi() -> list[GpuInfo]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            gpus.append(GpuInfo(index=int(parts[0]), name=parts[1], memory_mb=int(parts[2])))
        except ValueError:
            continue
    return gpus
