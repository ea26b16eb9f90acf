"""TensorBoard server jobs on a real agent (Unix socket and TLS listener): who may start
one, reuse of a running one, and the errors that say what to do. The CLI, with real event
files read live through the forward, is in tests/e2e/test_tensorboard_cli.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuhop.agent.errors import ApiError
from gpuhop.agent.services.tensorboard import python_with_tensorboard
from gpuhop.api import JobState, fingerprint_of
from gpuhop.client import Client, GpuhopError
from gpuhop.client import tensorboard as tb_client
from gpuhop.client.transport.remotes import Remote, RemotesFile, save
from gpuhop.client.transport.tls import fetch_certificate
from tests.conftest import Agent, wait_until

SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(120)\n"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    root = Path(tmp_path_factory.mktemp("tb-agent"))
    agent = Agent(root / "home", root / "cache", None, args=("--listen", "127.0.0.1:0"))
    try:
        yield agent.start()
    finally:
        agent.shutdown()


@pytest.fixture
def as_user(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Callable[[str, bool], Client]]:
    """as_user(name, admin) -> a Client over TLS (pinned) with a new token for that user."""
    monkeypatch.setenv("GPUHOP_CONFIG_DIR", str(tmp_path / "config"))
    listener = agent.listener
    pem, _ = fetch_certificate(listener.url)
    clients: list[Client] = []

    def make(user: str, admin: bool = False) -> Client:
        with agent.client() as owner:
            token = owner.create_token(user, admin=admin).token
        team = Remote(
            name="team", url=listener.url, certificate=pem, fingerprint=fingerprint_of(pem)
        )
        team.token = token
        save(RemotesFile(remotes={"team": team}))
        clients.append(Client(remote="team", cache_dir=agent.cache))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def test_only_the_owner_or_an_admin_may_start_it_and_a_running_one_is_reused(
    agent, as_user, project
):
    with agent.client() as owner:
        job = owner.submit(["sleep.py"], workdir=project({"sleep.py": SLEEPER}))
        wait_until(lambda: job.refresh().state == JobState.running)
        bob, carol = as_user("bob"), as_user("carol", True)

        with pytest.raises(GpuhopError) as refused:
            tb_client.start(bob, job.id, wait=False)
        # Another user's job does not exist for bob, and no server was started for him.
        assert (refused.value.status, refused.value.message) == (404, f"no job matches {job.id!r}")
        assert [j.id for j in owner.jobs()] == [job.id]

        tb = tb_client.start(carol, job.id)  # an admin may; it waits until TensorBoard answers
        assert (tb.info.source_job, tb.info.reused, tb.info.has_events) == (job.id, False, False)
        jd = agent.paths.jobs / job.id
        assert tb.info.logdir == str(jd / "artifacts" / "tensorboard")
        assert tb.info.logdirs == [tb.info.logdir, str(jd / "work")]  # where tutorials log
        server = owner.job(tb.info.job).info
        # The server is the job's owner's (so both find it), holds no GPU, and runs in a
        # private network: its port is reachable only through the agent.
        assert (server.owner, server.gpus, server.private_network) == (job.info.owner, 0, True)
        assert server.name == f"tensorboard-{job.id}"

        again = owner.job(job.id).tensorboard(wait=False)
        assert (again.info.job, again.info.reused) == (tb.info.job, True)
        assert tb_client.find(owner, job.id).info.job == tb.info.job
        with pytest.raises(GpuhopError) as not_a_source:
            tb_client.start(owner, tb.info.job, wait=False)
        assert not_a_source.value.status == 400
        assert "is itself a TensorBoard server" in not_a_source.value.message

        assert tb.stop().state == JobState.cancelled
        with pytest.raises(GpuhopError) as gone:
            tb_client.find(owner, job.id)
        assert gone.value.status == 404
        job.cancel(grace=1)


def test_a_finished_job_that_wrote_no_logs_is_an_error_naming_the_dir(agent, project):
    with agent.client() as client:
        job = client.submit(["hi.py"], workdir=project({"hi.py": "print('hi')\n"}))
        assert job.wait(timeout=60).state == JobState.succeeded
        with pytest.raises(GpuhopError) as missing:
            job.tensorboard(wait=False)
    logdir = agent.paths.jobs / job.id / "artifacts" / "tensorboard"
    assert missing.value.status == 404
    assert missing.value.message == (
        f"job {job.id} succeeded without writing TensorBoard logs: no event files in its"
        f" $GPUHOP_TENSORBOARD_DIR ({logdir}) nor its work dir; write them anywhere in the"
        " work dir, as tutorials do (tf.keras.callbacks.TensorBoard(log_dir='logs/fit')), or"
        " into $GPUHOP_TENSORBOARD_DIR with callbacks=gpuhop.tf.callbacks(tensorboard=True)"
    )


def test_a_host_without_tensorboard_gets_the_command_that_installs_it(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    bare = str(venv / "bin" / "python")
    with pytest.raises(ApiError) as missing:
        python_with_tensorboard([bare])
    assert missing.value.status == 409
    assert missing.value.message == (
        f"TensorBoard is not installed on the GPU host (no tensorboard module for {bare});"
        f" install it there with: {bare} -m pip install tensorboard"
    )
    assert python_with_tensorboard([bare, sys.executable]) == sys.executable
