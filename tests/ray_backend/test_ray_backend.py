"""The Ray backend end to end: a real agent (--backend ray) on a real two-node Ray cluster
with token authentication, driven through the CLI and the SDK as a user would."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuhop.api import EndClass, JobState
from gpuhop.home import AgentPaths, read_pid
from tests.conftest import EXAMPLES, wait_until
from tests.ray_backend.conftest import agent_cli, skip_without_ray

skip_without_ray()

pytestmark = pytest.mark.timeout(300)

SLEEPER = """
import os, sys, time
index = os.environ.get("GPUHOP_WORKER_INDEX", "0")
pid = f"{sys.argv[1]}/pid-{index}"
with open(pid + ".tmp", "w") as f:  # whole, then renamed into place
    f.write(str(os.getpid()))
os.replace(pid + ".tmp", pid)
print("sleeping", index, flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def node_dirs(job_id: str) -> list[Path]:
    """The job's dirs on the nodes (all on this machine here)."""
    import tempfile

    return list(Path(tempfile.gettempdir()).glob(f"gpuhop-{job_id}-*"))


@pytest.mark.tf
def test_two_workers_train_on_two_nodes_through_the_cli(ray_agent, ray_cluster, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(EXAMPLES / "multiworker", work / "multiworker")
    run = ray_agent.cli(
        "run",
        "--workers",
        "2",
        "--gpus-per-worker",
        "1",
        "--pull",
        str(tmp_path / "out"),
        "multiworker/train.py",
        "--epochs",
        "1",
        cwd=work,
        timeout=280,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # Each node has one GPU: Ray had to put the workers on different nodes.
    nodes = re.findall(r"gpuhop: worker (\d) on .*Ray node (\w+)\), GPU 0", run.stdout)
    assert sorted(i for i, _ in nodes) == ["0", "1"]
    assert len({node for _, node in nodes}) == 2
    finals = {
        line.split("] ", 1)[0]: line.split("final loss: ", 1)[1]
        for line in run.stdout.splitlines()
        if "final loss: " in line
    }
    assert set(finals) == {"[worker 0", "[worker 1"}
    assert finals["[worker 0"] == finals["[worker 1"]  # the same weights on both nodes
    assert (tmp_path / "out" / "savedmodel" / "saved_model.pb").is_file()
    assert "no work-dir files: this agent runs jobs on a Ray cluster" in run.stderr
    job_id = run.stderr.split("job ")[1][:8]
    info = json.loads(ray_agent.cli("show", "--json", "--", job_id).stdout)
    assert info["latest_metrics"]["epoch"] == 1
    worker1 = ray_agent.cli("logs", "--worker", "1", job_id)
    assert "final loss: " + finals["[worker 1"] in worker1.stdout
    wait_until(ray_cluster.empty, timeout=60)
    assert not node_dirs(job_id)


def test_cancel_leaves_nothing_behind(ray_agent, ray_cluster, project, tmp_path):
    root = project({"sleeper.py": SLEEPER})
    with ray_agent.client() as client:
        job = client.submit(["sleeper.py", str(tmp_path)], workdir=root, workers=2)
        wait_until(lambda: len(list(tmp_path.glob("pid-[0-9]"))) == 2, timeout=120)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid-[0-9]")]
        # show names the attempt's Ray job (the leader, a driver) and its placement group.
        named = rf"Ray job [0-9a-f]{{8}}, placement group gpuhop-{job.id}-1"
        shown = " ".join(ray_agent.cli("show", job.id).stdout.split())
        assert re.search(rf"runs as {named} ", shown), shown
        forward = ray_agent.cli("forward", job.id, "6006")
        assert forward.returncode != 0 and "runs on the Ray cluster" in forward.stderr
        cancel = ray_agent.cli("cancel", job.id)
        info = job.wait(timeout=60)
    assert cancel.returncode == 0, cancel.stderr
    assert info.state == JobState.cancelled
    assert re.fullmatch(named, info.cluster_job or ""), info.cluster_job  # after its end too
    assert not info.private_network  # TensorFlow's ports are on the nodes' networks
    # Ray tears the workers' actors down on its own time after the job's end is recorded.
    wait_until(lambda: not any(alive(p) for p in pids), timeout=60)
    wait_until(ray_cluster.empty, timeout=60)
    assert not node_dirs(job.id)


def test_a_job_ray_has_not_placed_is_starting_and_its_time_counts_from_placement(
    ray_agent, ray_cluster, project, tmp_path
):
    """While Ray cannot place a job's workers (the cluster's CPUs are another job's), the
    job is `starting`, says why, and its --timeout has not begun; cancelled then, it never
    started; placed, it runs from then."""
    root = project({"sleeper.py": SLEEPER})
    fill, held, dropped = (tmp_path / name for name in ("fill", "held", "dropped"))
    for d in (fill, held, dropped):
        d.mkdir()
    with ray_agent.client() as client:
        # 4 workers of 1 CPU: every CPU of the two nodes.
        filler = client.submit(["sleeper.py", str(fill)], workdir=root, workers=4)
        wait_until(lambda: len(list(fill.glob("pid-[0-9]"))) == 4, timeout=120)
        job = client.submit(["sleeper.py", str(held)], workdir=root, timeout=5)
        other = client.submit(["sleeper.py", str(dropped)], workdir=root)
        waits = "the Ray cluster has not placed its 1 worker(s) of 1 CPU each (spread)"
        for j in (job, other):
            wait_until(lambda j=j: (j.refresh().waiting or "").startswith(waits), timeout=120)
        submitted = job.info.created_at
        listed = ray_agent.cli("ps", "--json")
        rows = {i["id"]: i for i in json.loads(listed.stdout)}
        for j in (job, other):
            assert rows[j.id]["state"] == "starting" and rows[j.id]["started_at"] is None
            assert rows[j.id]["waiting"].startswith(waits), rows[j.id]
        shown = " ".join(ray_agent.cli("show", job.id).stdout.split())
        assert "state starting" in shown and f"waiting {waits}" in shown, shown
        # Past its 5 s since it was submitted: held, it has not run, so it has not timed out.
        wait_until(lambda: datetime.now(UTC) > submitted + timedelta(seconds=6))
        info = job.refresh()
        assert (info.state, info.started_at) == (JobState.starting, None), info
        assert info.waiting is not None and info.waiting.startswith(waits)
        # Cancelled before Ray placed it: it never started.
        assert ray_agent.cli("cancel", other.id).returncode == 0
        ended = other.wait(timeout=60)
        assert (ended.state, ended.reason) == (JobState.cancelled, "cancelled before it started")
        assert ended.started_at is None and ended.waiting is None
        assert "running on" not in ray_agent.cli("logs", other.id).stdout
        # The CPUs free again, Ray places it: it runs, its 5 s counting from then.
        released = datetime.now(UTC)
        assert ray_agent.cli("cancel", filler.id).returncode == 0
        assert filler.wait(timeout=60).state == JobState.cancelled
        info = job.wait(timeout=120)
    assert (info.state, info.end_class) == (JobState.failed, EndClass.timeout), info
    assert info.reason.startswith("timed out (its time limit is 5s)"), info.reason
    assert info.started_at is not None and info.started_at >= released, info
    assert info.waiting is None
    wait_until(ray_cluster.empty, timeout=60)
    assert not node_dirs(job.id)
    assert not list(dropped.iterdir())  # its script never ran


def test_a_killed_leader_leaves_no_worker_running(ray_agent, ray_cluster, project, tmp_path):
    """If the job's leader on the agent's host dies (SIGKILL: no clean-up of its own),
    Ray removes its actors and placement group, and the job's processes die with them."""
    root = project({"sleeper.py": SLEEPER})
    with ray_agent.client() as client:
        job = client.submit(["sleeper.py", str(tmp_path)], workdir=root, workers=2)
        wait_until(lambda: len(list(tmp_path.glob("pid-[0-9]"))) == 2, timeout=120)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid-[0-9]")]
        leader = json.loads((ray_agent.paths.job_dir(job.id) / "shim.pid").read_text())["pid"]
        os.kill(leader, signal.SIGKILL)
        info = job.wait(timeout=60)
    assert info.state == JobState.lost
    wait_until(lambda: not any(alive(p) for p in pids), timeout=60)
    wait_until(ray_cluster.empty, timeout=60)
    for leftover in node_dirs(job.id):  # only the leader removes these
        shutil.rmtree(leftover)


def test_gpus_and_status_show_the_cluster(ray_agent, ray_cluster):
    listed = json.loads(ray_agent.cli("gpus", "--json").stdout)
    assert [g["index"] for g in listed] == [0, 1]
    assert len({g["node"] for g in listed}) == 2  # one GPU on each of the two nodes
    table = ray_agent.cli("gpus")
    assert table.returncode == 0 and "NODE" in table.stdout
    status = ray_agent.cli("agent", "status", "--home", str(ray_agent.home))
    assert f"backend: ray, jobs run on the cluster at {ray_cluster.address}" in status.stdout


def test_jobs_the_cluster_cannot_run_are_refused_with_the_reason(ray_agent, project):
    root = project({"t.py": "print(1)\n", "requirements.txt": "numpy\n"})
    cases = [
        (
            ["--workers", "2", "--gpus-per-worker", "2", "--no-requirements"],
            "the largest node of the Ray cluster has 1",
        ),
        (["--gpu-memory", "1GiB", "--no-requirements"], "shares of a GPU (--gpu-memory)"),
        ([], "Use --no-requirements"),
        (
            ["--workers", "2", "-e", "KERAS_BACKEND=jax", "--no-requirements"],
            "keras.distribution) runs on an agent with the local backend only",
        ),
        (
            ["--workers", "2", "--keras", "keras3", "--no-requirements"],
            "Keras 3 fit on the TensorFlow backend does not work",
        ),
    ]
    for options, message in cases:
        run = ray_agent.cli("run", *options, "t.py", cwd=root)
        assert run.returncode == 2 and message in run.stderr, (options, run.stderr)
    # JupyterLab would run on a node no forward reaches, holding it until --idle.
    out = ray_agent.cli("notebook", "--no-browser", "--no-requirements", "--name", "nb", cwd=root)
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and "JupyterLab (gpuhop notebook) is reached through" in said
    assert "(agent started with --backend ray)" in said
    with ray_agent.client() as client:
        assert "nb" not in [j.name for j in client.jobs()]
    # TensorBoard too: it said the job needed "a private network (TensorFlow servers)".
    ran = ray_agent.cli("run", "-d", "--no-requirements", "t.py", cwd=root)
    assert ran.returncode == 0, ran.stderr
    out = ray_agent.cli("tensorboard", "--no-browser", ran.stdout.strip(), cwd=root)
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and "TensorBoard runs on the agent's own host" in said, said
    assert "gpuhop pull JOB" in said


def test_an_agent_with_a_wrong_token_is_refused(ray_cluster, tmp_path):
    bad = tmp_path / "bad-token"
    bad.write_text("not-the-token")
    home = tmp_path / "home"
    start = agent_cli(
        "start",
        home,
        "--backend",
        "ray",
        "--ray-address",
        ray_cluster.address,
        "--ray-token-file",
        str(bad),
    )
    assert start.returncode == 2
    assert "refused gpuhop's token" in start.stderr
    assert read_pid(AgentPaths(home)) is None


def test_a_team_agent_beside_a_ray_node_of_its_own_user_starts_no_job(ray_agent, project):
    # The test cluster's nodes run on this host as the agent's user: a job placed on one
    # could read the agent's state dir. A single-user agent runs jobs (as the tests above
    # do); once the agent serves a team (tokens of two users), it starts none, saying why.
    with ray_agent.client() as owner:
        made = [owner.create_token(user) for user in ("alice", "bob")]
        try:
            job = owner.submit(["t.py"], workdir=project({"t.py": "print(1)\n"}))
            info = job.wait(120)
            assert info.state == JobState.failed
            assert "a Ray node runs on this host as the agent's own user" in (info.reason or "")
        finally:
            for token in made:
                owner.revoke_token(token.id)


@pytest.mark.tf  # doctor's probe imports TensorFlow, on a node
def test_doctor_checks_tensorflow_on_a_ray_node_with_advice_that_fits_ray(ray_agent, ray_cluster):
    # The made-up GPUs' nodes: both on this host, so `gpus` names each by its Ray node id.
    nodes = {g["node"] for g in json.loads(ray_agent.cli("gpus", "--json").stdout)}
    ids = {m.group(1) for n in nodes if (m := re.search(r"\(([0-9a-f]{8})\)$", n))}
    assert len(ids) == 2, nodes
    out = ray_agent.cli("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    # TensorFlow was imported on a Ray node, as one task given one of the cluster's GPUs
    # (made up: TensorFlow sees none of it), and judged against what Ray gave it there.
    on = re.search(r" on node \S+ \(\S+, Ray node ([0-9a-f]{8})\)$", checks["TensorFlow"]["detail"])
    assert on is not None and on.group(1) in ids, checks["TensorFlow"]
    gpus = checks["TensorFlow sees the GPUs"]
    assert (gpus["status"], gpus["detail"].split(" on node ")[0]) == (
        "failed",
        "TensorFlow sees 0 of the 1 GPU(s) Ray gave it",
    ), gpus
    assert f"Ray node {on.group(1)})" in gpus["detail"]
    # Advice that fits Ray: no reinstall, srun, overlayfs or cgroup, nor the agent's host's
    # driver and CUDA judged.
    advice = " ".join(c["fix"] or "" for c in checks.values())
    for local in ("reinstall", "srun", "overlayfs", "cgroup"):
        assert local not in advice, (local, advice)
    assert checks["NVIDIA driver"]["status"] == "skipped"
    assert checks["CUDA version"]["status"] == "skipped"
    wait_until(ray_cluster.empty, timeout=30)  # the check's placement group is gone
