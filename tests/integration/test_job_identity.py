# ruff: noqa: F811 (the fixtures imported from test_tls are parameters here)
"""A job owns nothing but its own: on a real team agent (TLS, two users, run as root as the
README offers), each user's jobs run as an unprivileged identity of their own, in a world
that is read-only but for the job's own dirs, with none of the agent's environment; and a
team agent that cannot give jobs an identity (not root) starts none.

Each test is a reproducer of an attack that worked before (a job rewriting gpuhop's start-up
hook or /etc/passwd, a user's file run as the agent, the operator's credentials in every
job's environment), now failing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpuhop.runtime.hook
from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from gpuhop.home import JobPaths
from tests.conftest import AGENT_PYTHON_FLAGS, Agent, missing, wait_until
from tests.integration.test_tls import remote, tls_agent, tokens  # noqa: F401 (fixtures)
from tests.team import team_agent, team_tokens

PROBE = r"""
import json, os, sys

def writable_mounts():
    # The last mount at a point is the one in view (one mounted over another covers it).
    top = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            top[fields[4].replace("\\040", " ")] = fields[5].split(",")
    return [point for point, options in top.items() if "rw" in options]

def attempt(path):
    # Opened for writing (made if missing), and nothing written: where the sandbox fails,
    # the host's files must not be harmed by the test that finds it.
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    except OSError as e:
        return e.strerror
    return "written"

report = {
    "uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(), "groups": os.getgroups(),
    "home": os.environ.get("HOME"), "cwd": os.getcwd(),
    "rw_mounts": writable_mounts(),
    "writes": {p: attempt(p) for p in json.loads(os.environ["TARGETS"])},
    "env": dict(os.environ),
    "root_listing": sorted(os.listdir("/root")) if os.path.isdir("/root") else None,
    "nproc": __import__("resource").getrlimit(__import__("resource").RLIMIT_NPROC),
}
mine = "mine-%s.txt" % os.environ["GPUHOP_JOB_ID"]
for d in ("/tmp", "/var/tmp", "/dev/shm", os.environ["HOME"], os.environ["GPUHOP_ARTIFACTS_DIR"]):
    with open(os.path.join(d, mine), "w") as f:
        f.write("mine")
print("REPORT " + json.dumps(report), flush=True)
"""

# What a job wrote before: every later job imports the hook, and the agent runs the leader.
HOOK = gpuhop.runtime.hook.__file__
SITECUSTOMIZE = str(Path(gpuhop.runtime.hook.STARTUP_DIR) / "sitecustomize.py")
LEADER = str(Path(gpuhop.runtime.hook.__file__).parents[1] / "backends" / "local" / "leader.py")
STDLIB_OS = str(Path(os.__file__).resolve())
HOST_FILES = ["/etc/passwd", "/etc/cron.d/gpuhop-test", "/root/.ssh/authorized_keys"]


def run_probe(client, project, targets: list[str], **kw) -> tuple[dict, str]:
    root = project({"probe.py": PROBE})
    env = {"TARGETS": json.dumps(targets), **kw.pop("env", {})}
    job = client.submit(["probe.py"], workdir=root, env=env, **kw)
    info = job.wait(120)
    log = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, log
    line = next(x for x in log.splitlines() if x.startswith("REPORT "))
    return json.loads(line[len("REPORT ") :]), job.id


def test_each_users_jobs_run_as_an_unprivileged_identity_of_their_own(
    tls_agent, remote, tokens, project
):
    with remote(tokens["alice"]) as alice, remote(tokens["bob"]) as bob:
        first, job_id = run_probe(alice, project, [])
        again, _ = run_probe(alice, project, [])
        other, _ = run_probe(bob, project, [])
    agent_uid = os.stat(f"/proc/{tls_agent.paths.pidfile.read_text().strip()}").st_uid
    for report in (first, again, other):
        assert report["uid"] == report["euid"] == report["gid"]
        assert report["uid"] not in (0, agent_uid)
        assert report["groups"] == []
    assert first["uid"] == again["uid"] != other["uid"]
    # Its processes (threads too) are capped, below the host's pids: one user's fork bomb
    # left the agent and the other users' jobs none (the limit was the host's, 96,363,
    # beside a pid_max of 32,768).
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert first["nproc"] == [max(4096, pid_max // 4)] * 2, first["nproc"]
    # Its home is its own (its caches live there), kept across its jobs.
    home = tls_agent.paths.home / "users" / str(first["uid"]) / "home"
    assert first["home"] == again["home"] == str(home)
    assert (home / f"mine-{job_id}.txt").stat().st_uid == first["uid"]
    # What it wrote is its own on the host.
    jp = JobPaths(tls_agent.paths.job_dir(job_id))
    assert (jp.artifacts / f"mine-{job_id}.txt").stat().st_uid == first["uid"]
    # doctor says so.
    with tls_agent.client() as owner:
        check = next(c for c in owner.doctor() if c.name == "job identity")
    assert check.status == "passed", check
    assert "each user's jobs run as an unprivileged uid of their own" in check.detail


def test_nothing_outside_a_jobs_own_dirs_is_writable(tls_agent, remote, tokens, project):
    targets = [HOOK, SITECUSTOMIZE, LEADER, STDLIB_OS, sys.executable, *HOST_FILES]
    targets.append("/proc/sys/kernel/core_pattern")
    before = {p: Path(p).read_bytes() for p in targets if Path(p).is_file()}
    missing = [p for p in targets if not Path(p).exists()]
    try:
        with remote(tokens["alice"]) as alice:
            report, job_id = run_probe(alice, project, targets)
    finally:
        created = [p for p in missing if Path(p).exists()]
        for path in created:
            Path(path).unlink()
    assert created == []
    assert report["writes"] and all(v != "written" for v in report["writes"].values()), report
    for path, content in before.items():
        assert Path(path).read_bytes() == content
    # As a property: every mount the job may write to is one of its own.
    jp = JobPaths(tls_agent.paths.job_dir(job_id))
    own = {
        str(p) for p in (jp.work, jp.artifacts, jp.checkpoints, jp.log, jp.metrics, jp.provenance)
    }
    own.add(str(jp.control))  # where its processes make their `gpuhop profile` FIFOs
    own |= {"/tmp", "/var/tmp", "/dev/shm", report["home"]}
    own.add("/proc")  # the job's own PID namespace's; the kernel's files in it are root's
    assert set(report["rw_mounts"]) <= own, set(report["rw_mounts"]) - own
    # The agent's user's home is covered: no SSH keys, history or credentials in view.
    assert report["root_listing"] is not None and ".ssh" not in report["root_listing"]
    # The private /tmp, /var/tmp and /dev/shm were the job's: nothing of it is left on the host.
    for shared in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not Path(shared, f"mine-{job_id}.txt").exists()


def test_the_agents_environment_never_reaches_a_team_job(tmp_path_factory, monkeypatch, project):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "operator-secret-key")
    monkeypatch.setenv("HF_TOKEN", "hf_operator")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/run/operator/agent.sock")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    root = Path(tmp_path_factory.mktemp("env-agent"))
    with team_agent(root, 0) as agent, agent.client() as owner:
        token = team_tokens(agent)["alice"]
        assert token  # two users: a team agent
        report, _ = run_probe(owner, project, [], env={"MINE": "passed"})
    env = report["env"]
    assert "operator-secret-key" not in json.dumps(env)
    for name in ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "SSH_AUTH_SOCK", "GPUHOP_HOME"):
        assert name not in env
    # What a job needs still passes: PATH, the locale, what the user passed, gpuhop's own.
    assert env["PATH"] and env["LC_ALL"] == "C.UTF-8" and env["MINE"] == "passed"
    assert env["GPUHOP_JOB_ID"] and env["HOME"] == report["home"]


def test_an_interpreter_among_users_files_is_refused_before_it_runs(
    tls_agent, remote, tokens, project
):
    # A file of the user's tree, marked executable, is a file on the host that they wrote.
    evil = "#!/bin/sh\nid > /var/tmp/gpuhop-evil-ran\n"
    root = project({"evil.sh": evil, "job.py": "print('hi')\n"})
    os.chmod(root / "evil.sh", 0o755)
    marker = Path("/var/tmp/gpuhop-evil-ran")
    marker.unlink(missing_ok=True)
    try:
        refused_all(tls_agent, remote, tokens, root, evil)
    finally:
        ran = marker.exists()
        marker.unlink(missing_ok=True)
    assert not ran, "the user's file ran on the host"


def refused_all(tls_agent, remote, tokens, root: Path, evil: str) -> None:
    with remote(tokens["alice"]) as alice:
        job = alice.submit(["job.py"], workdir=root)
        job.wait(60)
        placed = [
            p
            for p in tls_agent.paths.home.rglob("evil.sh")
            if os.access(p, os.X_OK) and p.read_text() == evil
        ]
        assert placed
        for path in placed:
            for workers in (1, 2):
                with pytest.raises(GpuhopError) as refused:
                    alice.submit(["job.py"], workdir=root, python=str(path), workers=workers)
                assert refused.value.status == 400
                assert "among what users sent" in str(refused.value)


SITE = "import os; print('SITE uid=%d' % os.getuid(), flush=True)\n"


def test_an_environment_is_built_in_the_sandbox_as_the_users_identity(
    tls_agent, remote, tokens, project
):
    """pip runs as the job's identity, where the job's own sitecustomize can run as nobody
    else; the built environment is then read-only to the job."""
    root = project({"probe.py": PROBE, "sitecustomize.py": SITE, "requirements.txt": "numpy\n"})
    requirements = str(root / "requirements.txt")
    with remote(tokens["alice"]) as alice:
        job = alice.submit(
            ["probe.py"],
            workdir=root,
            env={"TARGETS": "[]", "PYTHONPATH": "."},
            requirements=requirements,  # numpy: found in the host's packages, no index needed
        )
        info = job.wait(240)
        log = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, log
    assert "built environment" in log
    report = json.loads(next(x for x in log.splitlines() if x.startswith("REPORT "))[7:])
    uid = report["uid"]
    ran_as = {line.split("=", 1)[1] for line in log.splitlines() if line.startswith("SITE uid=")}
    # Before, pip ran in the leader as the agent (root), with the job's PYTHONPATH.
    assert uid not in (0, os.geteuid()) and ran_as == {str(uid)}, log
    envs = [p for p in (tls_agent.paths.home / "envs").iterdir() if p.is_dir()]
    built = [p for p in envs if (p / "gpuhop-env.json").exists()]
    assert built and all((p / "gpuhop-env.json").stat().st_uid == uid for p in built)
    # Read-only in the job: a second job of alice's cannot alter what it imports from.
    target = next(built[0].rglob("site.py"), None) or next(built[0].rglob("*.pth"))
    with remote(tokens["alice"]) as alice:
        again, _ = run_probe(alice, project, [str(target)], requirements=requirements)
    assert again["writes"][str(target)] != "written"


@pytest.fixture
def non_root_team_agent(tmp_path: Path):
    """A team agent whose user is not root: it runs as uid 1000 of a user namespace (which
    maps it to this host's user, so it can read the project's interpreter), where it has no
    capability at all, as an agent started by an ordinary account."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to start an agent as another uid")
    if shutil.which("unshare") is None:
        missing("unshare(1) is not installed (util-linux)")
    probe = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", "id", "-u"],
        capture_output=True,
        text=True,
    )
    if probe.stdout.strip() != "1000":
        pytest.skip(f"cannot map a user namespace here: {probe.stderr.strip()}")
    agent = Agent(tmp_path / "home", tmp_path / "cache", None, args=("--listen", "127.0.0.1:0"))
    agent.paths.ensure()
    cmd = ["unshare", "--user", "--map-user=1000", "--map-group=1000"]
    cmd += [
        sys.executable,
        *AGENT_PYTHON_FLAGS,
        "-m",
        "gpuhop.agent",
        "--home",
        str(agent.home),
        *agent.args,
    ]
    # Its output where the agent's own start puts it, so that what it logs is read too.
    log = agent.paths.logfile.open("ab")
    proc = subprocess.Popen(cmd, env=agent.env, stdout=log, stderr=subprocess.STDOUT)
    agent.pid = proc.pid
    try:
        wait_until(lambda: proc.poll() is not None or agent.paths.socket.exists(), 60)
        assert proc.poll() is None, agent.paths.logfile.read_text()
        agent.watched()
        yield agent
    finally:
        agent.shutdown()
        proc.wait(30)
        log.close()


def test_a_team_agent_that_is_not_root_starts_no_job_and_says_why(non_root_team_agent, project):
    root = project({"probe.py": PROBE})
    with non_root_team_agent.client() as owner:
        job = owner.submit(["probe.py"], workdir=root, env={"TARGETS": "[]"})
        info = job.wait(60)
    assert info.state == JobState.failed
    assert "does not run as root" in info.reason
    assert "run the team agent as root" in info.reason


def _wheel(folder: Path, pth_code: str) -> Path:
    """A wheel of a package `gpuhoppth` whose only file is a .pth file running `pth_code`
    at every start of an interpreter that has it installed."""
    import base64
    import hashlib
    import zipfile

    name, version = "gpuhoppth", "1.0"
    files = {
        "gpuhoppth.pth": pth_code + "\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\n"
        f"Version: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def test_a_users_environment_is_probed_as_their_identity_not_as_the_agent(
    tls_agent, remote, tokens, project
):
    """A package of alice's own (a wheel in her tree, installed with her PIP_* variables)
    puts a .pth file in her environment, which runs in every interpreter of it: also when
    the agent asks a multi-worker job's interpreter which Keras it has. That must run as
    alice's identity in a sandbox, never as the agent (root) on the host."""
    marker = "/var/tmp/gpuhop-pth-ran-as-"
    code = (
        "import os; os.path.isdir('/var/tmp') and not os.access('/var/tmp', os.W_OK)"
        f" or open({marker!r} + str(os.getuid()), 'a').close()"
    )
    root = project({"job.py": "print('worker ran', flush=True)\n", "requirements.txt": ""})
    _wheel(root, code)
    (root / "requirements.txt").write_text("gpuhoppth==1.0\n")
    # No Keras setting: the agent asks the interpreter whether it has tf-keras.
    env = {"PIP_FIND_LINKS": ".", "PIP_NO_INDEX": "1"}
    try:
        with remote(tokens["alice"]) as alice:
            first = alice.submit(
                ["job.py"], workdir=root, env=env, requirements=str(root / "requirements.txt")
            )
            assert first.wait(240).state == JobState.succeeded, b"".join(first.logs()).decode()
            # The environment is built now: a 2-worker job's start probes its interpreter.
            job = alice.submit(
                ["job.py"],
                workdir=root,
                env=env,
                workers=2,
                requirements=str(root / "requirements.txt"),
            )
            info = job.wait(240)
            log = b"".join(job.logs()).decode()
        assert info.state == JobState.succeeded, (info.reason, log)
        assert log.count("worker ran") == 2
    finally:
        ran = list(Path("/var/tmp").glob("gpuhop-pth-ran-as-*"))
        for path in ran:
            path.unlink()
    assert ran == []


CHANGE = r"""
import os
with open("data/a.txt", "a") as f:
    f.write(" and changed")
with open("data/new.txt", "w") as f:
    f.write("new")
os.remove("data/b.txt")
os.rename("data/c.txt", "data/d.txt")
print("changed as", os.getuid(), flush=True)
"""


def test_a_team_job_changes_its_own_tree_in_place_and_the_checkout_stays(
    tls_agent, remote, tokens, project
):
    """A team job sees its tree's shared checkout through an overlay in which the files are
    its own (an idmapped mount of the checkout): it changes, adds, removes and renames
    files of its tree as its own user, what it changed lands in its work dir as its own,
    and the checkout other jobs see stays as it was."""
    root = project(
        {"change.py": CHANGE, "data/a.txt": "stored", "data/b.txt": "b", "data/c.txt": "c"}
    )
    with remote(tokens["alice"]) as alice:
        job = alice.submit(["change.py"], workdir=root)
        info = job.wait(60)
        log = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, (info.reason, log)
    uid = int(log.split("changed as ")[1].split()[0])
    assert uid != 0
    jp = JobPaths(tls_agent.paths.job_dir(job.id))
    # The work dir on the host holds what the job changed, as the job's own: an overlay's
    # upper layer, not a copy of the tree (change.py, unchanged, is not there).
    assert (jp.work / "data" / "a.txt").read_text() == "stored and changed"
    assert (jp.work / "data" / "a.txt").stat().st_uid == uid
    assert (jp.work / "data" / "new.txt").stat().st_uid == uid
    assert not (jp.work / "change.py").exists()
    checkouts = [p for p in (tls_agent.paths.home / "checkouts").rglob("a.txt")]
    assert checkouts and all(p.read_text() == "stored" for p in checkouts)
    assert all(p.stat().st_uid == os.geteuid() for p in checkouts)


# Swaps a dir of its home (holding a file named as the target's) with a link to the target
# dir, as fast as it can, while the agent starts another job of the same user and makes that
# job's dirs and the user's home (shared by all their running jobs) the user's.
SWAPPER = r"""
import ctypes, os, sys
os.chdir(os.environ["HOME"])
os.makedirs("d", exist_ok=True)
open("d/owned.txt", "w").write("mine")
os.symlink(os.environ["TARGET"], "s")
renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
print("swapping", flush=True)
while True:
    renameat2(-100, b"d", -100, b"s", 2)  # AT_FDCWD, RENAME_EXCHANGE
"""


def test_a_job_swapping_links_into_its_home_gets_no_host_file_made_its_own(
    tls_agent, remote, tokens, project, tmp_path
):
    """A job could make any host file its user's (/etc/shadow): the agent, as root, chowned
    the user's home at each of their jobs' starts by path, and a running job of theirs
    that swapped a dir there for a link between the walk's look and its chown had root's
    file chowned through the link. The walk now holds each dir open and follows no link."""
    target = tmp_path / "host"
    target.mkdir()
    (target / "owned.txt").write_text("root's")
    (target / "owned.txt").chmod(0o600)
    root = project({"swap.py": SWAPPER, "hi.py": "print('hi')\n"})
    with remote(tokens["alice"]) as alice:
        swapper = alice.submit(["swap.py"], workdir=root, env={"TARGET": str(target)})
        try:
            wait_until(lambda: b"swapping" in b"".join(swapper.logs()), 60)
            # Each start walks the home while the swaps go on: before, the first one or two
            # did it.
            for _ in range(8):
                info = alice.submit(["hi.py"], workdir=root).wait(60)
                assert info.state == JobState.succeeded, info.reason
                assert (target / "owned.txt").stat().st_uid == os.geteuid()
        finally:
            swapper.cancel(grace=0)
            swapper.wait(60)
    assert (target / "owned.txt").read_text() == "root's"
    # What the job made in its home is still its own, whichever of the two names it has.
    uid = json.loads((tls_agent.paths.home / "identities.json").read_text())["alice"]
    home = tls_agent.paths.home / "users" / str(uid) / "home"
    made = [p for p in (home / "d", home / "s") if not p.is_symlink()]
    assert len(made) == 1 and (made[0] / "owned.txt").stat().st_uid == uid
    shutil.rmtree(made[0])
    next(p for p in (home / "d", home / "s") if p.is_symlink()).unlink()
