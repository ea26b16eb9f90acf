"""Containers started ahead of their image jobs (gpuhop.backends.local.ready): after an image
job, the agent's leader server starts a container of the same image, user, home and GPUs,
and the next such job runs in it. Real agent, real Podman, the minimal image
(tests/images.py).

A job in a ready container gets what a job in its own `podman run` gets: the same contract
and variables, its own dirs at their host paths (and only those of the jobs' root), its
datasets read-only, its /tmp its own and kept, the image's read-only root, the same uid;
its exit code, a missing program, a cancel and a killed leader end it as they end a cold
one, and nothing is left mounted or running after it, nor after the agent stops.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.backends.local.ready import NAME_PREFIX, mounts_under
from tests.conftest import wait_until
from tests.images import CAN_WRITE, containers_named, job_containers

pytestmark = pytest.mark.timeout(300)

# Reports what the job sees; `argv[1]`: the jobs' root on the host.
REPORT = (
    r"""
import json, os, sys
jobs = sys.argv[1]
"""
    + CAN_WRITE
    + r"""
with open(os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "model.txt"), "w") as f:
    f.write("made in " + os.environ["GPUHOP_JOB_ID"])
env = {k: v for k, v in os.environ.items() if k.startswith(("GPUHOP_", "TF_", "CUDA_"))}
print("REPORT " + json.dumps({
    "os_release": open("/etc/os-release").read(),
    "ids": [os.getuid(), os.getgid()],
    "cwd": os.getcwd(),
    "env": sorted(env),
    "given": os.environ.get("GIVEN"),
    "home": os.environ.get("HOME"),
    "jobs": sorted(os.listdir(jobs)),
    "data": open("d/weights.txt").read(),
    "data_writable": can_write("d/weights.txt"),
    "root": can_write("/etc/written"),
    "jobs_root": can_write(os.path.join(jobs, "written")),
    "tmp": can_write("/tmp/mine"),
    "tmp_before": sorted(os.listdir("/tmp")),
    "pid1": open("/proc/1/cmdline").read().split("\0")[0],
}), flush=True)
"""
)

ENDS = r"""
import os, signal, sys, time
print("ready", flush=True)
if sys.argv[1] == "exit":
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: (print("got TERM", flush=True), sys.exit(143)))
time.sleep(600)
"""

# A value that needs its JSON escaping, and an "=" in it.
GIVEN = 'a=b "quoted" ünï\tcode'


def ready_containers(agent) -> list[str]:
    """The agent's ready containers (each has a dir of its name in the agent's state: other
    tests' agents have theirs)."""
    try:
        mine = set(os.listdir(agent.paths.ready))
    except FileNotFoundError:
        mine = set()
    return [name for name in containers_named(f"{NAME_PREFIX}-") if name in mine]


def ran_ahead(agent, job_id: str) -> str | None:
    """The ready container the job ran in (as its leader recorded), or None."""
    record = json.loads((agent.paths.job_dir(job_id) / "shim.pid").read_text())
    return next((n for n in record["containers"] if n.startswith(NAME_PREFIX)), None)


def report(job) -> dict:
    info = job.wait(120)
    log = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, (info.reason, log)
    line = next(x for x in log.splitlines() if x.startswith("REPORT "))
    return json.loads(line[len("REPORT ") :])


def test_the_next_image_job_runs_in_a_container_started_ahead_as_in_its_own(
    make_agent, minimal_image, project, tmp_path
):
    agent = make_agent()
    root = project({"report.py": REPORT})
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "weights.txt").write_text("0.5 0.25")
    jobs = str(agent.paths.jobs)
    with agent.client() as client:
        client.data.push(weights, "weights")

        def submit():
            return client.submit(
                ["report.py", jobs],
                workdir=root,
                image=minimal_image,
                data=["weights=d"],
                env={"GIVEN": GIVEN},
            )

        cold = submit()
        seen_cold = report(cold)
        assert ran_ahead(agent, cold.id) is None  # the first of its kind: its own `podman run`
        wait_until(lambda: len(ready_containers(agent)) == 1, 60)
        [waiting] = ready_containers(agent)
        warm = submit()
        seen_warm = report(warm)
        assert ran_ahead(agent, warm.id) == waiting

        # What it saw is what the cold one saw, for its own job.
        for seen, job in ((seen_cold, cold), (seen_warm, warm)):
            assert seen["cwd"] == str(agent.paths.job_dir(job.id) / "work")
            assert seen["jobs"] == [job.id]  # of the jobs' root, its own dir only
        same = ("os_release", "ids", "env", "given", "home", "data", "data_writable", "root")
        same += ("tmp_before",)  # (a fresh /tmp, but for the mount points of the jobs' root)
        # Nothing to write in the jobs' root but its own paths (as in a read-only root; the
        # cold one's is in its /tmp here, the agent's state being under /tmp).
        assert seen_warm["jobs_root"] == "Read-only file system"
        assert {k: seen_warm[k] for k in same} == {k: seen_cold[k] for k in same}
        assert seen_warm["given"] == GIVEN
        assert seen_warm["data"] == "0.5 0.25"
        assert seen_warm["data_writable"] == seen_warm["root"] == "Read-only file system"
        assert seen_warm["tmp"] is True and seen_warm["pid1"] == seen_cold["pid1"]
        assert (agent.paths.job_dir(warm.id) / "tmp" / "mine").exists()  # its /tmp, kept
        pulled = client.job(warm.id).pull(tmp_path / "out")
        assert [p.name for p in pulled] == ["model.txt"]
        assert (tmp_path / "out" / "model.txt").read_text() == f"made in {warm.id}"
        assert job_containers(agent.paths, warm.id) == []
        # Its dir and mounts went with it; the next one's are all that is there.
        wait_until(lambda: len(ready_containers(agent)) == 1, 60)
        [following] = ready_containers(agent)
        assert following != waiting
        assert sorted(os.listdir(agent.paths.ready)) == [following]
        assert {Path(p).relative_to(agent.paths.ready).parts[0] for p in mounts_under(
            str(agent.paths.ready))} == {following}  # fmt: skip
    agent.shutdown()
    assert containers_named(following) == []
    assert mounts_under(str(agent.paths.ready)) == []
    assert not agent.paths.ready.exists() or os.listdir(agent.paths.ready) == []


def test_a_job_in_a_ready_container_ends_as_in_its_own(make_agent, minimal_image, project):
    agent = make_agent()
    root = project({"ends.py": ENDS})
    with agent.client() as client:

        def next_in_ready(*args: str):
            wait_until(lambda: len(ready_containers(agent)) == 1, 60)
            job = client.submit(list(args), workdir=root, image=minimal_image)
            wait_until(lambda: (agent.paths.job_dir(job.id) / "shim.pid").exists(), 60)
            wait_until(lambda: b"ready" in b"".join(job.logs()) or job.refresh().state.finished)
            assert ran_ahead(agent, job.id) is not None
            return job

        client.submit(["ends.py", "exit"], workdir=root, image=minimal_image).wait(120)
        # Its exit code.
        info = next_in_ready("ends.py", "exit").wait(60)
        assert (info.state, info.exit_code) == (JobState.failed, 3)
        # A program the image lacks: said as for a cold one.
        missing = next_in_ready("gpuhop-test-no-such-program").wait(60)
        assert missing.state == JobState.failed
        assert "its program could not be started in its image (No such file or" in (
            missing.reason or ""
        ), missing.reason
        # A cancel's SIGTERM reaches it.
        job = next_in_ready("ends.py", "wait")
        assert len(job_containers(agent.paths, job.id)) == 1
        job.cancel(grace=10)
        assert job.wait(60).state == JobState.cancelled
        assert b"got TERM" in b"".join(job.logs())
        assert job_containers(agent.paths, job.id) == []
        # A killed leader: the agent removes its container, the leader server its mounts.
        job = next_in_ready("ends.py", "wait")
        here = ran_ahead(agent, job.id)
        leader = json.loads((agent.paths.job_dir(job.id) / "shim.pid").read_text())
        os.killpg(leader["pid"], signal.SIGKILL)
        assert job.wait(60).state == JobState.lost
        assert job_containers(agent.paths, job.id) == []
        wait_until(lambda: not mounts_under(str(agent.paths.ready / str(here))), 60)


def test_ready_containers_false_starts_each_image_job_in_its_own(
    make_agent, minimal_image, project
):
    agent = make_agent(config="ready_containers = false\n")
    root = project({"ends.py": ENDS})
    with agent.client() as client:
        for _ in range(2):
            job = client.submit(["ends.py", "exit"], workdir=root, image=minimal_image)
            assert job.wait(120).exit_code == 3
            assert ran_ahead(agent, job.id) is None
    assert not agent.paths.ready.exists()  # no container was started ahead there
