"""GPUs that match (issue 22): a job asking for several GPUs gets GPUs of one model, waiting
rather than mixing unless it allows mixed GPUs; `gpus` shows each GPU's model. Fake GPUs of
two models, interleaved so that the lowest free indices are never alike."""

from __future__ import annotations

import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from gpuhop.client.embedded import start_background, stop
from tests.conftest import AGENT_PYTHON_FLAGS, wait_until

MODELS = "A100,V100,A100,V100"
SLEEP = "import time; time.sleep(120)"


def test_multi_gpu_jobs_get_one_model_or_wait_unless_mixed(make_agent, project):
    agent = make_agent(fake_gpus=4, args=("--fake-gpu-models", MODELS))
    root = project({"sleep.py": SLEEP})
    listed = agent.cli("gpus")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[1] for line in listed.stdout.splitlines()[1:]] == MODELS.split(",")
    with agent.client() as client:

        def run(gpus: int, **more):
            return client.submit(["sleep.py"], workdir=root, gpus=gpus, **more)

        def started(job):
            """The job's info once it runs."""
            return wait_until(lambda: (info := job.refresh()).state == JobState.running and info)

        pair = started(run(2))
        assert pair.gpu_ids == [0, 2]  # both A100s, not GPUs 0 and 1
        with pytest.raises(GpuhopError) as three:
            run(3)
        assert three.value.status == 400
        assert "at most 2 alike (2 x A100, 2 x V100)" in three.value.message
        assert "--mixed-gpus" in three.value.message
        client.job(pair.id).cancel(grace=0)
        wait_until(lambda: client.job(pair.id).state.finished)
        # GPU 0 (A100) and 1 (V100) busy: the two free ones are of two models.
        singles = [started(run(1)) for _ in range(2)]
        assert sorted(g for s in singles for g in s.gpu_ids) == [0, 1]
        mixed = started(run(2, mixed_gpus=True))
        assert mixed.gpu_ids == [2, 3] and mixed.mixed_gpus
        client.job(mixed.id).cancel(grace=0)
        wait_until(lambda: client.job(mixed.id).state.finished)
        alike = run(2)
        why = wait_until(lambda: alike.refresh().waiting)
        assert why.startswith("1st in line; no 2 free GPUs of one model (see --mixed-gpus)")
        # It holds up the GPU jobs behind it, so a share that would fit waits behind it.
        share = run(0, gpu_memory_mb=1024)
        assert wait_until(lambda: share.refresh().waiting).startswith("2nd in line; ")
        shown = agent.cli("show", alike.id)
        assert "no 2 free GPUs of one model" in shown.stdout
        a100 = next(s for s in singles if s.gpu_ids == [0])
        client.job(a100.id).cancel(grace=0)
        assert started(alike).gpu_ids == [0, 2]


def test_a_queued_job_whose_gpus_of_one_model_are_gone_after_a_restart_fails_saying_so(
    make_agent, project
):
    agent = make_agent(fake_gpus=2)
    root = project({"sleep.py": SLEEP})
    with agent.client() as client:
        holder = client.submit(["sleep.py"], workdir=root, gpus=2)
        pair = client.submit(["sleep.py"], workdir=root, gpus=2)
        wait_until(lambda: holder.refresh().state == JobState.running)
        assert pair.refresh().state == JobState.queued
    stop(agent.paths)  # the holder keeps running
    # Back with two GPUs of two models: two alike GPUs are no longer there.
    agent.pid = start_background(
        agent.paths,
        fake_gpus=2,
        agent_args=("--fake-gpu-models", "A100,V100"),
        python_flags=AGENT_PYTHON_FLAGS,
    )
    with agent.client() as client:
        failed = client.job(pair.id).wait(timeout=30)
    assert failed.state == JobState.failed
    assert failed.reason == (
        "could not start: it asks for 2 GPUs of one model; this host now has 2 GPU(s), at"
        " most 1 alike: submit it again with --mixed-gpus, or for fewer GPUs"
    )
