"""GPU discovery: fake GPUs for tests, and whatever this machine really has."""

from __future__ import annotations

import pytest

from gpuhop.agent.host import gpus
from tests.conftest import has_nvidia_gpu, wait_until


def test_fake_gpus_have_8_gib_unless_told_and_report_idle():
    host = gpus.discover(fake=2)
    small = gpus.discover(fake=1, fake_memory_mb=4096)

    assert (host.source, host.fake) == ("fake", True)
    assert [(g.index, g.name, g.memory_mb) for g in host.gpus] == [
        (0, "Fake GPU", 8192),
        (1, "Fake GPU", 8192),
    ]
    assert small.gpus[0].memory_mb == 4096
    assert host.usage() == {0: gpus.Usage(0, 0), 1: gpus.Usage(0, 0)}
    assert host.driver_version is None and host.error is None


def test_real_discovery_reports_this_machine_honestly():
    host = gpus.discover()
    try:
        if not has_nvidia_gpu():
            # No driver here: not an error, just no GPU.
            assert (host.source, host.gpus, host.error) == ("none", [], None)
            assert host.usage() == {}
        else:
            assert host.source in ("nvml", "nvidia-smi") and host.gpus
    finally:
        host.close()


@pytest.mark.gpu
def test_on_a_gpu_host_nvml_reads_memory_and_load_live():
    host = gpus.discover()
    try:
        assert host.source == "nvml", host.error
        assert host.driver_version and host.cuda_version
        for gpu in host.gpus:
            assert gpu.memory_mb > 1024 and gpu.name
        usage = host.usage()
        assert set(usage) == {g.index for g in host.gpus}
        assert all(u.memory_used_mb is not None for u in usage.values())
    finally:
        host.close()


@pytest.mark.gpu
def test_on_a_gpu_host_nvidia_smi_agrees_with_nvml():
    nvml = gpus.discover()
    smi = gpus._smi_host()
    try:
        assert [(g.index, g.name) for g in smi.gpus] == [(g.index, g.name) for g in nvml.gpus]
        assert smi.driver_version == nvml.driver_version
        assert all(u.memory_used_mb is not None for u in smi.usage().values())
    finally:
        nvml.close()


def test_fake_gpus_read_load_and_faults_from_their_seam_file(tmp_path):
    seam = tmp_path / "fake-gpus.json"
    host = gpus.discover(fake=3, fake_seam=seam)
    assert host.usage()[0] == gpus.Usage(0, 0) and host.faults() == {}  # no file: all well
    seam.write_text('{"0": {"utilization": 85}, "1": {"xid": 79}, "2": {"xid": 13}}')
    assert host.usage()[0] == gpus.Usage(0, 85)
    # XID 13 is a job's own illegal memory access: never a GPU fault.
    assert {i: (f.kind, f.detail) for i, f in host.faults().items()} == {
        1: ("xid", "XID 79 (GPU fell off the bus)")
    }
    seam.write_text("{not json")
    assert host.faults() == {} and host.usage()[0] == gpus.Usage(0, 0)


@pytest.mark.gpu
def test_on_a_gpu_host_nvml_reports_no_fault_on_healthy_gpus():
    host = gpus.discover()
    try:
        assert host.source == "nvml", host.error
        assert host.faults() == {}
        assert host.faults() == {}  # the XID event set drains without blocking
    finally:
        host.close()


@pytest.mark.gpu
def test_on_a_gpu_host_nvml_reads_each_gpus_energy_counter_or_power():
    host = gpus.discover()
    try:
        indices = [g.index for g in host.gpus]
        first = host.energy(indices)
        assert set(first) == set(indices)  # every NVIDIA GPU since Kepler gives one or both
        for reading in first.values():
            if reading.total_mj is None:  # before Volta: no counter, its power instead
                assert reading.power_mw is not None and reading.power_mw > 0
        counters = {i: r.total_mj for i, r in first.items() if r.total_mj is not None}
        # Even an idle GPU draws some tens of watts: its counter moves within a second or so.
        wait_until(
            lambda: all(host.energy([i])[i].total_mj > mj for i, mj in counters.items()),
            timeout=10,
        )
    finally:
        host.close()
