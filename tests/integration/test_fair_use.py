"""Fair use on a team agent (issue 22): agent.toml limits each user's GPUs held at once (a
job over it waits, and `show` says why, while other users' jobs go past it) and queued jobs
(over it, a submit is refused with 429). A real agent with a TLS listener and two users."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from tests.conftest import Agent, wait_until
from tests.integration import test_tls
from tests.integration.test_tls import raw_http
from tests.team import team_agent, team_tokens

remote = test_tls.remote
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture(scope="module")
def tls_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    root = Path(tmp_path_factory.mktemp("fair-agent"))
    with team_agent(root, 3, config="user_max_gpus = 1\nuser_max_queued = 2\n") as agent:
        yield agent


@pytest.fixture(scope="module")
def tokens(tls_agent: Agent) -> dict[str, str]:
    return team_tokens(tls_agent)


def test_a_user_over_the_gpu_limit_waits_and_over_the_queue_limit_is_refused(
    tls_agent, tokens, remote
):
    submitted: list[str] = []
    try:
        with (
            raw_http(tls_agent, tokens["alice"]) as alice,
            raw_http(tls_agent, tokens["bob"]) as bob,
        ):

            def submit(http, **fields):
                r = http.post("/v1/jobs", json={"command": SLEEP, **fields})
                if r.status_code == 201:
                    submitted.append(r.json()["id"])
                return r

            def state(http, job_id):
                return http.get(f"/v1/jobs/{job_id}").json()

            first = submit(alice, gpus=1).json()["id"]
            wait_until(lambda: state(alice, first)["state"] == "running")
            second = submit(alice, gpus=1).json()["id"]
            why = wait_until(lambda: state(alice, second)["waiting"])
            assert "alice holds 1 GPU(s)" in why and "limit is 1 per user" in why
            # Bob's job, queued after it, is not held back by alice's waiting one.
            theirs = submit(bob, gpus=1).json()["id"]
            wait_until(lambda: state(bob, theirs)["state"] == "running")
            assert state(alice, second)["state"] == "queued"
            # A CPU job holds no GPU: it runs whatever alice's GPUs.
            cpu = submit(alice).json()["id"]
            wait_until(lambda: state(alice, cpu)["state"] == "running")
            # Two queued: the third is refused, naming the limit.
            assert submit(alice, gpus=1).status_code == 201
            refused = submit(alice, gpus=1)
            assert refused.status_code == 429, refused.text
            assert refused.json()["code"] == "too_many"
            assert "alice already has 2 job(s) queued" in refused.json()["message"]
            assert "user_max_queued" in refused.json()["message"]
            # A job that could never start says so with a full queue too, not "try later".
            never = submit(alice, gpus=2)
            assert never.status_code == 400 and "at most 1 at once" in never.json()["message"]
            assert submit(bob).status_code == 201  # bob's queue is his own
            # A job that alone asks for more than the limit could never start: refused.
            greedy = submit(bob, gpus=2)
            assert greedy.status_code == 400 and "at most 1 at once" in greedy.json()["message"]
        # `gpuhop show` tells alice why her job waits.
        remote(tokens["alice"]).close()  # writes the remote 'team' for the CLI
        env = {**os.environ, "GPUHOP_REMOTE": "team", "GPUHOP_TOKEN": tokens["alice"]}
        shown = tls_agent.cli("show", second, env=env)
        assert shown.returncode == 0, shown.stderr
        assert "waiting" in shown.stdout and "limit is 1 per user" in shown.stdout
        with tls_agent.client() as owner:
            assert owner.job(second).state == JobState.queued
    finally:
        with raw_http(tls_agent, tokens["carol"]) as carol:
            for job_id in submitted:
                carol.post(f"/v1/jobs/{job_id}/cancel", params={"grace": 0})


def test_a_waiting_job_names_only_its_owners_own_holders(tls_agent, tokens):
    submitted: list[str] = []
    try:
        with (
            raw_http(tls_agent, tokens["alice"]) as alice,
            raw_http(tls_agent, tokens["bob"]) as bob,
            raw_http(tls_agent, tokens["carol"]) as carol,
        ):

            def submit(http, **fields):
                r = http.post("/v1/jobs", json={"command": SLEEP, **fields})
                assert r.status_code == 201, r.text
                submitted.append(r.json()["id"])
                return r.json()["id"]

            def job(http, job_id):
                return http.get(f"/v1/jobs/{job_id}").json()

            # Every GPU held: one by bob, two by carol (an admin: no limit).
            for http, name, gpus in ((bob, "bobs-secret", 1), (carol, "carols", 2)):
                job_id = submit(http, gpus=gpus, name=name)
                wait_until(lambda http=http, job_id=job_id: job(http, job_id)["state"] == "running")
            mine = submit(alice, gpus=1, name="mine")
            theirs = submit(carol, gpus=1, name="next")
            # Alice sees her place and that other users hold the GPUs, not which jobs.
            why = wait_until(lambda: job(alice, mine)["waiting"])
            assert why == "1st in line; waits for 1 GPU; held by 2 jobs of other users"
            listed = alice.get("/v1/jobs", params={"state": "queued"}).json()
            assert [j["waiting"] for j in listed] == [why]
            # Carol's own holder is named; bob's is not, to her either.
            assert wait_until(lambda: job(carol, theirs)["waiting"]) == (
                "2nd in line; waits for 1 GPU; held by carols, another user's job"
            )
    finally:
        with raw_http(tls_agent, tokens["carol"]) as carol:
            for job_id in submitted:
                carol.post(f"/v1/jobs/{job_id}/cancel", params={"grace": 0})


def test_a_sweep_cut_short_by_the_queue_limit_names_the_runs_it_queued(
    tls_agent, tokens, remote, project
):
    root = project({"nap.py": "import sys, time; time.sleep(float(sys.argv[1]))"})
    bob = remote(tokens["bob"])
    try:
        # One at a time: the others wait in the queue, and bob may queue two.
        with pytest.raises(GpuhopError) as refused:
            bob.sweep("nap.py 120", array=4, workdir=root, gpus=1, max_parallel=1, name="cut")
        error = refused.value
        assert error.status == 429 and "user_max_queued" in error.message
        queued = error.detail["queued_runs"]
        assert len(queued) in (2, 3)
        sweep = error.detail["sweep"]
        assert f"{len(queued)} of the sweep's 4 runs were queued before it (sweep {sweep})" in (
            error.message
        )
        assert f"`gpuhop sweep cancel {sweep}` cancels them" in error.message
        assert sorted(r.id for r in bob.sweep_runs(sweep)) == sorted(queued)
    finally:
        with raw_http(tls_agent, tokens["carol"]) as carol:
            for job in carol.get("/v1/jobs").json():
                if job["owner"] == "bob" and job["state"] not in ("succeeded", "failed"):
                    carol.post(f"/v1/jobs/{job['id']}/cancel", params={"grace": 0})
