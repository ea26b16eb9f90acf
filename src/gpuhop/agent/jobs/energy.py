"""Runs in the agent: the GPU energy and GPU time of each job's attempts, kept in the job's
dir (`JobPaths.energy`, which the job never sees) while they run.

Energy is read from NVML's total-energy counter where a GPU has one (Volta and later), else
from its power draw, integrated between readings. The meter reads an attempt's GPUs when it
starts and when it ends, and at each of the `SampleGpus` duty's samples in between (every
few seconds; no thread of its own, and nothing at all while no GPU job runs), and writes the
figures to the job's file each time: an agent that crashes loses the last few seconds, and
one started again re-attaches to a running attempt and goes on from the readings the file
holds (the energy used while no agent watched included: the counter's whole difference, or
the power before and after).

A GPU that one job holds gives it all its energy and time ("whole GPU"). Several jobs on one
GPU (memory shares) split each interval's energy and time by their shares of the GPU's load
in it: NVML's per-process utilisation samples, told per job by PID namespace as a shared
GPU's memory is (`gpuprocs`) ("utilisation"); in equal parts where NVML does not tell, or no
job's process was busy ("equal"). When the jobs on a GPU change (one starts or ends), the
interval up to then is settled first, so each interval goes to the jobs that shared it.
Another program's process on a job's GPU is not told apart: its energy counts as the jobs'.
The processes of a job that just ended are gone, and so is their load: the last interval
of a shared GPU before a job's end goes by the load of the jobs still on it.

What was not measured is never 0: an attempt with no reading of its GPUs says why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from gpuhop.agent.host.gpuprocs import Init, init_of, per_job
from gpuhop.api.energy import COUNTER, EQUAL, POWER, UTILISATION, WHOLE, EnergyUse, JobEnergy
from gpuhop.backends.base import Energy, GpuHost
from gpuhop.home import JobPaths

log = logging.getLogger("gpuhop.agent")

FILE_VERSION = 1
# More than this of a job's file is not read (a job of 100 attempts on 8 GPUs is ~60 KB).
MAX_FILE_BYTES = 1024 * 1024
# Ended jobs whose totals /metrics still shows: those of the last hour, at most this many.
RECENT_JOBS = 1000
RECENT_SECONDS = 3600.0
NOT_RECORDED = "not recorded (the job ran before this agent measured GPU energy)"
NO_GPU = "it used no GPU"


class JobTotal(NamedTuple):
    """A job's GPU energy (None: not measured) and GPU time over all its attempts."""

    job_id: str
    joules: float | None
    gpu_seconds: float


class _Running:
    """An attempt the meter reads: its job's record (the file's contents) and its entry."""

    def __init__(self, jp: JobPaths, gpus: tuple[int, ...], record: dict[str, Any]):
        self.jp = jp
        self.gpus = gpus
        self.record = record
        self.entry: dict[str, Any] = record["attempts"][-1]
        self.init: Init | None = None  # its first process, once its leader wrote it
        self.write_failed = False


class EnergyMeter:
    """Each running attempt's GPU energy and time. Safe to use from any thread.

    `elsewhere`: where jobs run when their GPUs are not this host's (a cluster, in words):
    nothing is read there, and each attempt says so."""

    def __init__(
        self,
        host: GpuHost,
        job_paths: Callable[[str], JobPaths],
        elsewhere: str | None = None,
    ):
        self.host = host
        self.job_paths = job_paths
        self.elsewhere = elsewhere
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._recent: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()

    def start(
        self, job_id: str, attempt: int, gpu_ids: Iterable[int], now: float | None = None
    ) -> None:
        """An attempt started on `gpu_ids`: its first readings (for a CPU job, nothing)."""
        gpus = tuple(sorted(gpu_ids))
        if not gpus:
            return
        now = time.time() if now is None else now
        jp = self.job_paths(job_id)
        with self._lock:
            record = _load(jp)
            entry = _entry(attempt, gpus, now)
            record["attempts"] = [a for a in record["attempts"] if a["attempt"] != attempt]
            record["attempts"].append(entry)
            run = _Running(jp, gpus, record)
            if self.elsewhere is not None:
                entry["why"] = f"GPU energy is not measured on {self.elsewhere}"
                entry["gpu_seconds"] = None
                entry.pop("last")
                self._write(run)
                return
            readings = self.host.energy(list(gpus))
            # The jobs already on these GPUs take the time up to now as it was shared.
            touched = self._settle(set(gpus), now, readings)
            entry["last"] = {str(g): _last(now, readings.get(g)) for g in gpus}
            missing = [g for g in gpus if g not in readings]
            if missing:
                entry["why"] = self._why(missing)
            for reading in readings.values():  # measured from the start: 0 J so far
                _add(entry["measured_by"], COUNTER if reading.total_mj is not None else POWER, 0.0)
            self._running[job_id] = run
            for each in (*touched, run):
                self._write(each)

    def resume(self, job_id: str, attempt: int, gpu_ids: Iterable[int]) -> None:
        """After an agent restart, an attempt that still runs: counted on from the readings
        its file holds (an attempt the file does not know starts now)."""
        gpus = tuple(sorted(gpu_ids))
        if not gpus or self.elsewhere is not None:
            return
        jp = self.job_paths(job_id)
        with self._lock:
            record = _load(jp)
            ours = [a for a in record["attempts"] if a["attempt"] == attempt and "last" in a]
            if ours:
                # Last in its record, as `_Running` takes it. Not settled now: the first
                # sample settles every re-attached job of a GPU together, shared as then.
                record["attempts"] = [a for a in record["attempts"] if a is not ours[0]]
                record["attempts"].append(ours[0])
                self._running[job_id] = _Running(jp, gpus, record)
                return
        self.start(job_id, attempt, gpus)

    def end(self, job_id: str, now: float | None = None) -> None:
        """The attempt's processes ended: its last readings. Idempotent."""
        now = time.time() if now is None else now
        with self._lock:
            run = self._running.get(job_id)
            if run is None:
                return
            touched = self._settle(set(run.gpus), now, self.host.energy(list(run.gpus)))
            del self._running[job_id]
            run.entry.pop("last", None)
            run.entry["ended_at"] = now
            self._recent[job_id] = (now, run.record)
            self._recent.move_to_end(job_id)
            for each in touched | {run}:
                self._write(each)

    def sample(self, now: float | None = None) -> None:
        """Read the GPUs of every running attempt (the `SampleGpus` duty, every few
        seconds), and keep what each used since the last reading."""
        now = time.time() if now is None else now
        with self._lock:
            gpus = {g for run in self._running.values() for g in run.gpus}
            if not gpus:
                return
            for run in self._settle(gpus, now, self.host.energy(sorted(gpus))):
                self._write(run)

    def totals(self, now: float | None = None) -> list[JobTotal]:
        """The running jobs' totals and those of the jobs that ended in the last hour."""
        now = time.time() if now is None else now
        with self._lock:
            while self._recent and (
                len(self._recent) > RECENT_JOBS
                or next(iter(self._recent.values()))[0] < now - RECENT_SECONDS
            ):
                self._recent.popitem(last=False)
            records = {job: record for job, (_, record) in self._recent.items()}
            records.update((job, run.record) for job, run in self._running.items())
            out = []
            for job, record in records.items():
                total = combine([use(a) for a in record["attempts"]])
                if total.gpu_seconds is not None:
                    out.append(JobTotal(job, total.joules, total.gpu_seconds))
            return out

    def _settle(self, gpus: set[int], now: float, readings: dict[int, Energy]) -> set[_Running]:
        """Add what each attempt on `gpus` used since its last reading; the attempts
        touched."""
        touched: set[_Running] = set()
        for gpu in sorted(gpus):
            holders = [run for run in self._running.values() if gpu in run.gpus]
            if not holders:
                continue
            shares, how = self._split(gpu, holders)
            for run, share in zip(holders, shares, strict=True):
                _accrue(run.entry, gpu, now, readings.get(gpu), share, how)
                touched.add(run)
        return touched

    def _split(self, gpu: int, holders: list[_Running]) -> tuple[list[float], str]:
        """Each holder's share of the GPU's last interval, and how it was told."""
        if len(holders) == 1:
            return [1.0], WHOLE
        loads = self.host.process_utilization(gpu)
        if loads is not None:
            inits = {}
            for run in holders:
                if run.init is None:
                    run.init = init_of(run.jp.leader_pid)
                if run.init is not None:
                    inits[run.jp.root.name] = run.init
            by_job = per_job({gpu: loads}, inits).get(gpu, {})
            busy = [by_job.get(run.jp.root.name, 0) for run in holders]
            if sum(busy) > 0:
                return [b / sum(busy) for b in busy], UTILISATION
        return [1 / len(holders)] * len(holders), EQUAL

    def _why(self, gpus: list[int]) -> str:
        if self.host.source in ("nvml", "fake"):
            listed = ", ".join(map(str, gpus))
            which = f"GPU {listed} reports" if len(gpus) == 1 else f"GPUs {listed} report"
            return f"{which} neither an energy counter nor its power draw through NVML"
        if self.host.source == "nvidia-smi":
            return "no NVML on this host (gpuhop reads energy through nvidia-ml-py's pynvml)"
        return "no NVML on this host"

    def _write(self, run: _Running) -> None:
        jp = run.jp
        tmp = jp.energy.with_name(jp.energy.name + ".tmp")
        try:
            tmp.write_text(json.dumps(run.record))
            os.replace(tmp, jp.energy)
        except OSError as e:
            if not run.write_failed:  # once per attempt: a full disk must not flood the log
                log.warning("job %s: could not record its GPU energy: %s", jp.root.name, e)
            run.write_failed = True


def _entry(attempt: int, gpus: tuple[int, ...], now: float) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "gpus": list(gpus),
        "started_at": now,
        "gpu_seconds": 0.0,
        "joules": 0.0,
        "measured_by": {},
        "split_by": {},
        "unmeasured_gpu_seconds": 0.0,
        "why": None,
        "last": {},
    }


def _last(now: float, reading: Energy | None) -> list[float | int | None]:
    return [now, None, None] if reading is None else [now, reading.total_mj, reading.power_mw]


def _accrue(
    entry: dict[str, Any], gpu: int, now: float, reading: Energy | None, share: float, how: str
) -> None:
    """Add `share` of what GPU `gpu` used since the entry's last reading of it."""
    last = entry["last"].get(str(gpu))
    entry["last"][str(gpu)] = _last(now, reading)
    if last is None:
        return
    then, total_mj, power_mw = last
    seconds = max(0.0, now - then) * share
    entry["gpu_seconds"] += seconds
    _add(entry["split_by"], how, seconds)
    if reading is not None and reading.total_mj is not None and total_mj is not None:
        if reading.total_mj >= total_mj:  # smaller: the driver restarted, its count with it
            entry["joules"] += (reading.total_mj - total_mj) / 1000 * share
            _add(entry["measured_by"], COUNTER, seconds)
            return
    elif reading is not None and reading.power_mw is not None and power_mw is not None:
        entry["joules"] += (reading.power_mw + power_mw) / 2000 * max(0.0, now - then) * share
        _add(entry["measured_by"], POWER, seconds)
        return
    entry["unmeasured_gpu_seconds"] += seconds


def _add(into: dict[str, float], key: str, value: float) -> None:
    into[key] = into.get(key, 0.0) + value


def _load(jp: JobPaths) -> dict[str, Any]:
    """The job's record, or a new one where there is none (or none this agent wrote)."""
    fresh: dict[str, Any] = {"version": FILE_VERSION, "attempts": []}
    try:
        fd = os.open(jp.energy, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return fresh
    try:
        with os.fdopen(fd, "rb") as f:
            record = json.loads(f.read(MAX_FILE_BYTES))
    except (OSError, ValueError):
        return fresh
    if not isinstance(record, dict) or not isinstance(record.get("attempts"), list):
        return fresh
    record["attempts"] = [
        a for a in record["attempts"] if isinstance(a, dict) and isinstance(a.get("attempt"), int)
    ]
    return record


def use(entry: dict[str, Any]) -> EnergyUse:
    """One attempt's figures as the API gives them."""
    measured_by = _figures(entry.get("measured_by"))
    measured = bool(measured_by)
    joules = float(entry.get("joules") or 0.0) if measured else None
    gpu_seconds = entry.get("gpu_seconds")
    return EnergyUse(
        attempt=entry["attempt"],
        measured=measured,
        joules=None if joules is None else round(joules, 3),
        wh=None if joules is None else round(joules / 3600, 6),
        gpu_seconds=round(gpu_seconds, 3) if isinstance(gpu_seconds, int | float) else None,
        measured_by=measured_by,
        split_by=_figures(entry.get("split_by")),
        unmeasured_gpu_seconds=round(float(entry.get("unmeasured_gpu_seconds") or 0.0), 3),
        why=None if measured else str(entry.get("why") or "no reading of its GPUs yet"),
    )


def combine(attempts: list[EnergyUse]) -> JobEnergy:
    """All of a job's attempts together, and each one's."""
    measured = [a for a in attempts if a.measured]
    joules = sum(a.joules or 0.0 for a in measured) if measured else None
    timed = [a.gpu_seconds for a in attempts if a.gpu_seconds is not None]
    return JobEnergy(
        measured=bool(measured),
        joules=None if joules is None else round(joules, 3),
        wh=None if joules is None else round(joules / 3600, 6),
        gpu_seconds=round(sum(timed), 3) if timed else None,
        measured_by=_summed(a.measured_by for a in attempts),
        split_by=_summed(a.split_by for a in attempts),
        unmeasured_gpu_seconds=round(sum(a.unmeasured_gpu_seconds for a in attempts), 3),
        why=None if measured else (attempts[-1].why if attempts else NOT_RECORDED),
        attempts=attempts,
    )


def job_energy(jp: JobPaths, used_gpus: bool, ran: bool) -> JobEnergy | None:
    """The job's figures from its file: None for a job that has not run (`ran`); for one
    without GPUs, or whose file is missing, not measured, and why."""
    if not ran:
        return None
    if not used_gpus:
        return JobEnergy(measured=False, why=NO_GPU)
    attempts = []
    for entry in _load(jp)["attempts"]:
        with contextlib.suppress(TypeError, ValueError):  # not as this agent writes it
            attempts.append(use(entry))
    return combine(attempts)


def _figures(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {
        str(k): round(float(v), 3)
        for k, v in value.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _summed(dicts: Iterable[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for figures in dicts:
        for key, value in figures.items():
            _add(out, key, value)
    return {k: round(v, 3) for k, v in out.items()}
