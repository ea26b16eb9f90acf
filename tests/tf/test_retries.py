"""A job killed mid-training is retried and resumes from its last finished epoch."""

from __future__ import annotations

import json

import pytest

from tests.conftest import wait_until

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

RESUMABLE = """
import os, signal
import numpy as np
import tensorflow as tf
import gpuhop.runtime
import gpuhop.tf


class DieOnFirstAttempt(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if gpuhop.runtime.attempt() == 1 and epoch + 1 == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(
    x, y, epochs=6, batch_size=32, verbose=2,
    callbacks=[*gpuhop.tf.callbacks(), DieOnFirstAttempt()],
)
print("finished on attempt", gpuhop.runtime.attempt())
"""


def test_sigkilled_job_resumes_from_its_last_epoch(shared_agent, project):
    root = project({"resume.py": RESUMABLE})
    run = shared_agent.cli(
        "run", "--name", "resumer", "--retries", "1", "resume.py", cwd=root, timeout=280
    )
    assert run.returncode == 0, run.stderr
    assert "gpuhop: attempt 1 failed: killed by signal 9 (SIGKILL" in run.stdout
    assert "retrying (attempt 2 of 2)" in run.stdout
    assert run.stdout.strip().endswith("finished on attempt 2")

    info = json.loads(shared_agent.cli("show", "--json", "resumer").stdout)
    assert (info["state"], info["attempt"], info["retries"]) == ("succeeded", 2, 1)
    [first] = info["attempts"]
    assert (first["attempt"], first["state"], first["signal"]) == (1, "failed", 9)

    with shared_agent.client() as client:
        records, _ = client.job("resumer").metrics()
    # Epochs 1-3 from the first attempt, then 4-6 from the second: nothing was re-trained.
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5, 6]


def test_retries_run_out_and_the_job_fails(shared_agent, project):
    root = project(
        {
            "fail.py": "import gpuhop.runtime, sys\n"
            "print('attempt', gpuhop.runtime.attempt()); sys.exit(3)\n"
        }
    )
    with shared_agent.client() as client:
        job = client.submit(["fail.py"], workdir=root, retries=2, retry_on="any")
        info = job.wait(timeout=60)
        log = b"".join(job.logs()).decode()
    assert (info.state.value, info.exit_code, info.attempt) == ("failed", 3, 3)
    assert [a.attempt for a in info.attempts] == [1, 2]
    assert [line for line in log.splitlines() if line.startswith("attempt")] == [
        "attempt 1",
        "attempt 2",
        "attempt 3",
    ]


def test_a_cancelled_job_is_not_retried(shared_agent, project):
    root = project({"slow.py": "import time\nprint('up', flush=True)\ntime.sleep(300)\n"})
    with shared_agent.client() as client:
        job = client.submit(["slow.py"], workdir=root, retries=3)
        wait_until(lambda: b"up" in b"".join(job.logs()), timeout=60)
        info = job.cancel(grace=1)
        info = job.wait(timeout=30)
    assert (info.state.value, info.attempt, info.attempts) == ("cancelled", 1, [])
