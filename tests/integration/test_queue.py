"""Issue 22 (part A), the queue: dependencies, priorities, and why each job ended, with a
real agent and real job processes (no TensorFlow: the classes come from exits, signals and
log text, whatever printed them)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpuhop.api import EndClass, JobState, SubmitRequest
from gpuhop.client import GpuhopError
from gpuhop.client.embedded import start_background
from gpuhop.client.jobs import scan_workdir
from tests.conftest import AGENT_PYTHON_FLAGS, wait_until
from tests.integration.test_agent_restart import kill_agent_hard
from tests.integration.test_metrics import scrape, value

# Waits for a file to appear, then exits with the code it is given.
WAITER = """
import os, sys, time
print("waiting", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
sys.exit(int(sys.argv[2]))
"""
SLEEPER = "import time; print('up', flush=True); time.sleep(120)\n"


def job_pids(agent, job_id: str, script: str) -> list[int]:
    """The host pids of the job's processes running `script` as `python SCRIPT` (not its
    leader, whose arguments name it too)."""
    leader = json.loads((agent.home / "jobs" / job_id / "shim.pid").read_text())
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            pgid = os.getpgid(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
        if pgid == int(leader["pid"]) and cmdline[1:2] == [script.encode()]:
            pids.append(int(entry.name))
    return pids


# -- dependencies -----------------------------------------------------------------------------


def test_a_failed_dependency_cancels_after_ok_jobs_and_after_any_runs_anyway(
    shared_agent, project, tmp_path
):
    root = project({"waiter.py": WAITER, "ok.py": "print('ran')\n"})
    release = tmp_path / "release"
    with shared_agent.client() as client:
        first = client.submit(["waiter.py", str(release), "3"], workdir=root, name="dep-first")
        after_ok = client.submit(["ok.py"], workdir=root, after=[first])
        # A chain: this one waits for a job that itself waits.
        chained = client.submit(["ok.py"], workdir=root, after=after_ok.id)
        after_any = client.submit(["ok.py"], workdir=root, after="dep-first", after_any=True)
        wait_until(lambda: first.refresh().state == JobState.running)
        for job in (after_ok, chained, after_any):
            info = job.refresh()
            assert info.state == JobState.queued
        assert after_ok.info.waiting_for == [first.id]
        assert (after_any.info.after, after_any.info.after_any) == ([first.id], True)
        shown = shared_agent.cli("show", after_ok.id)
        assert f"waits for  {first.id}" in shown.stdout, shown.stdout
        release.touch()
        assert first.wait(30).end_class == EndClass.app_error
        ok_info, chained_info, any_info = (j.wait(30) for j in (after_ok, chained, after_any))
    assert (ok_info.state, ok_info.end_class) == (JobState.cancelled, EndClass.cancelled)
    assert ok_info.started_at is None
    assert ok_info.reason == (
        f"cancelled before it started: job {first.id}, which it runs after, failed (app-error)"
    )
    assert chained_info.state == JobState.cancelled
    assert f"job {after_ok.id}, which it runs after, cancelled" in chained_info.reason
    assert (any_info.state, any_info.end_class) == (JobState.succeeded, EndClass.succeeded)
    assert any_info.started_at >= first.info.ended_at


def test_unknown_dependencies_are_refused_at_submit_naming_them(shared_agent, project):
    root = project({"ok.py": "print('ran')\n"})
    with shared_agent.client() as client:
        known = client.submit(["ok.py"], workdir=root)
        with pytest.raises(GpuhopError) as refused:
            client.submit(["ok.py"], workdir=root, after=[known.id, "nosuchjob", "f00dfeed"])
        known.wait(30)
    assert refused.value.status == 422
    assert "nosuchjob, f00dfeed" in refused.value.message
    run = shared_agent.cli("run", "--after", f"{known.id},nosuchjob", "ok.py", cwd=root)
    assert run.returncode == 2
    assert "--after names no job (or several) for: nosuchjob" in run.stderr
    # A run that waits says why its job ended, and exits with the job's code.
    bug = project({"bug.py": "import sys; sys.exit(3)\n"})
    failed = shared_agent.cli("run", "--after", known.id, "bug.py", cwd=bug)
    assert failed.returncode == 3
    assert "failed: exited with code 3" in failed.stderr and "(app-error)" in failed.stderr


def test_dependencies_and_time_limits_survive_an_agent_restart_and_a_vanished_job_is_lost(
    make_agent, project, tmp_path
):
    agent = make_agent()
    root = project({"waiter.py": WAITER, "ok.py": "print('ran')\n", "sleeper.py": SLEEPER})
    release = tmp_path / "release"
    with agent.client() as client:
        first = client.submit(["waiter.py", str(release), "0"], workdir=root)
        second = client.submit(["ok.py"], workdir=root, after=[first])
        slow = client.submit(["sleeper.py"], workdir=root, timeout="3s")
        gone = client.submit(["sleeper.py"], workdir=root)
        for job in (slow, gone):
            wait_until(lambda j=job: b"up" in b"".join(j.logs()))
    kill_agent_hard(agent)
    # While the agent is away, the whole of one job goes, its leader too: no exit status.
    leader = json.loads((agent.home / "jobs" / gone.id / "shim.pid").read_text())
    os.killpg(int(leader["pid"]), signal.SIGKILL)
    agent.pid = start_background(agent.paths, python_flags=AGENT_PYTHON_FLAGS)
    with agent.client() as client:
        assert client.job(second.id).state == JobState.queued
        release.touch()
        assert client.job(second.id).wait(30).state == JobState.succeeded
        timed = client.job(slow.id).wait(60)
        lost = client.job(gone.id).wait(30)
    assert (lost.state, lost.end_class) == (JobState.lost, EndClass.lost)
    assert (timed.state, timed.end_class, timed.signal) == (
        JobState.failed,
        EndClass.timeout,
        signal.SIGTERM,
    )
    assert timed.reason.startswith("timed out (its time limit is 3s) after")


# -- priorities -------------------------------------------------------------------------------


def test_higher_priority_goes_first_and_requeue_moves_a_queued_job(make_agent, project, tmp_path):
    agent = make_agent(fake_gpus=1)
    root = project({"waiter.py": WAITER, "ok.py": "print('ran')\n"})
    release = tmp_path / "release"
    with agent.client() as client:
        blocker = client.submit(["waiter.py", str(release), "0"], workdir=root, gpus=1)
        wait_until(lambda: blocker.refresh().state == JobState.running)
        low = client.submit(["ok.py"], workdir=root, gpus=1, name="low")
        high = client.submit(["ok.py"], workdir=root, gpus=1, priority=5, name="high")
        late = client.submit(["ok.py"], workdir=root, gpus=1, name="late")
        # A CPU job passes the GPU queue (it needs none of its GPUs)...
        assert client.submit(["ok.py"], workdir=root).wait(30).state == JobState.succeeded
        # ...but the queued GPU jobs wait, whatever their priority.
        assert {j.refresh().state for j in (low, high, late)} == {JobState.queued}
        moved = agent.cli("requeue", "late", "--priority", "9")
        assert moved.returncode == 0, moved.stderr
        assert late.refresh().priority == 9
        ps = agent.cli("ps")
        assert "PRI" in ps.stdout.splitlines()[0]
        # GPUS: the index a running job holds, the count a queued one asks for (a bare "1"
        # read as GPU 1).
        rows = {line.split()[0]: line for line in ps.stdout.splitlines()[1:]}
        assert rows[blocker.id].split()[2:4] == ["running", "0"], rows[blocker.id]
        assert "1 asked" in rows[low.id], rows[low.id]
        with pytest.raises(GpuhopError) as running:
            blocker.requeue(3)
        assert running.value.status == 409 and "only a queued job" in running.value.message
        release.touch()
        ended = [j.wait(60) for j in (late, high, low)]
    starts = [info.started_at for info in ended]
    assert starts == sorted(starts), "started out of priority order"
    assert all(info.state == JobState.succeeded for info in ended)


# -- why a job ended --------------------------------------------------------------------------


def test_each_end_class_comes_from_what_really_happened(shared_agent, project):
    root = project(
        {
            "ok.py": "print('fine')\n",
            "bug.py": "import sys; sys.exit(3)\n",
            "gpu_oom.py": "import sys\n"
            "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB',"
            " file=sys.stderr)\n"
            "sys.exit(1)\n",
            "tf_oom.py": "import sys\n"
            "print('tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when"
            " allocating tensor with shape[8192,8192]', file=sys.stderr)\n"
            "sys.exit(1)\n",
            "victim.py": SLEEPER,
            "cancelled.py": SLEEPER,
        }
    )
    before = scrape(shared_agent)  # the shared agent's earlier jobs ended as they did
    with shared_agent.client() as client:
        jobs = {
            name: client.submit([f"{name}.py"], workdir=root)
            for name in ("ok", "bug", "gpu_oom", "tf_oom", "victim", "cancelled")
        }
        for name in ("victim", "cancelled"):
            wait_until(lambda n=name: b"up" in b"".join(jobs[n].logs()))
        # SIGKILL from outside, to the job's own process (not its leader): as the OOM killer
        # would, but nothing here can tell them apart, so it is `killed`, saying signal 9.
        [victim_pid] = job_pids(shared_agent, jobs["victim"].id, "victim.py")
        os.kill(victim_pid, signal.SIGKILL)
        jobs["cancelled"].cancel(grace=1)
        ended = {name: job.wait(60) for name, job in jobs.items()}
    classes = {name: info.end_class for name, info in ended.items()}
    assert classes == {
        "ok": EndClass.succeeded,
        "bug": EndClass.app_error,
        "gpu_oom": EndClass.oom_gpu,
        "tf_oom": EndClass.oom_gpu,
        "victim": EndClass.killed,
        "cancelled": EndClass.cancelled,
    }
    assert ended["bug"].exit_code == 3
    assert ended["victim"].reason.startswith("killed by signal 9 (SIGKILL")

    listed = json.loads(shared_agent.cli("ps", "--json").stdout)
    by_id = {j["id"]: j["end_class"] for j in listed}
    assert by_id[jobs["gpu_oom"].id] == "oom-gpu" and by_id[jobs["victim"].id] == "killed"
    shown = shared_agent.cli("show", jobs["bug"].id)
    assert "class  app-error" in shown.stdout
    metrics = scrape(shared_agent)
    for end in EndClass:  # every class has a series, even at 0
        added = count(metrics, end.value) - count(before, end.value)
        assert (added >= 1) == (end.value in set(classes.values())), end


def count(metrics: dict, end_class: str) -> float:
    return value(metrics, "gpuhop_jobs_ended", "gpuhop_jobs_ended_total", **{"class": end_class})


HOG = """
import os, sys, time
print("waiting", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
hog = []
while True:
    hog.append(bytearray(16 * 2**20))  # touched: bytearray zero-fills it
"""


def test_an_oom_kill_in_the_jobs_cgroup_is_oom_host(make_agent, project, tmp_path):
    """The host's OOM killer, made to act by a memory limit that the test (an admin, as
    root) sets on the job's own cgroup while it runs."""
    agent = make_agent()
    root = project({"hog.py": HOG})
    release = tmp_path / "release"
    with agent.client() as client:
        job = client.submit(["hog.py", str(release)], workdir=root)
        wait_until(lambda: b"waiting" in b"".join(job.logs()))
        made = agent.home / "jobs" / job.id / "cgroup.json"
        if not made.exists():
            job.cancel(grace=0)
            pytest.skip("this host lets the agent make no memory cgroup for a job")
        cgroup = Path(json.loads(made.read_text())["path"])
        limit = 64 * 2**20
        if (cgroup / "memory.max").exists():
            (cgroup / "memory.max").write_text(str(limit))
            (cgroup / "memory.swap.max").write_text("0")
        else:
            (cgroup / "memory.limit_in_bytes").write_text(str(limit))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to limit
                (cgroup / "memory.memsw.limit_in_bytes").write_text(str(limit))
        release.touch()
        info = job.wait(60)
    assert (info.state, info.end_class, info.signal) == (JobState.failed, EndClass.oom_host, 9)
    assert info.reason.startswith("killed by the kernel's OOM killer (out of host memory")
    assert not cgroup.exists()  # removed with the attempt


def test_retries_take_infra_failures_by_default_and_app_errors_only_when_asked(
    shared_agent, project
):
    root = project(
        {
            "flaky.py": "import gpuhop.runtime, os, signal, sys\n"
            "print('attempt', gpuhop.runtime.attempt(), flush=True)\n"
            "if gpuhop.runtime.attempt() == 1: os.kill(os.getpid(), signal.SIGKILL)\n",
            "bug.py": "import sys; sys.exit(3)\n",
        }
    )
    with shared_agent.client() as client:
        killed = client.submit(["flaky.py"], workdir=root, retries=1).wait(60)
        bug = client.submit(["bug.py"], workdir=root, retries=2).wait(60)
        bug_any = client.submit(["bug.py"], workdir=root, retries=1, retry_on="any").wait(60)
    assert (killed.state, killed.attempt, killed.end_class) == (
        JobState.succeeded,
        2,
        EndClass.succeeded,
    )
    assert [a.end_class for a in killed.attempts] == [EndClass.killed]
    assert (bug.state, bug.attempt, bug.end_class) == (JobState.failed, 1, EndClass.app_error)
    assert (bug_any.attempt, [a.end_class for a in bug_any.attempts]) == (2, [EndClass.app_error])


def test_bad_queue_options_are_refused_naming_the_problem(shared_agent, project):
    root = project({"ok.py": "print('fine')\n"})
    for args, message in (
        (("--timeout", "soon"), "--time-limit: 'soon' is not a duration"),
        (("--time-limit", "0"), "--time-limit: '0': a time limit is more than 0"),
        (("--retry-on", "bugs"), "--retry-on takes infra or any, got 'bugs'"),
        (("--after-any",), "--after-any says how to wait for --after jobs"),
        (("--priority", "101"), "Invalid value for '--priority'"),
    ):
        run = shared_agent.cli("run", *args, "ok.py", cwd=root)
        assert run.returncode == 2, (args, run.stdout)
        assert message in run.stderr, (args, run.stderr)


def test_submits_at_once_never_give_one_gpu_to_two_jobs(make_agent, project):
    """Each submit runs a scheduler pass in its own request's thread: passes from eight
    requests at once (and the agent's loop) take turns, so two GPUs go to two jobs."""
    agent = make_agent(fake_gpus=2)
    root = project({"sleeper.py": SLEEPER, "ok.py": "print('ok')\n"})
    with agent.client() as client:
        client.submit(["ok.py"], workdir=root).wait(30)  # the tree is on the agent now
        tree = scan_workdir(client.session, root).tree
        body = SubmitRequest(command=["sleeper.py"], tree=tree, gpus=1).model_dump(
            mode="json", exclude_none=True
        )

        def post(_: int) -> str:
            with agent.client() as own:  # a connection of its own: eight requests at once
                return str(own.session.request("POST", "/v1/jobs", json=body).json()["id"])

        try:
            with ThreadPoolExecutor(max_workers=8) as pool:
                jobs = [client.job(job_id) for job_id in pool.map(post, range(8))]
            wait_until(lambda: sum(j.refresh().state == JobState.running for j in jobs) == 2)
            infos = [j.refresh() for j in jobs]
            holding = sorted(tuple(i.gpu_ids) for i in infos if i.state != JobState.queued)
            assert holding == [(0,), (1,)], [(i.id, i.state, i.gpu_ids) for i in infos]
        finally:  # every job this test made, also those of a half-done start
            left = [client.job(i.id) for i in client.jobs() if not i.state.finished]
            for job in left:
                with contextlib.suppress(GpuhopError):
                    job.cancel(grace=0)
            for job in left:
                job.wait(30)


def test_a_cancel_while_the_job_starts_ends_it(shared_agent, project):
    """The submit's own pass moves the job to `starting` before the answer, so this cancel
    comes while its leader sets up: a SIGTERM then can come before the job's process, and the
    SIGKILL after the grace must still end it."""
    root = project({"sleeper.py": SLEEPER})
    with shared_agent.client() as client:
        job = client.submit(["sleeper.py"], workdir=root)
        job.cancel(grace=0.5)
        info = job.wait(30)
    assert info.state == JobState.cancelled, info.reason
    # The leader of the job's process group had started (the agent records its pid), and
    # no process of that group outlives the cancel: the sleeper would live 120 s.
    with contextlib.closing(sqlite3.connect(shared_agent.paths.db)) as db:
        (pgid,) = db.execute("SELECT pid FROM jobs WHERE id = ?", (job.id,)).fetchone()
    assert pgid is not None
    wait_until(lambda: not group_alive(pgid), timeout=30)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
