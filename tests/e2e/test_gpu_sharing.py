"""Shared GPUs and `gpuhop gpus` as a user runs them, against real agents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_until

pytestmark = pytest.mark.timeout(300)

# Prints where it landed, then holds its GPU until the test puts a file named `release` in its
# artifacts dir (the host's /tmp is not the job's).
HOLDER = """
import os, sys, time, pathlib
print("CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"],
      "GPUHOP_GPU_MEMORY_MB=" + os.environ.get("GPUHOP_GPU_MEMORY_MB", "-"),
      "XLA_PYTHON_CLIENT_MEM_FRACTION=" + os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "-"),
      flush=True)
release = pathlib.Path(os.environ["GPUHOP_ARTIFACTS_DIR"]) / "release"
while not release.exists():
    time.sleep(0.02)
"""


def test_4gib_shares_pack_onto_two_fake_8gib_gpus_and_whole_gpu_jobs_wait_their_turn(
    make_agent, project
):
    agent = make_agent(fake_gpus=2)
    root = project({"hold.py": HOLDER})

    def release(job: str) -> None:
        (agent.paths.jobs / job / "artifacts" / "release").touch()

    def submit(*args: str) -> str:
        run = agent.cli("run", "--detach", *args, "hold.py", cwd=root)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    def show(job: str) -> dict:
        return json.loads(agent.cli("show", "--json", job).stdout)

    client = agent.client()

    def state(job: str) -> str:
        # Polled through the SDK (one CLI start-up costs about half a second here); where
        # jobs landed is asserted through the CLI.
        return client.job(job).state.value

    def gpus() -> list[dict]:
        return json.loads(agent.cli("gpus", "--json").stdout)

    def log(job: str) -> str:
        return agent.cli("logs", job).stdout

    a, b, c = (submit("--gpu-memory", size) for size in ("4GiB", "4G", "4096"))
    for job in (a, b, c):
        wait_until(lambda job=job: state(job) == "running", timeout=60)
    # Best fit: the first two share GPU 0 (filling it), the third takes GPU 1.
    assert [show(j)["gpu_ids"] for j in (a, b, c)] == [[0], [0], [1]]
    assert {show(j)["gpu_memory_mb"] for j in (a, b, c)} == {4096}
    for job, gpu in ((a, 0), (b, 0), (c, 1)):
        wait_until(lambda job=job: b"".join(client.job(job).logs()), timeout=30)
        # JAX's allocator gets the share as a fraction of the (fake, 8 GiB) GPU.
        assert log(job) == (
            f"CUDA_VISIBLE_DEVICES={gpu} GPUHOP_GPU_MEMORY_MB=4096"
            " XLA_PYTHON_CLIENT_MEM_FRACTION=0.5000\n"
        )
    assert [(g["index"], g["job_ids"], g["memory_reserved_mb"]) for g in gpus()] == [
        (0, [a, b], 8192),
        (1, [c], 4096),
    ]
    table = agent.cli("gpus").stdout
    assert "8 GiB of 8 GiB (shared)" in table and a in table and b in table
    assert "0 MiB / 8 GiB" in table and "Fake GPU" in table
    assert "0 (4 GiB)" in agent.cli("ps").stdout
    assert "0 (a 4 GiB share, may be shared with other jobs)" in agent.cli("show", a).stdout

    # A whole-GPU job waits for an empty GPU, and a share behind it waits too, although
    # GPU 1 has 4 GiB left: the older job is not starved. A CPU job after them still starts,
    # which also shows the scheduler has looked at the queue since.
    whole = submit("--gpus", "1")
    late = submit("--gpu-memory", "4GiB")
    cpu = agent.cli("run", "--detach", "-q", "true", cwd=root).stdout.strip()
    wait_until(lambda: state(cpu) == "succeeded", timeout=60)
    assert (state(whole), state(late)) == ("queued", "queued")

    release(c)  # GPU 1 empties: the whole-GPU job takes it
    wait_until(lambda: state(whole) == "running", timeout=60)
    assert show(whole)["gpu_ids"] == [1]
    assert state(late) == "queued"  # GPU 0 is full and GPU 1 is held whole
    assert [(g["job_ids"], g["memory_reserved_mb"]) for g in gpus()][1] == ([whole], 8192)

    release(a)  # 4 GiB free on GPU 0 again: the share joins b there
    wait_until(lambda: state(late) == "running", timeout=60)
    assert show(late)["gpu_ids"] == [0]
    assert [g["job_ids"] for g in gpus()] == [[b, late], [whole]]

    for job in (b, whole, late):
        release(job)
    for job in (a, b, c, whole, late):
        wait_until(lambda job=job: state(job) == "succeeded", timeout=60)
    assert [(g["job_ids"], g["memory_reserved_mb"]) for g in gpus()] == [([], 0), ([], 0)]
    client.close()


def test_bad_gpu_memory_requests_get_clear_messages(make_agent, shared_agent, project):
    root = project({"ok.py": "pass\n"})
    agent = make_agent(fake_gpus=2)

    too_big = agent.cli("run", "--gpu-memory", "12GiB", "ok.py", cwd=root)
    just_too_big = agent.cli("run", "--gpu-memory", "8193", "ok.py", cwd=root)
    no_gpu = shared_agent.cli("run", "--gpu-memory", "1G", "ok.py", cwd=root)
    unreadable = agent.cli("run", "--gpu-memory", "6XB", "ok.py", cwd=root)
    zero = agent.cli("run", "--gpu-memory", "0", "ok.py", cwd=root)
    with_gpus = agent.cli("run", "--gpus", "2", "--gpu-memory", "1G", "ok.py", cwd=root)

    for result in (too_big, just_too_big, no_gpu, unreadable, zero, with_gpus):
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
    assert "asks for 12 GiB of GPU memory; the largest GPU here has 8 GiB" in too_big.stderr
    # One MiB over: both sizes round to "8 GiB", so they are said exactly.
    assert "asks for 8193 MiB of GPU memory; the largest GPU here has 8192 MiB" in (
        just_too_big.stderr
    )
    assert "asks for 1 GiB of GPU memory; this host has no GPU" in no_gpu.stderr
    assert "--gpu-memory: cannot read '6XB' as a size; give a size like 6GiB, 6G" in (
        unreadable.stderr
    )
    assert "'0' is less than 1 MB" in zero.stderr
    assert "--gpu-memory gives the job a share of one GPU; it cannot be combined with --gpus 2" in (
        with_gpus.stderr
    )
    assert json.loads(agent.cli("ps", "--json").stdout) == []  # nothing was queued


def test_gpus_on_a_host_without_gpus(shared_agent):
    table = shared_agent.cli("gpus")
    listing = shared_agent.cli("gpus", "--json")

    assert (table.returncode, table.stdout) == (0, "")
    assert "this host has no GPU; jobs run on the CPU" in table.stderr
    assert json.loads(listing.stdout) == []


SCRIPT_WITH_TF = """
print("user: importing tensorflow", flush=True)
import tensorflow as tf
import sys
import gpuhop.runtime.hook as hook
# (JAX's actions too, where TensorFlow and Keras import JAX, as they do when it is installed.)
jax_actions = {"jax_memory_at_exit", "jax_profile_requests"}
print("user: hook applied", sorted(set(hook.applied) - jax_actions), flush=True)
# Where the hook makes set_memory_growth harmless under a cap, in the real TensorFlow.
assert callable(sys.modules["tensorflow.python.eager.context"].context().set_memory_growth)
# The hook ran no op: device settings, which fail after the first op, still work here.
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
total = float(tf.reduce_sum(tf.ones(3)))
print("user: first op", total, "on", len(tf.config.list_logical_devices("CPU")), "CPUs", flush=True)
"""


@pytest.mark.tf
def test_the_hook_caps_tensorflow_in_an_unmodified_script_run_through_the_agent(
    make_agent, project
):
    agent = make_agent(fake_gpus=1)
    root = project(
        {
            "train.py": SCRIPT_WITH_TF,
            "mine/sitecustomize.py": "print('user sitecustomize ran', flush=True)\n",
        }
    )
    # The user's own PYTHONPATH (their sitecustomize, and this checkout's gpuhop) stays
    # in force, after the hook's directory.
    pythonpath = f"mine:{REPO / 'src'}"
    run = agent.cli(
        "run",
        "--gpu-memory",
        "4GiB",
        "-e",
        f"PYTHONPATH={pythonpath}",
        "-e",
        "GPUHOP_HOOK_VERBOSE=1",
        "-e",
        "TF_CPP_MIN_LOG_LEVEL=3",
        "train.py",
        cwd=root,
        timeout=240,
    )

    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if "user" in line or "gpuhop:" in line]
    hook_lines = [line for line in lines if line.startswith("gpuhop: after import")]
    assert [line for line in lines if line not in hook_lines] == [
        "user sitecustomize ran",
        "user: importing tensorflow",
        # TensorFlow imports Keras, whose fit the hook patches too (and whose Keras-3-only
        # errors get a hint); tf.summary scalars are recorded as metrics; `gpuhop profile`
        # can reach the process.
        "user: hook applied ['gpu_memory_limit', 'keras3_hints', 'keras_callbacks',"
        " 'quiet_start', 'summary_metrics', 'tensorflow_memory_at_exit',"
        " 'tensorflow_profile_requests']",
        "user: first op 3.0 on 2 CPUs",
    ]
    # Each action says what it did, before the script's next line.
    assert lines.index(hook_lines[-1]) < lines.index("user: first op 3.0 on 2 CPUs")
    hook_line = next(line for line in hook_lines if "gpu_memory_limit" in line)
    # No GPU here, so the action found none to cap; on a GPU host it caps each visible one.
    assert hook_line.endswith(
        "gpu_memory_limit: no GPU visible to TensorFlow; nothing to cap at 4096 MB"
    )


def test_agent_takes_the_fake_gpu_memory(tmp_path: Path):
    from tests.conftest import Agent

    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    try:
        start = agent.cli("agent", "start", "--fake-gpus", "1", "--fake-gpu-memory", "4096")
        assert start.returncode == 0, start.stderr
        [gpu] = json.loads(agent.cli("gpus", "--json").stdout)
        assert (gpu["memory_mb"], gpu["memory_used_mb"], gpu["utilization"]) == (4096, 0, 0)
        alone = agent.cli("agent", "start", "--fake-gpu-memory", "4096", "--home", str(tmp_path))
        assert alone.returncode == 2 and "give --fake-gpus N too" in alone.stderr
    finally:
        agent.shutdown()


# What the metrics callback writes each epoch on a GPU, and the start-up hook at exit (a
# record of memory alone): the frameworks report no device memory on a CPU.
MEMORY_REPORT = """
import gpuhop.runtime as job
job.log_metrics(epoch=1, epochs=1, loss=0.5, memory_mb=4000.0, memory_peak_mb=5222.4)
job.log_metrics(memory_mb=0.0, memory_peak_mb=5222.4)
"""


def test_show_gives_a_share_jobs_peak_memory_and_the_share_it_needs(make_agent, project):
    agent = make_agent(fake_gpus=1)
    root = project({"train.py": MEMORY_REPORT})
    run = agent.cli("run", "--name", "mem", "--gpu-memory", "6GiB", "train.py", cwd=root)
    assert run.returncode == 0, run.stderr

    shown = agent.cli("show", "mem").stdout
    assert (
        "memory  peak 5.1 GiB of a 6 GiB share; next time --gpu-memory 6.2GiB would do"
        " (peak + 20 %)"
    ) in shown
    # The memory-only record at exit does not hide the last epoch's metrics.
    assert "metrics  epoch=1 loss=0.5" in shown
    assert json.loads(agent.cli("show", "--json", "mem").stdout)["memory_peak_mb"] == 5222.4
    assert "0 (6 GiB, peak 5.1 GiB)" in agent.cli("ps").stdout


def test_ps_gives_each_job_on_a_shared_gpu_its_own_memory(make_agent, project):
    agent = make_agent(fake_gpus=1)
    root = project({"hold.py": HOLDER})
    a, b = (
        agent.cli("run", "--detach", "--gpu-memory", "3GiB", "hold.py", cwd=root).stdout.strip()
        for _ in range(2)
    )
    with agent.client() as client:
        for job in (a, b):
            wait_until(lambda job=job: client.job(job).state.value == "running", timeout=60)
            wait_until(lambda job=job: b"".join(client.job(job).logs()), timeout=30)

    def init(job: str) -> int:  # the job's first process, PID 1 of its namespace
        return json.loads((agent.paths.job_dir(job) / "shim.pid").read_text())["init"]

    def children(pid: int) -> list[int]:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    # As NVML tells them: a's first process and a process of its own (the script, a child
    # of it) on the GPU, and a program that is no job's; b has no process on it.
    script = children(init(a))[0]
    seam = {"0": {"processes": {str(init(a)): 1024, str(script): 2048, "1": 4000}}}
    agent.paths.fake_gpus_seam.write_text(json.dumps(seam))

    [gpu] = json.loads(agent.cli("gpus", "--json").stdout)
    assert gpu["job_memory_mb"] == {a: 3072, b: 0}
    rows = {line.split()[0]: line for line in agent.cli("ps").stdout.splitlines()[1:]}
    assert "0% 3 GiB*" in rows[a] and "0% 0 MiB*" in rows[b]

    # Unknown per process (NVML keeps it from us): the whole GPU's figure, as before.
    agent.paths.fake_gpus_seam.write_text("{}")
    assert json.loads(agent.cli("gpus", "--json").stdout)[0]["job_memory_mb"] is None
    for job in (a, b):
        (agent.paths.job_dir(job) / "artifacts" / "release").touch()
