"""The framework's own view of device memory, as the metrics callback and the exit report
read it: from frameworks the job has imported, GPUs only, the largest device reported."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from gpuhop.runtime import memory
from tests.conftest import jax_path

MB = 1024 * 1024


class _JaxDevice:
    def __init__(self, stats: dict[str, int] | None):
        self.stats = stats

    def memory_stats(self) -> dict[str, int] | None:
        return self.stats


@pytest.fixture
def no_frameworks(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in memory.READERS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return monkeypatch


def test_nothing_imported_nothing_reported(no_frameworks):
    assert memory.device_memory() == {}


def test_jax_gpus_report_their_largest_use_and_peak(no_frameworks):
    # The shape of jax.Device.memory_stats() on a GPU: bytes now, and the most so far.
    devices = [
        _JaxDevice({"bytes_in_use": 512 * MB, "peak_bytes_in_use": 2048 * MB}),
        _JaxDevice({"bytes_in_use": 1024 * MB, "peak_bytes_in_use": 1536 * MB}),
    ]
    no_frameworks.setitem(sys.modules, "jax", types.SimpleNamespace(local_devices=lambda: devices))
    assert memory.device_memory() == {"memory_mb": 1024.0, "memory_peak_mb": 2048.0}


def test_a_framework_that_fails_to_answer_is_passed_over(no_frameworks):
    def broken() -> list[object]:
        raise RuntimeError("backend gone")

    no_frameworks.setitem(sys.modules, "jax", types.SimpleNamespace(local_devices=broken))
    assert memory.device_memory() == {}


def test_real_jax_on_the_cpu_keeps_no_memory_stats():
    # In a process of its own: a JAX backend, once made, stays for the process's life and
    # warns at every os.fork() after it (which a later test of this worker may make).
    code = (
        "import jax\n"
        "from gpuhop.runtime import memory\n"
        "jax.numpy.ones((64, 64)).block_until_ready()\n"
        "print(memory.device_memory())\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": jax_path()}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "{}"
