"""An ordinary user's own agent: `gpuhop run` typed by a user who is not root, on a host they
share, starts the embedded agent as that user, whose jobs run in a view of their own and
whose `--image` jobs run in a rootless Podman. The rest of the suite runs as root (as CI
does), which takes other paths: the sandbox's user namespace, a memory cgroup the agent may
not write to, Podman's store in the user's home and its uid mapping.

The first user is a uid of this test's own with no passwd entry and no subordinate ids (as
an LDAP user on a cluster often has none); the second an account the test adds with a range of
subordinate ids (as `adduser` gives a workstation's users), whose image jobs Podman runs as
their own uid (keep-id), and removes at the end. Everything runs through `setpriv`, with a
home, runtime dir and state dir in a temp dir that the test makes, gives the uid, and removes.
The venv's interpreter lies in root's home, which another user may not enter, so the user
runs Debian's `python3.11` (the same minor version, whose ABI the venv's packages were
built for) with the venv's packages and this checkout on its path. At the end every
process of the uid (the agent, its leader server, Podman's pause process) is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import gpuhop
from gpuhop.home import AgentPaths
from tests.conftest import missing, wait_until
from tests.images import PYTHON, podman_problem

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")

# A uid no account has (team agents' identities start at 2,000,000,000 and count up).
UID = 3_900_000_000 + os.getpid() % 100_000
# The account's: below 2**31, above which Debian's Podman 4.3 takes a rootless user who has
# subordinate ids for root once in its user namespace ("mkdir /var/lib/containers/storage:
# permission denied"). Its subordinate ids: 65,536 from SUBIDS, below both.
ACCOUNT_UID = 1_900_000_000 + os.getpid() % 100_000
SUBIDS = 1_000_000_000 + os.getpid() % 10_000 * 65_536

PROBE = r"""
import json, os, socket, sys

home = os.environ["AGENT_HOME"]

def attempt(action):
    try:
        action()
    except OSError as e:
        return e.strerror
    return "done"

def connect(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)

def read(path):
    with open(path, "rb") as f:
        f.read(1)

report = {
    "uid": os.getuid(),
    "state_dir": sorted(os.listdir(home)) if os.path.isdir(home) else None,
    "socket": attempt(lambda: connect(os.path.join(home, "agent.sock"))),
    "tokens": attempt(lambda: read(os.path.join(home, "tokens.db"))),
    "jobs_db": attempt(lambda: read(os.path.join(home, "jobs.db"))),
    "home": os.environ["HOME"],
    "home_written": attempt(lambda: open(os.path.join(os.environ["HOME"], "mine"), "w").close()),
}
with open(os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "mine.txt"), "w") as f:
    f.write("mine")
print("REPORT " + json.dumps(report), flush=True)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


@dataclass
class User:
    """The unprivileged user: where their files are, and how to run a command as them."""

    uid: int
    gid: int
    root: Path
    home: Path
    state: Path
    env: dict[str, str]

    def run(self, *argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
        who = [f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
        return subprocess.run(
            ["setpriv", *who, "env", "-i", *(f"{k}={v}" for k, v in self.env.items()), *argv],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def gpuhop(self, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.run(str(PYTHON), "-m", "gpuhop", *args, cwd=cwd, timeout=timeout)

    def project(self, name: str, files: dict[str, str]) -> Path:
        root = self.home / name
        root.mkdir()
        for rel, text in files.items():
            (root / rel).write_text(text)
        _give(root, self.uid, self.gid)
        return root

    def log(self) -> str:
        path = self.state / "agent.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _give(path: Path, uid: int, gid: int) -> None:
    for dirpath, _dirs, files in os.walk(path):
        for name in [".", *files]:
            os.chown(os.path.join(dirpath, name), uid, gid)


def _processes_of(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid and "State:\tZ" not in (entry / "status").read_text():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _kill_all(uid: int) -> None:
    for pid in _processes_of(uid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    wait_until(lambda: not _processes_of(uid), timeout=30)


@contextlib.contextmanager
def _user(uid: int, gid: int) -> Iterator[User]:
    """A user of `uid` and `gid` with a home of their own; at the end, their agent stopped,
    every process of theirs killed and their files removed."""
    if shutil.which("setpriv") is None:
        missing("setpriv is not installed (util-linux)")
    if not PYTHON.is_file():
        missing(f"{PYTHON} is not installed (Debian's python3.11)")
    # Not under pytest's temp root: that is root's alone (0700), and the user must reach it.
    root = Path(tempfile.mkdtemp(prefix="gpuhop-unprivileged-", dir="/var/tmp"))
    home, runtime = root / "home", root / "run"
    home.mkdir()
    runtime.mkdir(mode=0o700)
    _give(root, uid, gid)
    packages = sysconfig.get_paths()["purelib"]
    source = str(Path(gpuhop.__file__).resolve().parents[1])
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(runtime),
        "GPUHOP_HOME": str(home / ".gpuhop"),
        "PYTHONPATH": os.pathsep.join([source, packages]),
        "LANG": "C.UTF-8",
    }
    user = User(uid, gid, root, home, home / ".gpuhop", env)
    try:
        found = user.run(str(PYTHON), "-c", "import gpuhop, fastapi, uvicorn", cwd=home)
        if found.returncode != 0:
            missing(f"another user cannot import gpuhop's packages here: {found.stderr[-500:]}")
        if shutil.which("podman") is not None:
            # A user who has run Podman before: its first rootless run makes the user's
            # store and pause process, and two first runs at once (the agent's start looks
            # at its images) can fail one of them.
            user.run("podman", "info", cwd=home, timeout=120)
        yield user
    finally:
        try:
            with_agent = (user.state / "agent.pid").exists()
            if with_agent:
                user.gpuhop("agent", "stop", cwd=home)
        finally:
            _kill_all(uid)
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    with _user(UID, UID) as made:
        yield made


@pytest.fixture(scope="module")
def account() -> Iterator[User]:
    """A user with an account and subordinate ids, added for this module and removed after."""
    for tool in ("useradd", "userdel", "newuidmap"):
        if shutil.which(tool) is None:
            missing(f"{tool} is not installed (passwd, uidmap)")
    name = f"gpuhop-t{os.getpid()}"
    ids = f"{SUBIDS}-{SUBIDS + 65_535}"
    home = ["--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"]
    added = subprocess.run(
        ["useradd", "--uid", str(ACCOUNT_UID), *home, name], capture_output=True, text=True
    )
    # (useradd warns that the uid is outside UID_MAX, and makes the account)
    assert name in pwd.getpwuid(ACCOUNT_UID).pw_name, added.stderr
    try:
        added = subprocess.run(
            ["usermod", "--add-subuids", ids, "--add-subgids", ids, name],
            capture_output=True,
            text=True,
        )
        assert added.returncode == 0, added.stderr
        with _user(ACCOUNT_UID, pwd.getpwnam(name).pw_gid) as made:
            yield made
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        for path in ("/etc/subuid", "/etc/subgid"):  # userdel leaves them on some versions
            lines = Path(path).read_text().splitlines(keepends=True)
            Path(path).write_text("".join(x for x in lines if not x.startswith(name + ":")))


def user_home(state: Path, uid: int) -> Path:
    """The home a single-user agent (its state dir `state`) gives its image jobs."""
    return AgentPaths(state).user_home(uid)


def report_of(output: str) -> dict:
    line = next(x for x in output.splitlines() if x.startswith("REPORT "))
    return json.loads(line[len("REPORT ") :])


def test_an_ordinary_users_run_starts_their_agent_and_a_job_in_a_view_of_its_own(user):
    work = user.project("plain", {"probe.py": PROBE})
    run = user.gpuhop(
        "run", "--env", "EXIT=3", "--env", f"AGENT_HOME={user.state}", "probe.py", cwd=work
    )
    # The job's own exit code, its output streamed to the user's terminal.
    assert run.returncode == 3, run.stderr
    report = report_of(run.stdout)
    assert report["uid"] == UID
    # Of the state dir, the job sees only its own job's files: no socket, job store or tokens.
    assert report["state_dir"] == ["jobs"], report
    assert report["socket"] != "done" and report["tokens"] != "done", report
    assert report["jobs_db"] != "done", report
    # What it wrote is the user's, in the job's artifacts.
    pid = int((user.state / "agent.pid").read_text())
    assert os.stat(f"/proc/{pid}").st_uid == UID  # the agent runs as the user, not as root
    written = list((user.state / "jobs").glob("*/artifacts/mine.txt"))
    assert len(written) == 1 and written[0].stat().st_uid == UID
    # The leader server forks each job's leader: an unprivileged agent may not make memory
    # cgroups under its own (root's), so it must not ask the server to (every spare failed,
    # and every job's start fell back to a fresh leader, with a warning).
    assert " WARNING " not in user.log() and "Traceback" not in user.log(), user.log()


def _load(user: User, image: str) -> str:
    """`image` (in root's store), loaded into `user`'s own (rootless) Podman store."""
    problem = podman_problem()
    if problem is not None:
        missing(problem)
    archive = user.root / "image.tar"
    subprocess.run(["podman", "save", "-o", str(archive), image], check=True)
    os.chown(archive, user.uid, user.gid)
    loaded = user.run("podman", "load", "-i", str(archive), cwd=user.home, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    archive.unlink()
    return image


@pytest.fixture(scope="module")
def rootless_image(user, minimal_image) -> str:
    """The minimal image, in the user's own (rootless) Podman store."""
    return _load(user, minimal_image)


def test_an_image_job_runs_in_a_rootless_podman_as_the_user(user, rootless_image):
    work = user.project("image", {"probe.py": PROBE, "sleep.py": "import time; time.sleep(600)\n"})
    run = user.gpuhop(
        "run", "--image", rootless_image, "--env", f"AGENT_HOME={user.state}", "probe.py", cwd=work
    )
    assert run.returncode == 0, run.stderr + run.stdout
    report = report_of(run.stdout)
    # The user has no subordinate ids, so Podman maps their uid alone, to the container's
    # root: a root with no capability, which is the user outside.
    assert report["uid"] == 0
    assert report["state_dir"] in (None, ["jobs", "users"]), report
    # Its HOME is the agent's home for the user's image jobs (their caches), which it writes.
    assert report["home"] == str(user_home(user.state, UID)), report
    assert report["home_written"] == "done", report
    assert report["socket"] != "done" and report["tokens"] != "done", report
    written = list((user.state / "jobs").glob("*/artifacts/mine.txt"))
    assert any(p.stat().st_uid == UID for p in written), written
    # A cancelled image job leaves no container in the user's store.
    started = user.gpuhop("run", "--detach", "--image", rootless_image, "sleep.py", cwd=work)
    assert started.returncode == 0, started.stderr
    job = started.stdout.strip()

    def running() -> bool:
        shown = user.gpuhop("show", "--json", job, cwd=work)
        return json.loads(shown.stdout)["state"] == "running"

    wait_until(running, timeout=120)
    cancelled = user.gpuhop("cancel", job, cwd=work)
    assert cancelled.returncode == 0, cancelled.stderr
    ended = user.gpuhop("wait", job, cwd=work, timeout=120)
    assert "cancelled" in ended.stdout + ended.stderr
    left = user.run("podman", "ps", "--all", "--format", "{{.Names}}", cwd=work)
    assert left.returncode == 0 and f"gpuhop-{job}" not in left.stdout, left.stdout
    assert " WARNING " not in user.log() and "Traceback" not in user.log(), user.log()


def test_an_image_job_of_a_user_with_subordinate_ids_runs_as_their_own_uid(account, minimal_image):
    image = _load(account, minimal_image)
    work = account.project("image", {"probe.py": PROBE})
    run = account.gpuhop(
        "run", "--image", image, "--env", f"AGENT_HOME={account.state}", "probe.py", cwd=work
    )
    assert run.returncode == 0, run.stderr + run.stdout
    report = report_of(run.stdout)
    # Podman maps the user's uid to itself (keep-id) and the container's others to the
    # user's subordinate ids: the job is the user inside as outside.
    assert report["uid"] == ACCOUNT_UID, report
    assert report["state_dir"] in (None, ["jobs", "users"]), report
    assert report["home"] == str(user_home(account.state, ACCOUNT_UID)), report
    assert report["home_written"] == "done", report
    assert report["socket"] != "done" and report["tokens"] != "done", report
    written = list((account.state / "jobs").glob("*/artifacts/mine.txt"))
    assert len(written) == 1 and written[0].stat().st_uid == ACCOUNT_UID, written
    assert " WARNING " not in account.log() and "Traceback" not in account.log(), account.log()
