"""Runs inside the job: the framework's own view of its device memory, for the metrics file.

NVML's per-process figure is what a framework has reserved, which for TensorFlow and JAX is
what they were allowed to take, not what the job needed. The frameworks' allocators know
better: TensorFlow's `get_memory_info` (current and peak), JAX's `memory_stats()` and
PyTorch's `memory_allocated` / `max_memory_allocated`. Only a framework the job has already
imported is asked (this imports none); devices are the job's GPUs, and the largest reading
across them is reported, since a share is a share of one GPU.

A job may have imported a framework it does not train with: TensorBoard imports TensorFlow
where it is installed (PyTorch's `SummaryWriter` does), and Keras on JAX may load it for
`tf.data`. That one sees the GPUs and holds nothing on them: the framework with the highest
peak is the one reported. TensorFlow is asked last, and only where no other framework
answered or its eager context is up already: asking starts it, a CUDA context on every GPU
(a `tf.compat.v1.Session` job never starts the eager context, and is asked all the same).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable

__all__ = ["MEMORY_KEYS", "device_memory", "report", "report_at_exit"]

MB = 1024 * 1024
# The metrics keys, in MB: device memory in use now, and the most in use so far.
MEMORY_KEYS = ("memory_mb", "memory_peak_mb")

Reading = tuple[int, int]  # (bytes in use, peak bytes), one device


def _tensorflow(tf: object) -> list[Reading]:
    config = tf.config  # type: ignore[attr-defined]
    out = []
    for i, _ in enumerate(config.list_logical_devices("GPU")):
        info = config.experimental.get_memory_info(f"GPU:{i}")
        out.append((int(info["current"]), int(info["peak"])))
    return out


def _jax(jax: object) -> list[Reading]:
    bridge = getattr(getattr(jax, "_src", None), "xla_bridge", None)
    if bridge is not None and not bridge.backends_are_initialized():
        return []  # never used, or dropped at exit: asking would start a new backend
    out = []
    for device in jax.local_devices():  # type: ignore[attr-defined]
        stats = device.memory_stats()  # None where the platform keeps none (the CPU)
        if stats and "bytes_in_use" in stats:
            in_use = int(stats["bytes_in_use"])
            out.append((in_use, int(stats.get("peak_bytes_in_use", in_use))))
    return out


def _torch(torch: object) -> list[Reading]:
    cuda = torch.cuda  # type: ignore[attr-defined]
    if not cuda.is_initialized():
        return []  # asking would start CUDA in a job that never used it
    return [
        (int(cuda.memory_allocated(i)), int(cuda.max_memory_allocated(i)))
        for i in range(cuda.device_count())
    ]


# In the order they are asked: TensorFlow last (see the module's doc).
READERS: dict[str, Callable[[object], list[Reading]]] = {
    "torch": _torch,
    "jax": _jax,
    "tensorflow": _tensorflow,
}


def _tensorflow_started() -> bool:
    """Whether TensorFlow's eager context is up (the job ran an op, or listed devices)."""
    context = sys.modules.get("tensorflow.python.eager.context")
    ctx = None if context is None else context.context_safe()
    return bool(getattr(ctx, "_initialized", False))


def device_memory() -> dict[str, float]:
    """`{"memory_mb": ..., "memory_peak_mb": ...}` from the framework the job has imported
    with the highest peak, or {} (no GPU, or no framework that reports device memory)."""
    answers: list[list[Reading]] = []
    for name, read in READERS.items():
        module = sys.modules.get(name)
        if module is None:
            continue
        if name == "tensorflow" and answers and not _tensorflow_started():
            continue  # only loaded beside the framework that answered: asking starts it
        try:
            readings = read(module)
        except Exception:  # a reading is never worth failing a job's epoch over
            continue
        if readings:
            answers.append(readings)
    if not answers:
        return {}
    readings = max(answers, key=lambda found: max(r[1] for r in found))
    return {
        "memory_mb": round(max(r[0] for r in readings) / MB, 1),
        "memory_peak_mb": round(max(r[1] for r in readings) / MB, 1),
    }


def report() -> None:
    """Append the device memory now (and the peak) to the job's metrics file, if the job's
    framework reports any: the start-up hook does at the job's exit."""
    from gpuhop.runtime import log_metrics

    memory = device_memory()
    if memory:
        log_metrics(memory_mb=memory["memory_mb"], memory_peak_mb=memory["memory_peak_mb"])


def report_at_exit() -> str:
    """Have `report` run at the job's exit; the start-up hook calls this right after each
    framework's import. Registered (again) after the import, it runs before the exit
    handlers the framework registered while it loaded: JAX's drops its backends, and asked
    after that, JAX would start a new one with nothing in use."""
    if not os.environ.get("GPUHOP_METRICS_FILE"):
        return "no metrics file: device memory is not reported at exit"
    atexit.unregister(_report_at_exit)
    atexit.register(_report_at_exit)
    return "device memory goes to the metrics file at exit"


def _report_at_exit() -> None:
    try:
        report()
    except Exception as e:  # the job's own exit status stands
        print(f"gpuhop: could not report device memory at exit: {type(e).__name__}: {e}",
              file=sys.stderr)  # fmt: skip
