"""Wire models of the GPU energy and GPU time a job used, per attempt and in all (`show`,
`ps --json`, the dashboard). Runs on both sides."""

from __future__ import annotations

from pydantic import Field

from gpuhop.api.base import WireModel

# How a GPU's energy was read (the keys of `measured_by`).
COUNTER = "energy counter"  # NVML's total-energy counter (Volta and later)
POWER = "power samples"  # its power draw, read at each sample and integrated
# How a GPU's energy and time were split between the jobs on it (the keys of `split_by`).
WHOLE = "whole GPU"  # the job was the only one on it
UTILISATION = "utilisation"  # by each job's processes' share of its load (NVML, per process)
EQUAL = "equal"  # in equal parts: the load per process was unknown, or nil


class EnergyUse(WireModel):
    """The GPU energy and GPU time of one attempt (`attempt` set) or of all of a job's.

    `measured` False: the energy is not known (never 0), and `why` says why (a job that used
    no GPU, a host without NVML, a GPU that reports neither an energy counter nor its power).
    `gpu_seconds` is the time the job held its GPUs, each GPU's time split as its energy is
    (a whole GPU's counts in full); None for a job without GPUs. `measured_by` and
    `split_by` are the GPU-seconds read and split each way (`COUNTER`, `POWER`; `WHOLE`,
    `UTILISATION`, `EQUAL`); `unmeasured_gpu_seconds` is the part of `gpu_seconds` whose
    energy no reading covers."""

    attempt: int | None = None
    measured: bool
    joules: float | None = None
    wh: float | None = None
    gpu_seconds: float | None = None
    measured_by: dict[str, float] = Field(default_factory=dict)
    split_by: dict[str, float] = Field(default_factory=dict)
    unmeasured_gpu_seconds: float = 0.0
    why: str | None = None


class JobEnergy(EnergyUse):
    """A job's GPU energy and GPU time, all its attempts together, and each one's."""

    attempts: list[EnergyUse] = Field(default_factory=list)
