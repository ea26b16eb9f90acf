"""The Slurm backend end to end: a real agent (--backend slurm) on a real one-node Slurm
cluster (slurmctld, slurmd and munged of this machine, 2 made-up GPUs), driven through the
CLI as a user would.

Slurm counts time limits in whole minutes and checks them every 30 seconds (slurmctld's
PERIODIC_TIMEOUT): the time-limit test shortens a running job's limit with `scontrol update`,
as an admin would, and then waits for Slurm's own check: the one slow wait here (0-30 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.slurm_backend.conftest import skip_without_slurm

skip_without_slurm()

pytestmark = pytest.mark.timeout(180)

SHOW_GPUS = """
import os
print("visible:", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["GPUHOP_JOB_ID"], flush=True)
"""

# Holds on until the test removes its go file; writes its pid first.
HOLD = """
import os, sys, time
sync = sys.argv[1]
pid = f"{sync}/pid-{os.environ['GPUHOP_JOB_ID']}"
with open(pid + ".tmp", "w") as f:  # whole, then renamed into place
    f.write(str(os.getpid()))
os.replace(pid + ".tmp", pid)
print("holding", flush=True)
while os.path.exists(f"{sync}/hold"):
    time.sleep(0.05)
print("released", flush=True)
"""


def _script(tmp_path: Path, name: str, text: str) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / name).write_text(text)
    return work


def _show(agent, job_id: str) -> dict:
    out = agent.cli("show", "--json", "--", job_id)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _info(agent, job_id: str) -> dict:
    """The job's record, as `gpuhop show --json` prints it, asked through the SDK: the tests
    poll it, and a `gpuhop show` process a look costs ~0.1 CPU-s."""
    with agent.client() as client:
        return client.job(job_id).data


def _submit(agent, work: Path, *args: str) -> str:
    out = agent.cli("run", "--detach", "--no-requirements", *args, cwd=work)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip().split()[-1]


def test_a_job_with_one_gpu_sees_the_gpu_slurm_gave_it(slurm_agent, slurm_cluster, tmp_path):
    work = _script(tmp_path, "gpus.py", SHOW_GPUS)
    run = slurm_agent.cli("run", "--no-requirements", "--gpus", "1", "gpus.py", cwd=work)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "gpuhop: submitted as Slurm job" in run.stdout
    assert "visible: 0 " in run.stdout  # Slurm's GRES index, not the scheduler's
    assert f"gpuhop: running on {slurm_cluster.node}" in run.stdout
    wait_until(lambda: not slurm_cluster.jobs(), timeout=60)


def test_slurms_pending_reason_shows_and_a_cancel_leaves_no_slurm_job(
    slurm_agent, slurm_cluster, tmp_path
):
    # Another user's job (submitted by hand, outside gpuhop) holds both GPUs of the node.
    hold = tmp_path / "hold"
    hold.touch()
    hog = slurm_cluster.run(
        "sbatch", "--parsable", "--gres=gpu:2", f"--output={tmp_path / 'hog.out'}",
        "--wrap", f"while [ -e {hold} ]; do sleep 0.1; done",
    ).strip()  # fmt: skip
    try:
        wait_until(lambda: "RUNNING" in slurm_cluster.run("squeue", "-h", "-j", hog, "-o", "%T"))
        work = _script(tmp_path, "gpus.py", SHOW_GPUS)
        job_id = _submit(slurm_agent, work, "--gpus", "1", "gpus.py")
        # gpuhop's scheduler sees its GPUs free and starts the job; Slurm keeps it pending.
        waiting = wait_until(
            lambda: (
                (w := _info(slurm_agent, job_id).get("waiting") or "").endswith("Resources") and w
            ),
            timeout=60,
        )
        assert waiting.startswith("Slurm job ") and waiting.endswith(" is pending: Resources")
        shown = " ".join(slurm_agent.cli("show", job_id).stdout.split())
        assert f"waiting {waiting}" in shown
        slurm_id = waiting.split()[2]
        # Pending in Slurm's queue is not running: no start, no duration yet; but its Slurm
        # job is named.
        info = _show(slurm_agent, job_id)
        assert (info["state"], info["started_at"]) == ("starting", None), info
        assert info["cluster_job"] == f"Slurm job {slurm_id}"
        assert f"runs as Slurm job {slurm_id}" in shown and "state starting" in shown
        assert slurm_agent.cli("cancel", job_id).returncode == 0
        info = wait_until(
            lambda: (i := _info(slurm_agent, job_id))["state"] == "cancelled" and i, timeout=60
        )
        assert info["waiting"] is None and info["cluster_job"] == f"Slurm job {slurm_id}"
        assert (info["reason"], info["started_at"]) == ("cancelled before it started", None)
        assert slurm_id not in slurm_cluster.run("squeue", "-h", "-o", "%i").split()
        assert "visible:" not in slurm_agent.cli("logs", job_id).stdout  # it never ran
    finally:
        hold.unlink()
    wait_until(lambda: hog not in slurm_cluster.jobs(), timeout=60)


def test_jobs_that_do_not_fit_the_partition_are_refused_with_the_reason(slurm_agent, tmp_path):
    work = _script(tmp_path, "gpus.py", SHOW_GPUS)
    out = slurm_agent.cli("run", "--no-requirements", "--workers", "2", "gpus.py", cwd=work)
    assert out.returncode != 0
    assert "run one per node, and the Slurm partition has 1 node(s)" in out.stderr
    assert "--pack" in out.stderr
    args = ("--workers", "2", "--gpus-per-worker", "3", "--pack", "gpus.py")
    out = slurm_agent.cli("run", "--no-requirements", *args, cwd=work)
    assert out.returncode != 0
    assert "each worker asks for 3 GPU(s) on one node" in out.stderr
    out = slurm_agent.cli("run", "--no-requirements", "--gpus", "3", "gpus.py", cwd=work)
    assert out.returncode != 0
    assert "the largest node of the Slurm partition has 2" in out.stderr


def test_a_job_slurm_refuses_fails_saying_so_with_no_duration(slurm_agent, slurm_cluster, tmp_path):
    # A drained partition takes no new job: sbatch refuses it, and the job never ran. Its
    # reason said "... after 0.0s", a duration it never had.
    work = _script(tmp_path, "gpus.py", SHOW_GPUS)
    slurm_cluster.run("scontrol", "update", "partitionname=debug", "state=drain")
    try:
        job_id = _submit(slurm_agent, work, "gpus.py")
        info = wait_until(
            lambda: (i := _info(slurm_agent, job_id))["state"] not in ("queued", "starting") and i,
            timeout=60,
        )
    finally:
        slurm_cluster.run("scontrol", "update", "partitionname=debug", "state=up")
    assert (info["state"], info["started_at"]) == ("failed", None), info
    reason = info["reason"]
    assert reason.startswith("could not start: Slurm refused the job: "), reason
    assert "after" not in reason and reason.endswith("(inactive or drain)"), reason


def test_a_job_whose_node_fails_is_lost_and_not_run_again(slurm_agent, slurm_cluster, tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    work = _script(tmp_path, "hold.py", HOLD)
    job_id = _submit(slurm_agent, work, "hold.py", str(tmp_path))
    node = slurm_cluster.node
    try:
        wait_until(lambda: (tmp_path / f"pid-{job_id}").exists(), timeout=60)
        slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=test")
        info = wait_until(
            lambda: (i := _info(slurm_agent, job_id))["state"] not in ("running", "starting") and i,
            timeout=90,
        )
    finally:
        hold.unlink(missing_ok=True)
        if slurm_cluster.node_state().startswith("down"):
            slurm_cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
        wait_until(lambda: slurm_cluster.node_state() == "idle", timeout=60)
    assert (info["state"], info["end_class"]) == ("lost", "lost"), info
    assert "its node failed (NODE_FAIL)" in info["reason"]
    log = slurm_agent.cli("logs", job_id).stdout
    assert log.count("submitted as Slurm job") == 1  # --no-requeue: Slurm did not run it again
    wait_until(lambda: not slurm_cluster.jobs(), timeout=60)  # COMPLETING a while when busy


def test_a_killed_leader_leaves_no_slurm_job_and_the_job_is_lost(
    slurm_agent, slurm_cluster, tmp_path
):
    hold = tmp_path / "hold"
    hold.touch()
    work = _script(tmp_path, "hold.py", HOLD)
    job_id = _submit(slurm_agent, work, "hold.py", str(tmp_path))
    try:
        wait_until(lambda: (tmp_path / f"pid-{job_id}").exists(), timeout=60)
        leader = json.loads(slurm_agent.paths.job_dir(job_id).joinpath("shim.pid").read_text())
        os.kill(leader["pid"], signal.SIGKILL)
        info = wait_until(
            lambda: (i := _info(slurm_agent, job_id))["state"] == "lost" and i, timeout=60
        )
        # The agent cancelled the Slurm job by the id kept in the job's dir.
        wait_until(lambda: not slurm_cluster.jobs(), timeout=60)
    finally:
        hold.unlink(missing_ok=True)
    assert info["end_class"] == "lost"
    assert info["reason"].startswith(
        "its leader on the agent's host vanished with no exit status, so Slurm job"
        f" {info['cluster_job'].split()[-1]} was cancelled"
    ), info
    assert "released" not in slurm_agent.cli("logs", job_id).stdout


def test_gpus_lists_the_partitions_nodes_and_the_users_slurm_jobs(
    slurm_agent, slurm_cluster, tmp_path
):
    listed = json.loads(slurm_agent.cli("gpus", "--json").stdout)
    assert [(g["index"], g["node"]) for g in listed] == [
        (0, slurm_cluster.node),
        (1, slurm_cluster.node),
    ]
    hold = tmp_path / "hold"
    hold.touch()
    # The user's own Slurm job from outside gpuhop, and a gpuhop job.
    other = slurm_cluster.run(
        "sbatch", "--parsable", "--gres=gpu:1", "--job-name=by-hand", "--output=/dev/null",
        "--wrap", f"while [ -e {hold} ]; do sleep 0.1; done",
    ).strip()  # fmt: skip
    work = _script(tmp_path, "hold.py", HOLD)
    try:
        job_id = _submit(slurm_agent, work, "--gpus", "1", "hold.py", str(tmp_path))
        wait_until(lambda: (tmp_path / f"pid-{job_id}").exists(), timeout=60)
        out = slurm_agent.cli("gpus", env={**slurm_agent.env, "COLUMNS": "200"})
    finally:
        hold.unlink()
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    node = next(r for r in rows if r and r[0] == slurm_cluster.node)
    # GRES, in use (by both jobs: "gpu:2", or with indexes "gpu:2(IDX:0-1)"), state.
    assert node[1] == "gpu:2" and node[2].startswith("gpu:2") and node[3] == "allocated", rows
    mine = next(r for r in rows if job_id in r)
    assert mine[2:] == [f"gpuhop-{job_id}", "RUNNING", slurm_cluster.node, "gpu:1", "-"], rows
    theirs = next(r for r in rows if r and r[0] == other)
    assert theirs[1:] == ["-", "by-hand", "RUNNING", slurm_cluster.node, "gpu:1", "-"], rows
    assert (
        "nodes of Slurm's default partition (sinfo) and your Slurm jobs (squeue --me); 2 GPU(s)"
        in " ".join(out.stderr.split())
    )
    wait_until(lambda: _info(slurm_agent, job_id)["state"] == "succeeded", timeout=60)
    wait_until(lambda: not slurm_cluster.jobs(), timeout=60)
    status = slurm_agent.cli("agent", "status", "--home", str(slurm_agent.home))
    assert "backend: slurm" in status.stdout


def test_agent_start_keeps_the_partition_and_names_a_bad_one(slurm_cluster, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHOP_")}
    env["GPUHOP_CONFIG_DIR"] = str(tmp_path / "config")
    home = str(tmp_path / "home")

    def agent(*args: str):
        return subprocess.run(
            [sys.executable, "-m", "gpuhop", "agent", *args, "--home", home],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    out = agent("start", "--partition", "debug")
    assert out.returncode != 0 and "go with --backend slurm" in out.stderr
    out = agent("start", "--backend", "slurm", "--partition", "nosuch")
    assert out.returncode != 0
    said = " ".join((out.stdout + out.stderr).split())
    assert "sinfo lists no nodes in partition nosuch; the cluster's partitions are: debug" in said
    out = agent("start", "--backend", "slurm", "--partition", "debug", "--qos", "normal")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        kept = json.loads((tmp_path / "home" / "backend.json").read_text())
        assert (kept["name"], kept["slurm_partition"], kept["slurm_qos"]) == (
            "slurm",
            "debug",
            "normal",
        )
    finally:
        assert agent("stop").returncode == 0


def test_what_needs_the_agents_own_host_is_refused_with_the_reason(
    slurm_agent, slurm_cluster, tmp_path
):
    work = _script(tmp_path, "gpus.py", SHOW_GPUS)
    (work / "requirements.txt").write_text("numpy\n")
    for options, message in [
        (["--gpu-memory", "1GiB", "--no-requirements"], "shares of a GPU (--gpu-memory)"),
        ([], "Use --no-requirements"),
    ]:
        out = slurm_agent.cli("run", *options, "gpus.py", cwd=work)
        assert out.returncode == 2 and message in out.stderr, (options, out.stderr)
        assert "(agent started with --backend slurm)" in out.stderr
    out = slurm_agent.cli("tf-server", "start", "--no-wait", "--name", "slurm-tfs")
    assert out.returncode != 0
    assert "a private network (TensorFlow servers) exists only on the agent's own host" in (
        " ".join(out.stderr.split())
    )
    model = tmp_path / "model"
    model.mkdir()
    (model / "saved_model.pb").write_bytes(b"not really")
    out = slurm_agent.cli("serve", str(model), "--name", "m", "--detach")
    assert out.returncode != 0
    assert "model servers run on the agent's own host" in " ".join(out.stderr.split())
    # A running Slurm job's ports are on its node, not on the agent's host.
    hold = tmp_path / "hold"
    hold.touch()
    work = _script(tmp_path, "hold.py", HOLD)
    job_id = _submit(slurm_agent, work, "hold.py", str(tmp_path))
    try:
        wait_until(lambda: (tmp_path / f"pid-{job_id}").exists(), timeout=60)
        out = slurm_agent.cli("forward", job_id, "8888", timeout=60)
    finally:
        hold.unlink()
    assert out.returncode != 0
    assert f"job {job_id} runs on the Slurm cluster, not on the agent's host" in " ".join(
        out.stderr.split()
    )
    wait_until(lambda: _info(slurm_agent, job_id)["state"] == "succeeded", timeout=60)
    wait_until(lambda: not slurm_cluster.jobs(), timeout=60)


def test_a_notebook_server_is_refused_and_leaves_no_job_behind(
    slurm_agent, slurm_cluster, tmp_path
):
    # JupyterLab is reached through a forward, which cannot reach a compute node: a server
    # queued anyway would hold its Slurm job for hours, unreachable.
    work = _script(tmp_path, "gpus.py", SHOW_GPUS)
    args = ("notebook", "--no-browser", "--no-requirements", "--name", "slurm-nb")
    out = slurm_agent.cli(*args, cwd=work)
    said = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stdout + out.stderr
    assert "JupyterLab (gpuhop notebook) is reached through gpuhop forward" in said
    assert "gpuhop run NOTEBOOK.ipynb" in said and "(agent started with --backend slurm)" in said
    with slurm_agent.client() as client:
        assert [j.name for j in client.jobs()].count("slurm-nb") == 0
    assert not slurm_cluster.jobs()


def _ended(agent, job_id: str, timeout: float = 60) -> dict:
    return wait_until(
        lambda: (i := _info(agent, job_id))["state"] not in ("queued", "starting", "running") and i,
        timeout=timeout,
    )


def test_time_limits_count_from_slurms_start_and_slurms_own_limit_is_a_timeout(
    slurm_agent, slurm_cluster, tmp_path
):
    hold = tmp_path / "hold"
    hold.touch()
    work = _script(tmp_path, "hold.py", HOLD)
    # Another job of the user holds both GPUs (and one of the node's 2 CPUs).
    hog = slurm_cluster.run(
        "sbatch", "--parsable", "--gres=gpu:2", "--output=/dev/null",
        "--wrap", f"while [ -e {hold} ]; do sleep 0.1; done",
    ).strip()  # fmt: skip
    try:
        wait_until(lambda: "RUNNING" in slurm_cluster.run("squeue", "-h", "-j", hog, "-o", "%T"))
        # A: runs at once, under a Slurm limit of 10 minutes (--timeout 600), which the test
        # then takes away: Slurm ends it, TIMEOUT.
        slow = _submit(slurm_agent, work, "--timeout", "600", "hold.py", str(tmp_path))
        wait_until(lambda: (tmp_path / f"pid-{slow}").exists(), timeout=60)
        slurm_id = slurm_cluster.run("squeue", "-h", "-n", f"gpuhop-{slow}", "-o", "%i").strip()
        assert slurm_cluster.run("squeue", "-h", "-j", slurm_id, "-o", "%l").strip() == "10:00"
        slurm_cluster.run("scontrol", "update", f"jobid={slurm_id}", "TimeLimit=-10")
        # B: --timeout 10 while Slurm keeps it pending (the GPUs are the other job's): its
        # limit has not started. (10 s, not less: once Slurm starts it, its step and Python
        # must come up and say so within its limit, on a machine that may be busy.)
        b_sync = tmp_path / "b"
        b_sync.mkdir()
        (b_sync / "hold").touch()  # B holds on until it is stopped
        args = ("--gpus", "1", "--timeout", "10", "hold.py", str(b_sync))
        quick = _submit(slurm_agent, work, *args)
        wait_until(lambda: (_info(slurm_agent, quick).get("waiting") or "").endswith("Resources"))
        pending_since = time.monotonic()
        info_a = _ended(slurm_agent, slow, timeout=90)  # Slurm's check: every 30 s
        wait_until(lambda: time.monotonic() > pending_since + 11)  # past B's 10 s, pending
        info_b = _show(slurm_agent, quick)
        assert info_b["state"] == "starting" and info_b["waiting"].endswith("Resources"), info_b
        released = time.time()
        hold.unlink()  # the other job ends; Slurm starts B, and B's 10 s begin
        wait_until(lambda: (b_sync / f"pid-{quick}").exists(), timeout=60)
        info_b = _ended(slurm_agent, quick)
    finally:
        hold.unlink(missing_ok=True)
        (tmp_path / "b" / "hold").unlink(missing_ok=True)
    assert (info_a["state"], info_a["end_class"]) == ("failed", "timeout"), info_a
    assert f"Slurm's time limit ended it (Slurm job {slurm_id}, TIMEOUT)" in info_a["reason"]
    assert (info_b["state"], info_b["end_class"]) == ("failed", "timeout"), info_b
    assert "timed out (its time limit is 10s)" in info_b["reason"], info_b
    # Its time counts from Slurm's start, not from the agent's submit: the pending wait is
    # not in its duration.
    assert datetime.fromisoformat(info_b["started_at"]).timestamp() >= released, info_b
    assert "holding" in slurm_agent.cli("logs", quick).stdout  # it ran before its limit
    wait_until(lambda: not slurm_cluster.jobs(), timeout=60)
