"""`gpuhop tensorboard` as a user runs it, against a job that trains with Keras and writes
real TensorBoard event files through `gpuhop.tf.callbacks(tensorboard=True)`: TensorBoard
starts before the job has logged anything, shows the run once it has, and stops with the
command's Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import httpx
import pytest

from gpuhop.api import JobState
from tests.conftest import wait_until

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


def test_tensorboard_shows_a_running_jobs_logs_live_and_ctrl_c_stops_it(make_agent, project):
    agent = make_agent()
    with agent.client() as client:
        job = client.submit(["train.py"], workdir=project({"train.py": TRAIN}), name="tiny")
        wait_until(lambda: job.refresh().state == JobState.running)
        cli = subprocess.Popen(
            [sys.executable, "-m", "gpuhop", "tensorboard", "tiny", "--no-browser", "-p", "0"],
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
                )
                points = http.get(
                    "/data/plugin/scalars/scalars", params={"run": "train", "tag": "epoch_loss"}
                ).json()
            [(_wall_time, step, loss)] = points
            assert step == 0 and loss > 0

            servers = [j for j in client.jobs() if j.name == "tensorboard-" + job.id]
            assert [s.state for s in servers] == [JobState.running]
            cli.send_signal(signal.SIGINT)
            assert cli.wait(timeout=60) == 0, "".join(stderr)
        finally:
            if cli.poll() is None:
                cli.kill()
            cli.wait()
            reader.join()
            for stream in (cli.stdout, cli.stderr):
                if stream is not None:
                    stream.close()
        said = "".join(stderr)
        assert client.job(servers[0].id).wait(timeout=30).state == JobState.cancelled
        assert job.refresh().state == JobState.running  # the job itself trains on
        job.cancel(grace=1)
    assert f"TensorBoard job {servers[0].id} started for job {job.id} (running)" in said
    assert "no TensorBoard event files there yet" in said
    assert f"TensorBoard job {servers[0].id} cancelled" in said
    assert "Traceback" not in said
    assert (agent.paths.jobs / job.id / "artifacts" / "tensorboard" / "train").is_dir()
