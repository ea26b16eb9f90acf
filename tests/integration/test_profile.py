"""Issue 39, `gpuhop profile`: TensorFlow's profiler run inside a running Keras `fit` on
request, its trace read back by TensorBoard's profile plugin's own converter (op statistics,
the train function); py-spy's flame graph of a plain Python job; the refusals. The session's
agent and the CLI as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuhop.api import JobState
from tests.conftest import Agent, wait_until

# Tutorial-shaped: a small Keras model fit on random data, long enough to profile, with a
# line that says the training has begun.
FIT = """\
import keras
import numpy as np

class Started(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            print("training", flush=True)

x = np.random.rand(2048, 32).astype("float32")
y = np.random.randint(0, 10, 2048)
model = keras.Sequential(
    [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
)
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, epochs=1000, batch_size=32, verbose=0, callbacks=[Started()])
"""

# Plain Python busy in a function whose name only this test uses.
BUSY = """\
import time

def crunches_numbers_for_the_profile_test():
    total = 0
    while True:
        for i in range(10000):
            total += i * i
        time.sleep(0.001)

print("up", flush=True)
crunches_numbers_for_the_profile_test()
"""


def _started(agent: Agent, root: Path, script: str, line: bytes) -> str:
    run = agent.cli("run", "-d", script, cwd=root)
    assert run.returncode == 0, run.stderr
    job = run.stdout.strip()
    with agent.client() as client:
        handle = client.job(job)
        wait_until(lambda: line in b"".join(handle.logs()), timeout=120)
    return job


def _cancel(agent: Agent, job: str) -> None:
    with agent.client() as client:
        client.job(job).cancel(grace=0)


def test_a_running_keras_fit_is_profiled_from_outside(shared_agent, project):
    pytest.importorskip("tensorflow")
    pytest.importorskip("xprof", reason="tensorboard-plugin-profile is not installed")
    from xprof.convert import raw_to_tool_data

    root = project({"train.py": FIT})
    job = _started(shared_agent, root, "train.py", b"training")
    try:
        shown = shared_agent.cli("profile", job, "--duration", "2s")
        assert shown.returncode == 0, shown.stderr
        assert f"TensorFlow profile of job {job} (2s), in its artifacts:" in shown.stdout
        assert f"gpuhop tensorboard {job} (the Profile tab)" in shown.stdout
        run = shown.stdout.split("tensorboard/plugins/profile/")[1].split()[0]
        artifacts = shared_agent.paths.jobs / job / "artifacts"
        traces = list((artifacts / "tensorboard/plugins/profile" / run).glob("*.xplane.pb"))
        assert len(traces) == 1, traces
        # The trace's op statistics: the model's own ops, once per train step captured.
        stats, _ = raw_to_tool_data.xspace_to_tool_data(traces, "framework_op_stats", {})
        rows = [[c.get("v") for c in row["c"]] for row in json.loads(stats)[0]["rows"]]
        dense = [r for r in rows if "dense" in str(r[3]) and r[2] in ("MatMul", "_FusedMatMul")]
        assert dense and min(r[4] for r in dense) >= 2, rows[:10]
        # The steps themselves: Keras's train function ran step after step meanwhile.
        assert b"multi_step_on_iterator" in traces[0].read_bytes()

        # The job goes on training meanwhile.
        with shared_agent.client() as client:
            assert client.job(job).refresh().state == JobState.running
    finally:
        _cancel(shared_agent, job)


def test_a_plain_python_job_gets_a_py_spy_flame_graph(shared_agent, project):
    root = project({"busy.py": BUSY})
    job = _started(shared_agent, root, "busy.py", b"up")
    try:
        shown = shared_agent.cli("profile", job, "--duration", "1")
        assert shown.returncode == 0, shown.stderr
        assert f"py-spy profile of job {job} (1s), in its artifacts:" in shown.stdout
        (path,) = [w for w in shown.stdout.split() if w.startswith("profiles/")]
        svg = (shared_agent.paths.jobs / job / "artifacts" / path).read_text()
        assert svg.startswith("<?xml") and "crunches_numbers_for_the_profile_test" in svg
        with shared_agent.client() as client:
            again = client.job(job).profile(1)
        assert again.profiler == "py-spy" and len(again.files) == 1
        assert again.files != [path]
    finally:
        _cancel(shared_agent, job)
    ended = shared_agent.cli("profile", job)
    assert ended.returncode == 2
    assert f"job {job} has ended: cancelled, so it has nothing to profile" in ended.stderr


def test_refusals_name_the_problem(shared_agent, project):
    root = project({"busy.py": BUSY})
    job = _started(shared_agent, root, "busy.py", b"up")
    try:
        no_worker = shared_agent.cli("profile", job, "--worker", "1")
        assert no_worker.returncode == 2
        assert f"job {job} has one worker (0); there is no worker 1" in no_worker.stderr
        bad = shared_agent.cli("profile", job, "--duration", "soon")
        assert bad.returncode == 2
        assert "--duration: 'soon' is not a duration" in bad.stderr
        long = shared_agent.cli("profile", job, "--duration", "1h")
        assert long.returncode == 2
        assert "--duration must be more than 0 and at most 300s" in long.stderr
        missing = shared_agent.cli("profile", "nosuchjob")
        assert missing.returncode != 0
        assert "no job matches 'nosuchjob'" in missing.stderr
    finally:
        _cancel(shared_agent, job)
