"""Issue 39, `gpuhop profile`: TensorFlow's profiler run inside a running Keras `fit` on
request, its trace shown by `gpuhop tensorboard`'s Profile tab (the plugin's HTTP API through
the forward: the run, its tools, op statistics, the steps gpuhop marks); JAX's profiler in
a Keras fit on JAX, with the same step markers; py-spy's flame graph of a plain Python job;
the refusals. The session's agent and the CLI as a user runs it."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from tests.conftest import Agent, jax_env, missing, wait_until
from tests.tf.test_tensorboard_cli import tensorboard_cli

# Tutorial-shaped: a small Keras model fit on random data until cancelled (on JAX, 1,000
# epochs ended within a loaded run's 20 s of trace conversion), with a line that says the
# training has begun.
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
model.fit(x, y, epochs=1_000_000, batch_size=32, verbose=0, callbacks=[Started()])
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
    job = _submitted(agent, root, script)
    _said(agent, job, line)
    return job


def _cancel(agent: Agent, job: str) -> None:
    """Cancel `job` and wait until the agent has recorded its end (a cancel answers first:
    a `profile` asked in between finds no process, "has just ended", not how it ended)."""
    with agent.client() as client:
        client.job(job).cancel(grace=0)
        client.job(job).wait(120)


def _recording(seconds: int) -> bool:
    """Whether a `py-spy record` of `seconds` runs on this host (a sampled capture's)."""
    wanted = f"--duration\0{seconds}\0".encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes()
        except OSError:
            continue
        if b"py-spy" in argv and b"\0record\0" in argv and wanted in argv:
            return True
    return False


def _table(tables: list[dict], column: str) -> list[list]:
    """The rows (their values) of the plugin's tables that have the column `column`."""
    named = [t for t in tables if column in [c["id"] for c in t.get("cols", [])]]
    return [[c.get("v") for c in row["c"]] for table in named for row in table["rows"]]


def _assert_marked_steps(overview: list[dict]) -> None:
    """The profile plugin's overview times the steps gpuhop marked around each train batch
    (Keras 3 marks none itself), named as the fit counts them: 'train N', consecutive."""
    numbers = [int(row[0].removeprefix("train ")) for row in _table(overview, "stepnum")]
    assert len(numbers) >= 2 and numbers == list(range(numbers[0], numbers[-1] + 1)), numbers


def _requires(*modules: str) -> None:
    # find_spec, not importorskip: the job imports them (or a TensorBoard job), not pytest.
    for module in modules:
        if importlib.util.find_spec(module) is None:
            package = {"xprof": "tensorboard-plugin-profile"}.get(module, module)
            missing(f"{package} is not installed")


def _submitted(agent: Agent, root: Path, *args: str) -> str:
    run = agent.cli("run", "-d", *args, cwd=root)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def _said(agent: Agent, job: str, line: bytes) -> None:
    with agent.client() as client:
        handle = client.job(job)
        wait_until(lambda: line in b"".join(handle.logs()), timeout=120)


@pytest.mark.tf
def test_a_running_keras_fit_is_profiled_and_shown_in_tensorboards_profile_tab(
    shared_agent, project
):
    _requires("tensorflow", "xprof")
    job = _submitted(shared_agent, project({"train.py": FIT}), "train.py")
    said: list[str] = []
    try:
        # The Profile tab, as `gpuhop tensorboard` serves it (TensorBoard reading the job's
        # TensorBoard dir and its work dir), through its forward; open before the capture,
        # as a user who watches the job has it.
        with tensorboard_cli(shared_agent, job, said) as (url, cli):
            _said(shared_agent, job, b"training")
            shown = shared_agent.cli("profile", job, "--duration", "2s")
            assert shown.returncode == 0, shown.stderr
            assert f"TensorFlow profile of job {job} (2s), in its artifacts:" in shown.stdout
            assert f"gpuhop tensorboard {job} (the Profile tab)" in shown.stdout
            run = shown.stdout.split("tensorboard/plugins/profile/")[1].split()[0]
            artifacts = shared_agent.paths.jobs / job / "artifacts"
            trace = artifacts / "tensorboard/plugins/profile" / run
            # Keras's train function ran step after step meanwhile.
            assert b"multi_step_on_iterator" in b"".join(
                path.read_bytes() for path in trace.glob("*.xplane.pb")
            )

            with httpx.Client(base_url=f"{url}/data/plugin/profile", timeout=60) as http:
                wait_until(lambda: http.get("/runs").json() == [run], timeout=60)
                tools = http.get("/run_tools", params={"run": run}).json()
                assert {"overview_page", "framework_op_stats", "trace_viewer@"} <= set(tools)
                [host] = http.get("/hosts", params={"run": run, "tag": "overview_page"}).json()

                def tool(tag: str) -> list[dict]:
                    query = {"run": run, "tag": tag, "host": host["hostname"]}
                    answer = http.get("/data", params=query)
                    assert answer.status_code == 200, answer.text
                    return answer.json()

                # Op statistics: the model's own ops, once per train step captured.
                rows = _table(tool("framework_op_stats"), "occurrences")
                dense = [r for r in rows if "dense" in str(r[3]) and "MatMul" in str(r[2])]
                assert dense and min(r[4] for r in dense) >= 2, rows[:10]
                _assert_marked_steps(tool("overview_page"))
            cli.send_signal(signal.SIGINT)
            assert cli.wait(timeout=60) == 0
        # The job goes on training meanwhile, its files as it wrote them (the plugin's own
        # files are the TensorBoard job's).
        assert sorted(p.name for p in trace.iterdir()) == [f"{host['hostname']}.xplane.pb"]
        with shared_agent.client() as client:
            assert client.job(job).refresh().state == JobState.running
    finally:
        _cancel(shared_agent, job)
    assert "Traceback" not in "".join(said)


def test_a_keras_fit_on_jax_gets_jaxs_profiler_with_step_markers(shared_agent, project):
    _requires("xprof")
    from xprof.convert import raw_to_tool_data  # the plugin's converter; TensorFlow-free

    job = _submitted(
        shared_agent, project({"train.py": FIT}), *jax_env(), "-e", "KERAS_BACKEND=jax", "train.py"
    )
    try:
        _said(shared_agent, job, b"training")
        shown = shared_agent.cli("profile", job, "--duration", "2s")
        assert shown.returncode == 0, shown.stderr
        assert f"JAX profile of job {job} (2s), in its artifacts:" in shown.stdout
        run = shown.stdout.split("tensorboard/plugins/profile/")[1].split()[0]
        profiles = shared_agent.paths.jobs / job / "artifacts/tensorboard/plugins/profile"
        traces = list((profiles / run).glob("*.xplane.pb"))
        assert len(traces) == 1, traces
        # Keras's JAX train step, compiled by XLA, ran meanwhile, step after step.
        assert b"jit(train_step)" in traces[0].read_bytes()
        overview, _ = raw_to_tool_data.xspace_to_tool_data(traces, "overview_page", {})
        _assert_marked_steps(json.loads(overview))
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


def test_a_capture_runs_its_time_and_a_second_one_is_told_when_it_ends(shared_agent, project):
    root = project({"busy.py": BUSY})
    job = _started(shared_agent, root, "busy.py", b"up")
    first = subprocess.Popen(
        [sys.executable, "-m", "gpuhop", "profile", job, "--duration", "60"],
        env=shared_agent.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _recording(60), timeout=60)  # the agent's py-spy, for the first
        with shared_agent.client() as client, pytest.raises(GpuhopError) as second:
            client.job(job).profile(1)
        assert second.value.status == 409
        said = second.value.message
        assert said.startswith(f"job {job} is being profiled already (a capture of 60s, about ")
        assert said.endswith("s left); try again when that capture ends")
        first.send_signal(signal.SIGINT)  # Ctrl-C: the client stops waiting
        _out, err = first.communicate(timeout=60)
        assert first.returncode == 130, err
        assert f"the capture goes on in job {job} for the rest of its 60s" in err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        _cancel(shared_agent, job)


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
        for out_of_range in ("1h", "0", "0s", "8d"):  # a capture's range, not --timeout's week
            refused = shared_agent.cli("profile", job, "--duration", out_of_range)
            assert refused.returncode == 2
            said = "gpuhop: error: --duration must be more than 0 and at most 300s\n"
            assert refused.stderr == said
        missing = shared_agent.cli("profile", "nosuchjob")
        assert missing.returncode != 0
        assert "no job matches 'nosuchjob'" in missing.stderr
    finally:
        _cancel(shared_agent, job)
