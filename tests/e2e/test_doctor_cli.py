"""`gpuhop doctor` as a user runs it, against real agents on this machine."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import has_nvidia_gpu

pytestmark = pytest.mark.timeout(300)


def doctor(agent) -> tuple[int, str, list[dict]]:
    text = agent.cli("doctor", timeout=240)
    listed = agent.cli("doctor", "--json", timeout=240)
    assert text.returncode == listed.returncode, text.stderr + listed.stderr
    return text.returncode, text.stdout, json.loads(listed.stdout)


def _free_space(text: str) -> str:
    return re.sub(r"[0-9.]+ [KMGT]?i?B free", "N free", text)


@pytest.mark.tf
def test_doctor_reports_this_host_honestly(shared_agent):
    code, text, checks = doctor(shared_agent)

    names = [c["name"] for c in checks]
    assert names == [
        "NVIDIA driver",
        "TensorFlow",
        "CUDA version",
        "TensorFlow sees the GPUs",
        "GPU health",
        "tf-keras",
        "disk space",
        "job sandbox",
        "job identity",
        "container images",
        "job work dirs",
        "bucket credentials",
    ]
    assert code == (0 if all(c["ok"] for c in checks) else 1)
    marks = {"passed": "✓", "warning": "!", "failed": "✗", "skipped": "-"}
    # The two runs read the free disk space a few seconds apart, while other processes on
    # this machine write: compare everything but that number.
    text = _free_space(text)
    for check in checks:
        line = f"{marks[check['status']]} {check['name']}: {_free_space(check['detail'])}"
        assert line in text
        if check["status"] in ("failed", "warning"):
            assert f"fix: {check['fix']}" in text
    # The host's own checks are printed at once, before the TensorFlow probe's (seconds).
    at = {line.split(":")[0][2:]: i for i, line in reversed(list(enumerate(text.splitlines())))}
    assert at["disk space"] < at["job work dirs"] < at["TensorFlow"] < at["tf-keras"]
    by_name = {c["name"]: c for c in checks}
    assert by_name["TensorFlow"]["status"] == "passed"  # the test suite itself runs TF
    # A single-user agent: its jobs are its user's own, and run as that user.
    assert by_name["job identity"]["status"] == "passed"
    assert "jobs run as the agent's user (uid " in by_name["job identity"]["detail"]
    if not has_nvidia_gpu():
        # A CPU-only host is a valid setup: nothing GPU-related fails there.
        assert by_name["NVIDIA driver"] == {
            "name": "NVIDIA driver",
            "status": "skipped",
            "detail": "no NVIDIA GPU on this host; jobs run on the CPU",
            "fix": None,
            "ok": True,
        }
        assert by_name["CUDA version"]["status"] == "skipped"
        assert by_name["TensorFlow sees the GPUs"]["status"] == "skipped"


@pytest.mark.tf
def test_doctor_on_fake_gpus_needs_no_driver(make_agent):
    listed = make_agent(fake_gpus=2).cli("doctor", "--json", timeout=240)
    checks = json.loads(listed.stdout)

    by_name = {c["name"]: c for c in checks}
    assert by_name["NVIDIA driver"]["status"] == "skipped"
    assert "2 fake GPU(s) of 8 GiB" in by_name["NVIDIA driver"]["detail"]
    assert by_name["TensorFlow sees the GPUs"]["status"] == "skipped"
    assert listed.returncode == (0 if all(c["ok"] for c in checks) else 1)


@pytest.mark.gpu
def test_doctor_on_a_gpu_host_passes_the_gpu_checks(make_agent):
    _, _, checks = doctor(make_agent())

    by_name = {c["name"]: c for c in checks}
    assert by_name["NVIDIA driver"]["status"] in ("passed", "warning"), by_name["NVIDIA driver"]
    tf = by_name["TensorFlow"]
    if tf["status"] == "failed":
        # A GPU host without TensorFlow (PyTorch or JAX only), or with its CPU build: the
        # doctor says so and how to install the CUDA build, and checks no CUDA against it.
        assert "cannot import tensorflow" in tf["detail"] or "CPU build" in tf["detail"], tf
        assert "tensorflow[and-cuda]" in (tf["fix"] or ""), tf
        return
    for name in ("TensorFlow", "CUDA version", "TensorFlow sees the GPUs"):
        assert by_name[name]["status"] in ("passed", "warning"), by_name[name]
