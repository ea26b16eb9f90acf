"""The energy meter's accounts, on fake GPUs whose readings the test moves through their seam
file: a whole GPU's counter, power integrated, a shared GPU split in equal parts, an agent
restart that goes on counting, and what is not measured. (A shared GPU split by each job's
load needs jobs in PID namespaces of their own: tests/integration/test_energy.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuhop.agent.host.health import FakeGpuHost
from gpuhop.agent.jobs.energy import NO_GPU, NOT_RECORDED, EnergyMeter, JobTotal, job_energy
from gpuhop.api import GpuInfo
from gpuhop.cli.show import energy_rows, energy_text
from gpuhop.home import JobPaths


class Gpus:
    """`count` fake GPUs and their seam: `set(0, energy_mj=...)` moves GPU 0's readings."""

    def __init__(self, tmp_path: Path, count: int = 1):
        self.seam = tmp_path / "fake-gpus.json"
        gpus = [GpuInfo(index=i, name="Fake GPU", memory_mb=8192) for i in range(count)]
        self.host = FakeGpuHost(gpus, self.seam)
        self.readings: dict[str, dict[str, int]] = {}

    def set(self, index: int, **readings: int) -> None:
        self.readings[str(index)] = readings
        self.seam.write_text(json.dumps(self.readings))


@pytest.fixture
def gpus(tmp_path: Path) -> Gpus:
    return Gpus(tmp_path, count=2)


def meter_of(gpus: Gpus, tmp_path: Path, elsewhere: str | None = None) -> EnergyMeter:
    def job_paths(job_id: str) -> JobPaths:
        root = tmp_path / "jobs" / job_id
        root.mkdir(parents=True, exist_ok=True)
        return JobPaths(root)

    return EnergyMeter(gpus.host, job_paths, elsewhere=elsewhere)


def energy(tmp_path: Path, job_id: str) -> dict:
    used = job_energy(JobPaths(tmp_path / "jobs" / job_id), used_gpus=True, ran=True)
    assert used is not None
    return used.model_dump()


def test_a_whole_gpu_gets_its_counters_difference_and_its_time(gpus, tmp_path):
    meter = meter_of(gpus, tmp_path)
    gpus.set(0, energy_mj=1_000_000)
    meter.start("a", 1, [0], now=100.0)
    assert energy(tmp_path, "a")["joules"] == 0.0  # measured from its start: none yet
    gpus.set(0, energy_mj=1_050_000)
    meter.sample(now=110.0)
    assert (energy(tmp_path, "a")["joules"], energy(tmp_path, "a")["gpu_seconds"]) == (50, 10)
    gpus.set(0, energy_mj=1_080_000)
    meter.end("a", now=115.0)
    gpus.set(0, energy_mj=9_000_000)  # after its end: not its energy
    meter.sample(now=200.0)

    used = energy(tmp_path, "a")
    assert used["measured"] and used["joules"] == 80.0 and used["wh"] == round(80 / 3600, 6)
    assert used["gpu_seconds"] == 15.0
    assert used["measured_by"] == {"energy counter": 15.0}
    assert used["split_by"] == {"whole GPU": 15.0}
    assert [(a["attempt"], a["joules"]) for a in used["attempts"]] == [(1, 80.0)]


def test_without_a_counter_the_power_draw_is_integrated(gpus, tmp_path):
    meter = meter_of(gpus, tmp_path)
    gpus.set(1, power_mw=200_000)
    meter.start("a", 1, [1], now=0.0)
    gpus.set(1, power_mw=300_000)
    meter.sample(now=10.0)  # 250 W on average for 10 s
    meter.end("a", now=20.0)  # then 300 W for 10 s

    used = energy(tmp_path, "a")
    assert (used["joules"], used["gpu_seconds"]) == (5500.0, 20.0)
    assert used["measured_by"] == {"power samples": 20.0}


def test_a_shared_gpu_without_per_process_load_is_split_in_equal_parts(gpus, tmp_path):
    meter = meter_of(gpus, tmp_path)
    gpus.set(0, energy_mj=0)
    meter.start("a", 1, [0], now=100.0)
    gpus.set(0, energy_mj=10_000)
    meter.start("b", 1, [0], now=110.0)  # a had the GPU alone until now: 10 J, 10 s
    gpus.set(0, energy_mj=30_000)
    meter.end("a", now=120.0)  # 20 J and 10 s shared by two
    gpus.set(0, energy_mj=40_000)
    meter.end("b", now=130.0)  # b alone again

    a, b = energy(tmp_path, "a"), energy(tmp_path, "b")
    assert (a["joules"], a["gpu_seconds"]) == (20.0, 15.0)
    assert a["split_by"] == {"whole GPU": 10.0, "equal": 5.0}
    assert (b["joules"], b["gpu_seconds"]) == (20.0, 15.0)
    assert b["split_by"] == {"equal": 5.0, "whole GPU": 10.0}


def test_an_agent_started_again_goes_on_from_the_readings_in_the_jobs_file(gpus, tmp_path):
    gpus.set(0, energy_mj=0)
    crashed = meter_of(gpus, tmp_path)
    crashed.start("a", 1, [0], now=0.0)
    gpus.set(0, energy_mj=10_000)
    crashed.sample(now=10.0)
    # The agent is killed; the job runs on, and its GPU's counter with it.
    gpus.set(0, energy_mj=25_000)
    again = meter_of(gpus, tmp_path)
    again.resume("a", 1, [0])
    again.sample(now=30.0)

    used = energy(tmp_path, "a")
    assert (used["joules"], used["gpu_seconds"]) == (25.0, 30.0)
    assert again.totals(now=30.0) == [JobTotal("a", 25.0, 30.0)]


def test_each_attempt_is_counted_and_the_job_in_all(gpus, tmp_path):
    meter = meter_of(gpus, tmp_path)
    gpus.set(0, energy_mj=0)
    meter.start("a", 1, [0], now=0.0)
    gpus.set(0, energy_mj=5_000)
    meter.end("a", now=5.0)
    meter.start("a", 2, [0], now=50.0)
    gpus.set(0, energy_mj=6_000)
    meter.end("a", now=52.0)

    used = energy(tmp_path, "a")
    assert [(a["attempt"], a["joules"], a["gpu_seconds"]) for a in used["attempts"]] == [
        (1, 5.0, 5.0),
        (2, 1.0, 2.0),
    ]
    assert (used["joules"], used["gpu_seconds"]) == (6.0, 7.0)
    # /metrics shows it for an hour after its end, then no more.
    assert meter.totals(now=60.0) == [JobTotal("a", 6.0, 7.0)]
    assert meter.totals(now=52.0 + 3601) == []


def test_a_counter_that_starts_over_loses_that_interval_only(gpus, tmp_path):
    meter = meter_of(gpus, tmp_path)
    gpus.set(0, energy_mj=500_000)
    meter.start("a", 1, [0], now=0.0)
    gpus.set(0, energy_mj=1_000)  # the driver was reloaded
    meter.sample(now=10.0)
    gpus.set(0, energy_mj=3_000)
    meter.end("a", now=12.0)

    used = energy(tmp_path, "a")
    assert (used["joules"], used["gpu_seconds"]) == (2.0, 12.0)
    assert used["unmeasured_gpu_seconds"] == 10.0


def test_what_is_not_measured_says_why_and_is_never_zero(gpus, tmp_path):
    meter = meter_of(gpus, tmp_path)
    meter.start("a", 1, [1], now=0.0)  # a GPU that gives no reading (no NVML)
    meter.end("a", now=4.0)
    used = energy(tmp_path, "a")
    assert not used["measured"] and used["joules"] is None and used["wh"] is None
    assert used["why"] == "GPU 1 reports neither an energy counter nor its power draw through NVML"
    assert used["gpu_seconds"] == 4.0  # its time on the GPU is known all the same
    assert meter.totals(now=5.0) == [JobTotal("a", None, 4.0)]

    cpu = job_energy(JobPaths(tmp_path / "cpu"), used_gpus=False, ran=True)
    assert cpu is not None and (cpu.measured, cpu.joules, cpu.why) == (False, None, NO_GPU)
    assert job_energy(JobPaths(tmp_path / "queued"), used_gpus=True, ran=False) is None
    old = job_energy(JobPaths(tmp_path / "old"), used_gpus=True, ran=True)
    assert old is not None and (old.measured, old.why) == (False, NOT_RECORDED)

    cluster = meter_of(gpus, tmp_path, elsewhere="the Ray cluster")
    gpus.set(0, energy_mj=0)
    cluster.start("c", 1, [0], now=0.0)
    used = energy(tmp_path, "c")
    assert (used["measured"], used["gpu_seconds"]) == (False, None)
    assert used["why"] == "GPU energy is not measured on the Ray cluster"


def test_show_says_each_attempt_and_the_whole_in_units_a_person_reads(gpus, tmp_path):
    meter = meter_of(gpus, tmp_path)
    gpus.set(0, energy_mj=0)
    gpus.set(1, power_mw=300_000)
    # 7.2 kJ by one GPU's counter, 1.08 MJ by the other's power (300 W for an hour); each
    # GPU's hour counts.
    meter.start("a", 1, [0, 1], now=0.0)
    gpus.set(0, energy_mj=7_200_000)
    meter.end("a", now=3600.0)
    meter.start("a", 2, [0], now=4000.0)
    gpus.set(0, energy_mj=7_200_000 + 12_345_000)
    meter.end("a", now=4010.0)

    used = energy(tmp_path, "a")
    assert energy_rows(used) == [
        (
            "energy",
            "1.10 MJ (305 Wh); GPU time 7210.0 GPU-s (2.00 GPU-h);"
            " NVML's energy counter and power samples (all 2 attempts)",
        ),
        (
            "",
            "attempt 1: 1.09 MJ (302 Wh); GPU time 7200.0 GPU-s (2.00 GPU-h);"
            " NVML's energy counter and power samples",
        ),
        ("", "attempt 2: 12.3 kJ (3.43 Wh); GPU time 10.0 GPU-s; NVML's energy counter"),
    ]
    assert energy_text({"measured": False, "why": "it used no GPU"}) == (
        "not measured (it used no GPU)"
    )
