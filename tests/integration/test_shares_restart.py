"""Shares across an agent restart: holdings are rebuilt from the store, and a queued share
that no longer fits any GPU is failed with a reason instead of waiting forever."""

from __future__ import annotations

from gpuhop.api import JobState
from gpuhop.client.embedded import start_background, stop
from tests.conftest import AGENT_PYTHON_FLAGS, wait_until

HOLD = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""


def test_shares_survive_a_restart_and_a_share_too_big_for_the_new_gpus_fails(
    make_agent, project, tmp_path
):
    agent = make_agent(fake_gpus=1)
    root = project({"hold.py": HOLD})
    release = tmp_path / "release"
    with agent.client() as client:
        running = client.submit(["hold.py", str(release)], workdir=root, gpu_memory="3GiB")
        big = client.submit(["hold.py", str(release)], workdir=root, gpu_memory="6GiB")
        wait_until(lambda: running.refresh().state == JobState.running, timeout=30)
        assert big.refresh().state == JobState.queued  # 3 + 6 GiB > 8 GiB
    stop(agent.paths)  # the running job keeps running
    # Back with one 4 GiB GPU: the 3 GiB share still fits; the 6 GiB one never will.
    agent.pid = start_background(
        agent.paths, fake_gpus=1, fake_gpu_memory_mb=4096, python_flags=AGENT_PYTHON_FLAGS
    )
    with agent.client() as client:
        failed = client.job(big.id).wait(timeout=30)
        assert client.job(running.id).state == JobState.running
        [gpu] = client.gpus()
        assert (gpu.memory_mb, gpu.job_ids, gpu.memory_reserved_mb) == (4096, [running.id], 3072)
        release.touch()
        assert client.job(running.id).wait(timeout=30).state == JobState.succeeded
    assert failed.state == JobState.failed
    assert failed.reason == (
        "could not start: it asks for 6 GiB of one GPU's memory; this host now has 1 GPU(s)"
        " with up to 4 GiB each"
    )


def test_gpu_jobs_queued_before_a_restart_that_finds_no_gpu_wait_for_them(
    make_agent, project, tmp_path
):
    agent = make_agent(fake_gpus=1)
    root = project({"hold.py": HOLD, "cpu.py": "print('on the CPU')\n"})
    release = tmp_path / "release"
    with agent.client() as client:
        running = client.submit(["hold.py", str(release)], workdir=root, gpus=1)
        queued = client.submit(["hold.py", str(release)], workdir=root, gpus=1)
        wait_until(lambda: running.refresh().state == JobState.running, timeout=30)
    stop(agent.paths)
    # Back without a GPU (a driver not up yet at boot): the GPU job waits, saying why, and
    # does not fail; a CPU job runs past it.
    agent.pid = start_background(agent.paths, fake_gpus=0, python_flags=AGENT_PYTHON_FLAGS)
    with agent.client() as client:
        cpu = client.submit(["cpu.py"], workdir=root).wait(timeout=60)
        assert cpu.state == JobState.succeeded
        shown = agent.cli("show", queued.id)
        assert "shows no GPU since the agent started" in shown.stdout, shown.stdout
        assert client.job(queued.id).state == JobState.queued
        release.touch()
        assert client.job(running.id).wait(timeout=30).state == JobState.succeeded
    stop(agent.paths)
    # Its GPU back: the job that waited runs.
    agent.pid = start_background(agent.paths, fake_gpus=1, python_flags=AGENT_PYTHON_FLAGS)
    with agent.client() as client:
        assert client.job(queued.id).wait(timeout=60).state == JobState.succeeded
