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


def _torch_using(in_use: int, peak: int) -> types.SimpleNamespace:
    """PyTorch's torch.cuda as the reader sees it in a job that has used one GPU."""
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True,
        device_count=lambda: 1,
        memory_allocated=lambda i: in_use,
        max_memory_allocated=lambda i: peak,
    )
    return types.SimpleNamespace(cuda=cuda)


class _TensorFlow:
    """tf.config as the reader sees it on one GPU TensorFlow holds nothing on; `asked` says
    whether its devices were listed (which starts TensorFlow on the GPUs)."""

    def __init__(self, started: bool):
        self.asked = False
        self.started = started
        config = types.SimpleNamespace(list_logical_devices=self._list)
        config.experimental = types.SimpleNamespace(get_memory_info=self._info)
        self.config = config
        ctx = types.SimpleNamespace(_initialized=started)
        self.context = types.SimpleNamespace(context_safe=lambda: ctx if started else None)

    def _list(self, kind: str) -> list[str]:
        self.asked = True
        return ["/device:GPU:0"]

    def _info(self, device: str) -> dict[str, int]:
        return {"current": 0, "peak": 0}


def _load(monkeypatch: pytest.MonkeyPatch, tf: _TensorFlow) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    monkeypatch.setitem(sys.modules, "tensorflow.python.eager.context", tf.context)


def test_a_pytorch_job_that_loaded_tensorflow_reports_pytorch(no_frameworks):
    # PyTorch's SummaryWriter imports TensorFlow where it is installed: TensorFlow was asked
    # first, started on the GPUs at the job's exit, and its 0 MB was the job's peak.
    tf = _TensorFlow(started=False)
    _load(no_frameworks, tf)
    no_frameworks.setitem(sys.modules, "torch", _torch_using(256 * MB, 768 * MB))
    assert memory.device_memory() == {"memory_mb": 256.0, "memory_peak_mb": 768.0}
    assert not tf.asked

    # TensorFlow running beside it (tf.data, say): the framework with the highest peak.
    tf = _TensorFlow(started=True)
    _load(no_frameworks, tf)
    assert memory.device_memory() == {"memory_mb": 256.0, "memory_peak_mb": 768.0}
    assert tf.asked


def test_tensorflow_alone_is_asked_even_before_its_eager_context(no_frameworks):
    # A tf.compat.v1.Session job never starts the eager context: still the one to ask.
    tf = _TensorFlow(started=False)
    _load(no_frameworks, tf)
    assert memory.device_memory() == {"memory_mb": 0.0, "memory_peak_mb": 0.0}
    assert tf.asked


def test_real_tensorflow_loaded_but_unused_is_not_started():
    # In a process of its own: TensorFlow costs a second and 600 MB to import, and once up
    # its context stays for the process's life.
    code = (
        "import sys, types\n"
        "import tensorflow\n"
        "from tensorflow.python.eager import context\n"
        "from gpuhop.runtime import memory\n"
        "cuda = types.SimpleNamespace(is_initialized=lambda: True, device_count=lambda: 1,\n"
        "    memory_allocated=lambda i: 2 ** 20, max_memory_allocated=lambda i: 2 ** 21)\n"
        "sys.modules['torch'] = types.SimpleNamespace(cuda=cuda)\n"
        "print(memory.device_memory())\n"
        "print('started:', context.context_safe() is not None)\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == [
        "{'memory_mb': 1.0, 'memory_peak_mb': 2.0}",
        "started: False",
    ]
