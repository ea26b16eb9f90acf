"""GPU health (issue 22): a GPU with a hardware fault is quarantined. The job on it ends
`gpu-fault` and is retried on another GPU; no new job gets the GPU, also after an agent
restart; `gpus`, `/metrics` say why; only an admin's `gpuhop gpus --release N` puts it back.

A real team agent (TLS listener, tokens) with two fake GPUs; faults are injected through the
fake GPUs' seam file in the agent's state dir, the way the agent reads NVML's readings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.client.embedded import stop
from tests.conftest import Agent, wait_until
from tests.integration.test_tls import raw_http
from tests.team import team_agent, team_tokens

SLEEP = "import time; time.sleep(120)"


@pytest.fixture
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    with team_agent(Path(tmp_path_factory.mktemp("health-agent")), 2) as started:
        yield started


def inject(agent: Agent, readings: dict[int, dict]) -> None:
    seam = agent.paths.fake_gpus_seam
    tmp = seam.with_suffix(".tmp")
    tmp.write_text(json.dumps({str(k): v for k, v in readings.items()}))
    tmp.replace(seam)


def test_a_faulty_gpu_is_quarantined_its_job_retried_elsewhere_until_an_admin_releases_it(
    agent, project
):
    root = project({"sleep.py": SLEEP})
    tokens = team_tokens(agent)
    client = agent.client()  # the owner: an admin
    try:

        def run(gpus: int = 1, **more):
            return client.submit(["sleep.py"], workdir=root, gpus=gpus, **more)

        def running(job, attempt: int = 1):
            return wait_until(
                lambda: (
                    (i := job.refresh()).state == JobState.running and i.attempt == attempt and i
                )
            )

        first = run(retries=1)
        assert running(first).gpu_ids == [0]
        inject(agent, {0: {"xid": 79}})
        retry = running(first, attempt=2)
        assert retry.gpu_ids == [1]
        log = b"".join(first.logs()).decode()
        assert "attempt 1 failed: GPU 0 failed (XID 79 (GPU fell off the bus))" in log
        assert "[gpu-fault]; retrying" in log
        # GPU 0 is free but quarantined: a new job waits for GPU 1 rather than take it.
        waiting = run()
        cpu = run(gpus=0)  # queued after it: once it runs, the scheduler has seen both
        running(cpu)
        assert waiting.refresh().state == JobState.queued
        listed = agent.cli("gpus")
        assert listed.returncode == 0, listed.stderr
        assert "QUARANTINED" in listed.stdout.splitlines()[1]
        assert "GPU 0 is quarantined: XID 79 (GPU fell off the bus)" in listed.stderr
        assert "gpuhop gpus --release 0" in listed.stderr
        with raw_http(agent, tokens["alice"]) as alice:
            scraped = alice.get("/metrics").text
            assert 'gpuhop_gpu_quarantined{fault="xid",gpu="0",name="Fake GPU"} 1.0' in scraped
            assert 'gpuhop_gpu_quarantined{fault="",gpu="1",name="Fake GPU"} 0.0' in scraped
        # The quarantine outlives the agent.
        client.close()
        stop(agent.paths, timeout=10)
        agent.start()
        client = agent.client()
        assert client.gpus()[0].quarantined == "XID 79 (GPU fell off the bus)"
        # Its last attempt's GPU fails too: no retry left, so it ends with that class.
        inject(agent, {0: {"xid": 79}, 1: {"ecc_uncorrected": 3}})
        ended = wait_until(lambda: (i := client.job(first.id).refresh()).state.finished and i)
        assert (ended.state, ended.end_class) == (JobState.failed, "gpu-fault")
        assert "GPU 1 failed (3 uncorrectable ECC error(s)" in (ended.reason or "")
        # Only an admin puts a GPU back; the same fault, still read, does not take it again.
        with raw_http(agent, tokens["alice"]) as alice:
            refused = alice.post("/v1/agent/gpus/0/release")
            assert refused.status_code == 403, refused.text
            assert "only an admin may release" in refused.json()["message"]
        with raw_http(agent, tokens["carol"]) as carol:
            assert carol.post("/v1/agent/gpus/7/release").status_code == 404
        released = agent.cli("gpus", "--release", "0")
        assert released.returncode == 0, released.stderr
        assert "GPU 0 (Fake GPU) is back in service" in released.stderr
        assert running(client.job(waiting.id)).gpu_ids == [0]
        again = agent.cli("gpus", "--release", "0")
        assert again.returncode != 0 and "GPU 0 is not quarantined" in again.stderr
        assert client.gpus()[0].quarantined is None and client.gpus()[1].quarantined
    finally:
        client.close()


def test_a_job_that_needs_a_quarantined_gpu_holds_up_no_job_behind_it(agent, project):
    """It waits on an admin's release, not on GPUs coming free: jobs behind it that fit on
    the GPUs in service run meanwhile, rather than the whole GPU queue stalling."""
    root = project({"sleep.py": SLEEP})
    client = agent.client()
    try:

        def state(job) -> JobState:
            return job.refresh().state

        holder = client.submit(["sleep.py"], workdir=root, gpu_memory_mb=6144)
        wait_until(lambda: state(holder) == JobState.running)
        assert holder.refresh().gpu_ids == [0]
        inject(agent, {1: {"xid": 79}})
        wait_until(lambda: client.gpus()[1].quarantined is not None)
        both = client.submit(["sleep.py"], workdir=root, gpus=2)
        share = client.submit(["sleep.py"], workdir=root, gpu_memory_mb=1024)
        whole = client.submit(["sleep.py"], workdir=root, gpus=1)
        # The share fits beside the holder on GPU 0; the whole-GPU job has none in service.
        wait_until(lambda: state(share) == JobState.running)
        assert share.refresh().gpu_ids == [0]
        assert "GPU(s) 1 quarantined for a hardware fault" in (both.refresh().waiting or "")
        assert state(both) == JobState.queued and state(whole) == JobState.queued
        assert "held by" in (whole.refresh().waiting or "")
        for job in (holder, both, share, whole):
            job.cancel()
    finally:
        client.close()
