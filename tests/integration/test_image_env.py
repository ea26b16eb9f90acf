# ruff: noqa: F811 (the fixtures imported are parameters here)
"""A team job's variables and the root Podman that runs its container (real Podman, a real
team agent): the variables reach the container whole, and never Podman's own environment,
where a user's LD_PRELOAD ran their own library as root (seen: three root Podman processes
loaded it) and CONTAINERS_CONF pointed Podman at a configuration of their writing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.backends.listeners import descendants
from gpuhop.home import JobPaths
from tests.conftest import wait_until
from tests.integration.test_tls import remote, tls_agent, tokens  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(300)

# Variables that act on Podman (and what it runs: conmon, the OCI runtime) if it has them.
HOSTILE = {
    "LD_PRELOAD": "/nonexistent/gpuhop-test-preload.so",
    "CONTAINERS_CONF": "/nonexistent/gpuhop-test-containers.conf",
    "CONTAINERS_STORAGE_CONF": "/nonexistent/gpuhop-test-storage.conf",
    "PATH": "/nonexistent/gpuhop-test-bin:/usr/bin:/bin",
}
PLAIN = {"MY_TEXT": "a b=c  # not a comment ", "MY_EMPTY": ""}

JOB = """
import json, os, sys, time
names = sys.argv[2:]
print(json.dumps({n: os.environ.get(n) for n in names}), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def podman_environments(job_dir: Path) -> list[dict[str, str]]:
    """The environments of the Podman processes running the job's container (root's)."""
    leader = json.loads(JobPaths(job_dir).leader_pid.read_text())["pid"]
    found = []
    for pid in descendants(int(leader)):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if os.path.basename(exe) == "podman":
            pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
            found.append({k.decode(): v.decode(errors="replace") for k, _, v in pairs})
    return found


def test_a_jobs_variables_reach_its_container_and_never_the_root_podman(
    tls_agent, remote, tokens, project, minimal_image
):
    root = project({"job.py": JOB})
    names = [*HOSTILE, *PLAIN]
    env = {**HOSTILE, **PLAIN}
    with remote(tokens["alice"]) as alice:
        job = alice.submit(
            ["job.py", "release", *names], workdir=root, env=env, image=minimal_image
        )
        job_dir = tls_agent.paths.job_dir(job.id)
        try:
            wait_until(lambda: b"{" in b"".join(job.logs()), timeout=120)
            seen = [p for p in podman_environments(job_dir) if p]
            (JobPaths(job_dir).work / "release").touch()
            info = job.wait(timeout=120)
        finally:
            if not job.refresh().state.finished:
                job.cancel(grace=0)
        log = b"".join(job.logs()).decode(errors="replace")
    assert info.state == JobState.succeeded, (info.reason, log)
    printed = json.loads(next(line for line in log.splitlines() if line.startswith("{")))
    assert {n: printed[n] for n in PLAIN} == PLAIN
    assert printed["LD_PRELOAD"] == HOSTILE["LD_PRELOAD"]  # the job's own, in its container
    assert printed["CONTAINERS_CONF"] == HOSTILE["CONTAINERS_CONF"]
    assert seen, "no Podman process of the job was found"
    for podman_env in seen:
        assert not set(podman_env) & {*PLAIN, "LD_PRELOAD", "CONTAINERS_CONF"}, podman_env
        assert "CONTAINERS_STORAGE_CONF" not in podman_env
        assert podman_env.get("PATH") != HOSTILE["PATH"]


def test_a_value_with_a_line_break_is_refused_saying_why(
    tls_agent, remote, tokens, project, minimal_image
):
    root = project({"job.py": "print('ran')\n"})
    with remote(tokens["alice"]) as alice:
        job = alice.submit(
            ["job.py"], workdir=root, env={"PEM": "line one\nLD_PRELOAD=/x.so"}, image=minimal_image
        )
        info = job.wait(timeout=120)
        log = b"".join(job.logs()).decode(errors="replace")
    assert info.state == JobState.failed
    assert "the value of PEM has a line break" in (info.reason or ""), info.reason
    assert "ran" not in log
