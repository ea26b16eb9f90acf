"""Requests that once wedged the agent for everybody (issue 19): text that is not text, a
path 1,000 directories deep, and jobs stored with either by an older agent. Each is refused
at the door with a 4xx naming the field; a job whose start raises anyway fails with the
reason and frees its GPUs; listings, cancels and restarts go on working."""

from __future__ import annotations

import json
import sqlite3
import time

import httpx
import pytest

from gpuhop.api import JobState
from gpuhop.client.embedded import start_background
from tests.conftest import AGENT_PYTHON_FLAGS, wait_until
from tests.integration.test_agent_restart import kill_agent_hard

BASE = "http://agent"
DEEP = "/".join(["d"] * 1000) + "/f.py"  # 2 KB in all


def raw_http(agent) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(agent.paths.socket)), base_url=BASE, timeout=30
    )


def post_json(http: httpx.Client, path: str, text: str) -> httpx.Response:
    # Raw JSON text: "\\ud800" is a lone surrogate that Python's json module accepts.
    return http.post(path, content=text, headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"command": ["sleep", "1"], "env": {"A": "\\ud800"}}', "env['A']"),
        ('{"command": ["sleep", "\\udc80"]}', "command[1]"),
        ('{"command": ["sleep", "1"], "env": {"\\ud800": "1"}}', "env (a key)"),
        ('{"command": ["sleep", "1"], "name": "x\\ud800"}', "name"),
        ('{"command": ["sleep", "1"], "requirements": "numpy\\ud800"}', "requirements"),
    ],
)
def test_text_with_a_lone_surrogate_is_refused_naming_the_field(shared_agent, body, field):
    with raw_http(shared_agent) as http:
        r = post_json(http, "/v1/jobs", body)
        assert r.status_code == 422, r.text
        assert field in r.json()["message"] and "not valid text" in r.json()["message"]
        assert http.get("/v1/jobs").status_code == 200


def test_a_tree_path_1000_deep_or_too_long_is_refused(shared_agent):
    digest = "0" * 64
    with raw_http(shared_agent) as http:
        for path, words in [
            (DEEP, "1001 levels deep"),
            ("a" * 300 + "/f", "a name longer than 255 bytes"),
            ("/".join(["a" * 99] * 40), "longer than 3072 bytes"),
            ("/".join(["é" * 99] * 20), "longer than 3072 bytes"),
            ("f\udc80.py", "surrogate"),
        ]:
            entry = {"path": path, "digest": digest, "size": 1}
            r = post_json(http, "/v1/trees", json.dumps({"entries": [entry]}))
            assert r.status_code == 422, r.text
            assert words in r.json()["message"]


def _store_old_job(agent, job_id: str, command: list[str], env: dict[str, str]) -> None:
    """Insert a queued job as an older agent, which checked less, could have stored it."""
    db = sqlite3.connect(agent.paths.db)
    with db:
        db.execute(
            "INSERT INTO jobs (id, name, state, command, spec, priority, created_at)"
            " VALUES (?, NULL, 'queued', ?, ?, 0, ?)",
            (job_id, json.dumps(command), json.dumps({"gpus": 1, "env": env}), time.time()),
        )
    db.close()


@pytest.mark.agent_log(r"starting job \w+ raised")
def test_jobs_stored_with_bad_text_or_a_deep_path_fail_and_free_their_gpu(make_agent, project):
    agent = make_agent(fake_gpus=1)
    with agent.client() as client:
        assert client.info().version  # up, its store made
    kill_agent_hard(agent)
    # As an older agent stored them: a lone surrogate in the environment (Popen raises
    # UnicodeEncodeError) and a tree with a path 1,000 directories deep (RecursionError).
    _store_old_job(agent, "badenv01", ["sleep", "0"], {"A": "\ud800"})
    _store_old_job(agent, "deeptree", ["f.py"], {})
    deep = agent.paths.job_dir("deeptree")
    deep.mkdir(parents=True)
    entry = {"path": DEEP, "digest": "0" * 64, "size": 0, "executable": False}
    (deep / "tree.json").write_text(json.dumps({"entries": [entry]}))
    agent.pid = start_background(agent.paths, fake_gpus=1, python_flags=AGENT_PYTHON_FLAGS)
    with agent.client() as client:
        for job_id in ("badenv01", "deeptree"):
            info = client.job(job_id).wait(30)
            assert info.state == JobState.failed and info.reason.startswith("could not start")
            assert info.gpu_ids == [] or info.ended_at is not None
        assert "\\ud800" in client.job("badenv01").refresh().env["A"]  # listed, escaped
        assert {j.id for j in client.jobs()} >= {"badenv01", "deeptree"}
        # The GPU is free: a job that needs it runs.
        ok = client.submit(["t.py"], workdir=project({"t.py": "print('ran')"}), gpus=1)
        assert ok.wait(60).state == JobState.succeeded


def test_a_job_stuck_in_starting_by_an_older_agent_does_not_wedge_a_restart(make_agent):
    agent = make_agent(fake_gpus=1)
    with agent.client() as client:
        assert client.info().version
    kill_agent_hard(agent)
    _store_old_job(agent, "stuck001", ["sleep", "\ud800"], {})
    db = sqlite3.connect(agent.paths.db)
    with db:
        db.execute("UPDATE jobs SET state = 'starting', gpu_ids = '[0]' WHERE id = 'stuck001'")
    db.close()
    agent.pid = start_background(agent.paths, fake_gpus=1, python_flags=AGENT_PYTHON_FLAGS)
    with agent.client() as client:
        info = client.job("stuck001").wait(30)
        assert info.state == JobState.failed and "UnicodeEncodeError" in info.reason
        wait_until(lambda: client.gpus()[0].job_ids == [], timeout=10)
