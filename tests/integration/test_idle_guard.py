"""The idle guard (issue 22): with `idle_gpu_minutes` in agent.toml, a job holding whole GPUs
at 0 % for that long is warned in its log, and with `idle_action = "cancel"` cancelled with
class `idle`; a job that uses its GPU is left alone. Real agents with two fake GPUs, whose
load is set through their seam file; a window of 3 s (0.05 minutes)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuhop.api import JobState
from tests.conftest import Agent, wait_until

SLEEP = "import time; time.sleep(120)"


@pytest.fixture
def idle_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Agent]]:
    """idle_agent(action) -> a started agent with 2 fake GPUs, GPU 0 busy at 60 %."""
    started: list[Agent] = []

    def make(action: str) -> Agent:
        root = Path(tmp_path_factory.mktemp("idle-agent"))
        home = root / "home"
        home.mkdir()
        (home / "agent.toml").write_text(f'idle_gpu_minutes = 0.05\nidle_action = "{action}"\n')
        (home / "fake-gpus.json").write_text(json.dumps({"0": {"utilization": 60}}))
        agent = Agent(home, root / "cache", 2)
        started.append(agent)
        return agent.start()

    yield make
    for agent in started:
        agent.shutdown()


def log_of(job) -> str:
    return b"".join(job.logs()).decode()


def test_an_idle_job_is_warned_then_cancelled_and_a_busy_one_left_alone(idle_agent, project):
    agent = idle_agent("cancel")
    root = project({"sleep.py": SLEEP})
    with agent.client() as client:
        busy = client.submit(["sleep.py"], workdir=root, gpus=1)
        wait_until(lambda: busy.refresh().state == JobState.running)
        idle = client.submit(["sleep.py"], workdir=root, gpus=1)
        ended = wait_until(lambda: (i := idle.refresh()).state.finished and i)
        assert (ended.state, ended.end_class, ended.gpu_ids) == (JobState.cancelled, "idle", [1])
        assert "its GPU(s) 1 sat at 0%" in (ended.reason or "")
        warning = log_of(idle)
        assert "gpuhop: GPU(s) 1 held by this job have been at 0% utilisation" in warning
        assert "cancelling it (idle_action = cancel)" in warning
        # The busy job ran all that time (and longer than the window), untouched.
        assert busy.refresh().state == JobState.running
        assert "gpuhop:" not in log_of(busy)


def test_with_the_warn_policy_an_idle_job_is_warned_and_runs_on(idle_agent, project):
    agent = idle_agent("warn")
    root = project({"sleep.py": SLEEP})
    with agent.client() as client:
        client.submit(["sleep.py"], workdir=root, gpus=1)  # GPU 0, busy
        idle = client.submit(["sleep.py"], workdir=root, gpus=1)
        wait_until(lambda: "at 0% utilisation" in log_of(idle))
        assert idle.refresh().state == JobState.running
        assert "end the job if it is done with them" in log_of(idle)
