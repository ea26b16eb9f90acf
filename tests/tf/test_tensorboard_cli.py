"""`gpuhop tensorboard` as a user runs it, against jobs that train with Keras and write
real TensorBoard event files: through `gpuhop.tf.callbacks(tensorboard=True)`, and as the
TensorBoard tutorial does, into `./logs/fit/STAMP`. TensorBoard starts before the job has
logged anything, shows the run once it has (while the job still runs), and stops with the
command's Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest

from gpuhop.api import JobState
from gpuhop.client import Client, GpuhopError, Job
from tests.conftest import Agent, wait_until

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

# Trains a tiny model for one epoch once the test says "go", then idles until cancelled.
TRAIN = """
import os, time
while not os.path.exists(os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "go")):
    time.sleep(0.05)
import numpy as np
import tensorflow as tf
import gpuhop.tf
x = np.linspace(0, 1, 64, dtype="float32").reshape(32, 2)
y = x.sum(axis=1, keepdims=True)
model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(x, y, epochs=1, verbose=2, callbacks=gpuhop.tf.callbacks(backup=False, tensorboard=True))
print("trained", flush=True)
time.sleep(300)
"""


# The TensorBoard tutorial's program (tensorflow.org/tensorboard/get_started), as written but
# for its data: it waits for the test's "go" before training and for "end" before it exits.
TUTORIAL = """
import datetime, os, time
import numpy as np
import tensorflow as tf

def wait_for(name):
    while not os.path.exists(os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], name)):
        time.sleep(0.05)

wait_for("go")
x = np.random.default_rng(0).random((64, 4), dtype="float32")
y = (x.sum(axis=1) > 2).astype("int32")
model = tf.keras.models.Sequential([
    tf.keras.layers.Input((4,)),
    tf.keras.layers.Dense(8, activation="relu"),
    tf.keras.layers.Dense(2, activation="softmax"),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
log_dir = "logs/fit/" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
tensorboard_callback = tf.keras.callbacks.TensorBoard(log_dir=log_dir, histogram_freq=1)
model.fit(x, y, epochs=2, validation_split=0.25, verbose=2, callbacks=[tensorboard_callback])
print("trained", flush=True)
wait_for("end")
"""


@contextlib.contextmanager
def tensorboard_cli(
    agent: Agent, ref: str, said: list[str]
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`gpuhop tensorboard REF` running: (its local URL, its process); its stderr goes to
    `said` once it has ended."""
    cli = subprocess.Popen(
        [sys.executable, "-m", "gpuhop", "tensorboard", ref, "--no-browser", "--local-port", "0"],
        env=agent.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(cli.stderr or ()))
    reader.start()
    try:
        assert cli.stdout is not None
        url = cli.stdout.readline().strip()  # the command prints the local URL once it works
        assert url.startswith("http://127.0.0.1:"), "".join(stderr)
        yield url, cli
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.wait()
        reader.join()
        for stream in (cli.stdout, cli.stderr):
            if stream is not None:
                stream.close()
        said.append("".join(stderr))


def scalars(http: httpx.Client, run: str, tag: str) -> list[list[float]]:
    return http.get("/data/plugin/scalars/scalars", params={"run": run, "tag": tag}).json()


# How often a test asks TensorBoard (through the command's forwarded port) whether it shows
# what it waits for: each question costs the test, the command and the server some CPU.
POLL = 0.25


@contextlib.contextmanager
def ended_at_the_end(client: Client, job: Job) -> Iterator[Job]:
    """`job`, cancelled at the end with the TensorBoard servers started for it, however the
    test ends (the agent is shared with other tests)."""
    try:
        yield job
    finally:
        for other in client.jobs():
            if (other.id == job.id or other.name == f"tensorboard-{job.id}") and (
                not other.state.finished
            ):
                with contextlib.suppress(GpuhopError):  # it may have ended meanwhile
                    ending = client.job(other.id)
                    ending.cancel(grace=1)
                    ending.wait(timeout=30)


def test_tensorboard_shows_a_running_jobs_logs_live_and_ctrl_c_stops_it(shared_agent, project):
    agent = shared_agent
    said: list[str] = []
    with agent.client() as client, contextlib.ExitStack() as stack:
        job = client.submit(["train.py"], workdir=project({"train.py": TRAIN}), name="tiny")
        stack.enter_context(ended_at_the_end(client, job))
        wait_until(lambda: job.refresh().state == JobState.running)
        with tensorboard_cli(agent, "tiny", said) as (url, cli):
            with httpx.Client(base_url=url, timeout=30) as http:
                assert http.get("/data/runs").json() == []  # nothing logged yet

                (agent.paths.jobs / job.id / "artifacts" / "go").touch()
                # TensorBoard lists a run as soon as it finds its directory, and loads its
                # scalars on a later pass of its reload loop: wait for the tag itself.
                wait_until(
                    lambda: (
                        "epoch_loss"
                        in http.get("/data/plugin/scalars/tags").json().get("train", {})
                    ),
                    timeout=120,
                    interval=POLL,
                )
                points = scalars(http, "train", "epoch_loss")
            [(_wall_time, step, loss)] = points
            assert step == 0 and loss > 0

            servers = [j for j in client.jobs() if j.name == "tensorboard-" + job.id]
            assert [s.state for s in servers] == [JobState.running]
            cli.send_signal(signal.SIGINT)
            assert cli.wait(timeout=60) == 0
        assert client.job(servers[0].id).wait(timeout=30).state == JobState.cancelled
        assert job.refresh().state == JobState.running  # the job itself trains on
        job.cancel(grace=1)
    [text] = said
    assert f"TensorBoard job {servers[0].id} started for job {job.id} (running)" in text
    assert "no TensorBoard event files there yet" in text
    assert f"TensorBoard job {servers[0].id} cancelled" in text
    assert "Traceback" not in text
    assert (agent.paths.jobs / job.id / "artifacts" / "tensorboard" / "train").is_dir()


def test_a_tutorials_logs_fit_runs_show_live_and_after_the_job_ends(shared_agent, project):
    agent = shared_agent
    said: list[str] = []
    artifacts = lambda job: agent.paths.jobs / job.id / "artifacts"  # noqa: E731
    with agent.client() as client, contextlib.ExitStack() as stack:
        job = client.submit(["tutorial.py"], workdir=project({"tutorial.py": TUTORIAL}))
        stack.enter_context(ended_at_the_end(client, job))
        wait_until(lambda: job.refresh().state == JobState.running)
        with tensorboard_cli(agent, job.id, said) as (url, cli):
            with httpx.Client(base_url=url, timeout=30) as http:
                assert http.get("/data/runs").json() == []  # nothing logged yet
                (artifacts(job) / "go").touch()

                def tags() -> dict[str, dict]:
                    found = http.get("/data/plugin/scalars/tags").json()
                    return found if sum("epoch_loss" in t for t in found.values()) == 2 else {}

                runs = sorted(wait_until(tags, timeout=120, interval=POLL))
                [stamp] = {run.split("/")[2] for run in runs}
                assert runs == [f"logs/fit/{stamp}/train", f"logs/fit/{stamp}/validation"]
                # Live: the job has trained and waits for "end"; TensorBoard shows it all now.
                wait_until(
                    lambda: len(scalars(http, runs[0], "epoch_loss")) == 2,
                    timeout=60,
                    interval=POLL,
                )
                assert job.refresh().state == JobState.running
            cli.send_signal(signal.SIGINT)
            assert cli.wait(timeout=60) == 0
        (artifacts(job) / "end").touch()
        assert job.wait(timeout=60).state == JobState.succeeded

        # Once it has ended, a new TensorBoard for it finds the same runs.
        with tensorboard_cli(agent, job.id, said) as (url, cli):
            with httpx.Client(base_url=url, timeout=30) as http:
                wait_until(
                    lambda: len(scalars(http, runs[1], "epoch_loss")) == 2,
                    timeout=60,
                    interval=POLL,
                )
                [(_, step, loss), _] = scalars(http, runs[0], "epoch_loss")
                assert step == 0 and loss > 0
            cli.send_signal(signal.SIGINT)
            assert cli.wait(timeout=60) == 0
    while_running, after = said
    assert "reading its work dir and $GPUHOP_TENSORBOARD_DIR" in while_running
    assert "no TensorBoard event files there yet" in while_running
    assert f"for job {job.id} (succeeded)" in after and "no TensorBoard event files" not in after
    assert "Traceback" not in while_running + after
