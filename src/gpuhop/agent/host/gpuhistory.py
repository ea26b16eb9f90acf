"""Runs in the agent: a bounded record of each GPU's memory use and load over the last hour.

The `SampleGpus` duty (see `gpuhop.agent.duties.runner`) reads `GpuHost.usage()` every
`SAMPLE_EVERY` seconds (more often under a short idle guard) and appends it here; the
dashboard's GPU page draws it, and the idle guard reads how long a job's GPUs sat at 0 %.
It lives in memory only (an hour of 5-second samples of 8 GPUs is a few hundred KB at most)
and starts empty when the agent starts.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from gpuhop.backends.base import Usage

SAMPLE_EVERY = 5.0
KEEP_SECONDS = 3600.0


def sample_every(idle_minutes: float | None) -> float:
    """How often to sample: every `SAMPLE_EVERY` seconds, or often enough that the idle
    guard's window (`idle_gpu_minutes`) holds about six samples (not under a quarter second)."""
    if idle_minutes is None:
        return SAMPLE_EVERY
    return max(0.25, min(SAMPLE_EVERY, idle_minutes * 60 / 6))


@dataclass(frozen=True)
class Sample:
    time: float
    usage: dict[int, Usage]


class GpuHistory:
    """The last `keep` seconds of samples, oldest first. Safe to use from several threads."""

    def __init__(self, every: float = SAMPLE_EVERY, keep: float = KEEP_SECONDS):
        self.every = every
        self._samples: deque[Sample] = deque(maxlen=max(1, round(keep / every)))
        self._lock = threading.Lock()

    def record(self, now: float, usage: dict[int, Usage]) -> None:
        with self._lock:
            self._samples.append(Sample(now, dict(usage)))

    def series(self) -> dict[int, dict[str, list[float | int | None]]]:
        """Per GPU index: the sample times and, at each, memory used (MB) and load (%)."""
        with self._lock:
            samples = list(self._samples)
        out: dict[int, dict[str, list[float | int | None]]] = {}
        for sample in samples:
            for index, reading in sample.usage.items():
                series = out.setdefault(index, {"t": [], "memory_used_mb": [], "utilization": []})
                series["t"].append(sample.time)
                series["memory_used_mb"].append(reading.memory_used_mb)
                series["utilization"].append(reading.utilization)
        return out

    def idle_since(self, gpus: list[int], after: float) -> float | None:
        """When the GPUs `gpus` last became idle: the time of the oldest sample, taken at
        `after` or later, from which every sample up to the newest read 0 % on all of them.
        None if the newest did not (busy, or unknown), or no sample is that recent."""
        with self._lock:
            samples = list(self._samples)
        since = None
        for sample in reversed(samples):
            if sample.time < after:
                break
            readings = [sample.usage.get(g) for g in gpus]
            if not all(r is not None and r.utilization == 0 for r in readings):
                break
            since = sample.time
        return since
