"""Multi-worker jobs on one host: TF_CONFIG, per-worker logs, private network (gang failure
is in tests/backends/test_contract.py, for every backend)."""

from __future__ import annotations

import json
import shutil
from functools import partial

import pytest

from gpuhop.api import JobState
from gpuhop.client import Job
from tests.conftest import EXAMPLES, jax_env, wait_until
from tests.listening import listening

pytestmark = pytest.mark.timeout(300)

LISTENER = """
import json, os, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
me = config["task"]["index"]
host, port = config["cluster"]["worker"][me].split(":")
server = socket.socket()
server.bind(("0.0.0.0", int(port)))  # as TensorFlow's gRPC server does
server.listen()
inode = os.fstat(server.fileno()).st_ino
rows = [row for t in ("tcp", "tcp6") for row in open(f"/proc/net/{t}").readlines()[1:]]
seen = any(row.split()[9] == str(inode) for row in rows)
open(f"{sys.argv[1]}/socket-{me}", "w").write(f"{inode} {seen}")
peer = config["cluster"]["worker"][1 - me].split(":")
while True:
    try:
        socket.create_connection((peer[0], int(peer[1])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.05)
print(f"worker {me} of {len(config['cluster']['worker'])} reached its peer", flush=True)
while not os.path.exists(f"{sys.argv[1]}/release"):
    time.sleep(0.05)
"""


def _reached_its_peer(job: Job, worker: int) -> bool:
    return b"reached its peer" in b"".join(job.logs(worker=worker))


def test_workers_reach_each_other_on_a_network_no_other_host_can_reach(
    shared_agent, project, tmp_path
):
    root = project({"listener.py": LISTENER})
    with shared_agent.client() as client:
        job = client.submit(["listener.py", str(tmp_path)], workdir=root, workers=2)
        for i in (1, 0):  # each look a request the agent answers: ten a second, not fifty
            wait_until(partial(_reached_its_peer, job, i), timeout=60, interval=0.1)
        sockets = [(tmp_path / f"socket-{i}").read_text().split() for i in (0, 1)]
        # Both workers listen on every interface of their network and see their socket
        # in its table, yet the host's table has neither.
        assert [seen for _, seen in sockets] == ["True", "True"]
        assert not {inode for inode, _ in sockets} & listening().keys()
        (tmp_path / "release").touch()
        info = job.wait(timeout=60)
        log = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded and info.workers == 2
    assert "[worker 0] worker 0 of 2 reached its peer" in log
    assert "[worker 1] worker 1 of 2 reached its peer" in log


def test_run_options_for_workers(shared_agent, project):
    root = project({"w.py": "import os; print(os.environ['GPUHOP_NUM_WORKERS'])\n"})
    both = shared_agent.cli("run", "--workers", "2", "--gpus", "1", "w.py", cwd=root)
    per = shared_agent.cli("run", "--gpus-per-worker", "1", "w.py", cwd=root)
    worker = shared_agent.cli("logs", "--worker", "5", "w", cwd=root)
    assert both.returncode == 2 and "takes --gpus-per-worker, not --gpus" in both.stderr
    assert per.returncode == 2 and "--gpus-per-worker is for multi-worker jobs" in per.stderr
    ok = shared_agent.cli("run", "--name", "w", "-w", "3", "w.py", cwd=root)
    assert ok.returncode == 0, ok.stderr
    assert sorted(ok.stdout.splitlines()) == ["[worker 0] 3", "[worker 1] 3", "[worker 2] 3"]
    worker = shared_agent.cli("logs", "--worker", "5", "w", cwd=root)
    assert worker.returncode == 2 and "has 3 worker(s), numbered from 0" in worker.stderr


@pytest.mark.tf
def test_two_workers_train_the_example_to_the_same_weights(shared_agent, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(EXAMPLES / "multiworker", work / "multiworker")
    run = shared_agent.cli(
        "run",
        "--workers",
        "2",
        "--pull",
        str(tmp_path / "out"),
        "multiworker/train.py",
        "--epochs",
        "2",
        cwd=work,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    finals = {
        line.split("] ", 1)[0]: line.split("final loss: ", 1)[1]
        for line in run.stdout.splitlines()
        if "final loss: " in line
    }
    assert set(finals) == {"[worker 0", "[worker 1"}
    assert finals["[worker 0"] == finals["[worker 1"]  # same loss and weights checksum
    assert (tmp_path / "out" / "savedmodel" / "saved_model.pb").is_file()
    info = json.loads(
        shared_agent.cli("show", "--json", "--", run.stderr.split("job ")[1][:8]).stdout
    )
    assert info["latest_metrics"]["epoch"] == 2


@pytest.mark.tf
@pytest.mark.parametrize(
    "make_strategy",
    [
        "import gpuhop.tf; gpuhop.tf.strategy()",
        # An unmodified script: gpuhop's start-up hook bounds the wait for it.
        "import tensorflow as tf; tf.distribute.MultiWorkerMirroredStrategy()",
    ],
)
def test_a_lone_worker_gives_up_within_its_timeout(shared_agent, project, make_strategy):
    root = project(
        {
            "lone.py": "import os, time\n"
            "if os.environ['GPUHOP_WORKER_INDEX'] == '1':\n"
            "    print('never joining', flush=True); time.sleep(600)\n"
            f"{make_strategy}\n"
            "print('joined')\n"
        }
    )
    with shared_agent.client() as client:
        job = client.submit(["lone.py"], workdir=root, workers=2, worker_timeout=5)
        info = job.wait(timeout=180)
    assert info.state == JobState.failed
    assert info.reason.startswith("worker 0 exited with code 1 first; 1 other worker was stopped")
    assert "its peers did not join within 5s" in info.reason


DISTRIBUTION_DUMP = """
import json, os
keys = ["KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
        "KERAS_DISTRIBUTION_PROCESS_ID", "KERAS_BACKEND", "TF_CONFIG", "TF_USE_LEGACY_KERAS"]
print(json.dumps({k: os.environ.get(k) for k in keys}))
"""


def test_keras3_on_jax_workers_get_keras_distribution_not_tf_config(shared_agent, project):
    root = project({"dump.py": DISTRIBUTION_DUMP})
    # JAX on the job's own PYTHONPATH (tests/conftest.py: jax_env): the check as the job
    # starts finds it there, as the job will (at submit, a PYTHONPATH is never run).
    run = shared_agent.cli(
        "run",
        "--no-progress",
        "-w",
        "2",
        *jax_env(),
        "-e",
        "KERAS_BACKEND=jax",
        "dump.py",
        cwd=root,
    )
    assert run.returncode == 0, run.stderr
    seen = {
        line.split("] ", 1)[0]: json.loads(line.split("] ", 1)[1])
        for line in run.stdout.splitlines()
    }
    coordinator = seen["[worker 0"]["KERAS_DISTRIBUTION_JOB_ADDRESSES"]
    assert coordinator.startswith("127.0.0.1:")
    for i in (0, 1):
        assert seen[f"[worker {i}"] == {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": coordinator,
            "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
            "KERAS_DISTRIBUTION_PROCESS_ID": str(i),
            "KERAS_BACKEND": "jax",
            "TF_CONFIG": None,
            "TF_USE_LEGACY_KERAS": None,
        }
    tf = shared_agent.cli(
        "run", "--no-progress", "-w", "2", "--keras", "tf-keras", "dump.py", cwd=root
    )
    assert tf.returncode == 0, tf.stderr
    first = json.loads(tf.stdout.splitlines()[0].split("] ", 1)[1])
    assert first["TF_CONFIG"] and first["TF_USE_LEGACY_KERAS"] == "1"
    assert first["KERAS_DISTRIBUTION_PROCESS_ID"] is None


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--keras", "keras3"], "Keras 3 fit on the TensorFlow backend does not work under"),
        (["-e", "KERAS_BACKEND=tensorflow"], "run with -e KERAS_BACKEND=jax"),
        (["-e", "KERAS_BACKEND=torch"], "the torch backend across processes is not supported"),
        # JAX is not in the test venv, only on the PYTHONPATH of jobs that name it.
        (["-e", "KERAS_BACKEND=jax"], "Keras 3 on JAX across processes needs jax for the job"),
    ],
)
def test_keras_that_cannot_run_across_workers_is_refused_before_it_starts(
    shared_agent, project, args, words
):
    root = project({"dump.py": DISTRIBUTION_DUMP})
    run = shared_agent.cli("run", "-w", "2", *args, "dump.py", cwd=root)
    assert run.returncode == 2 and words in run.stderr
    assert "queued" not in run.stderr  # refused at submit: no job was made


@pytest.mark.tf
def test_keras3_jax_example_trains_on_two_processes_to_the_same_weights(shared_agent, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(EXAMPLES / "keras3-jax-multiworker", work / "example")
    run = shared_agent.cli(
        "run",
        "--no-progress",
        "--workers",
        "2",
        *jax_env(),
        "-e",
        "KERAS_BACKEND=jax",
        "--pull",
        str(tmp_path / "out"),
        "example/train.py",
        "--epochs",
        "2",
        cwd=work,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    finals = {
        line.split("] ", 1)[0]: line.split("final loss: ", 1)[1]
        for line in run.stdout.splitlines()
        if "final loss: " in line
    }
    assert set(finals) == {"[worker 0", "[worker 1"}
    assert finals["[worker 0"] == finals["[worker 1"]  # same loss and weights checksum
    assert "process 1 of 2: 2 devices in the mesh" in run.stdout
    assert (tmp_path / "out" / "classifier.keras").is_file()
