# ruff: noqa: F811 (the fixtures imported from test_tls are parameters here)
"""A job is hostile: on a real team agent (TLS, two users), a job of alice's tries each
escape from its own view of the host and fails, and still has its own files, GPUs and
environment as before.

The job gets the host's real paths from the test (it could guess them: they are the paths
of its own dirs, a few levels up) and reports each attempt as a JSON line in its log.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

from gpuhop.api import JobState
from gpuhop.client.transport.tls import fetch_certificate, pinned_context
from gpuhop.home import JobPaths
from tests.conftest import AGENT_PYTHON_FLAGS, Agent, missing, wait_until
from tests.integration.test_bucket_data import BUCKET, s3  # noqa: F401 (a fixture)
from tests.integration.test_tls import remote, tls_agent, tokens  # noqa: F401 (fixtures)
from tests.integration.test_ui import code_for

ATTACK = r"""
import json, os, signal, socket, sys

targets = json.loads(os.environ["TARGETS"])

def attempt(what, action):
    try:
        action()
    except OSError as e:
        print(json.dumps({"what": what, "escaped": False, "error": e.strerror}), flush=True)
    else:
        print(json.dumps({"what": what, "escaped": True}), flush=True)

def connect(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"GET /v1/jobs HTTP/1.0\r\n\r\n")

def read(path):
    with open(path, "rb") as f:
        f.read(1)

def overwrite(path):
    with open(path, "r+b") as f:
        f.write(b"altered")

for path in targets.get("connect", []):
    attempt(f"connect {path}", lambda: connect(path))
for path in targets.get("read", []):
    attempt(f"read {path}", lambda: read(path))
for path in targets.get("list", []):
    attempt(f"list {path}", lambda: print(json.dumps({"listing": os.listdir(path)})))
for path in targets.get("write", []):
    attempt(f"write {path}", lambda: overwrite(path))
    attempt(f"chmod {path}", lambda: os.chmod(path, 0o644))
    attempt(f"replace {path}", lambda: os.replace(sys.argv[0], path))
    attempt(f"unlink {path}", lambda: os.unlink(path))
for pid in targets.get("kill", []):
    attempt(f"kill {pid}", lambda: os.kill(pid, signal.SIGKILL))

# What the job may still do: its own files, its GPUs' variable, as before.
own = {}
for var in ("GPUHOP_ARTIFACTS_DIR", "GPUHOP_CHECKPOINT_DIR", "GPUHOP_TENSORBOARD_DIR"):
    os.makedirs(os.environ[var], exist_ok=True)
    with open(os.path.join(os.environ[var], "mine.txt"), "w") as f:
        f.write("mine")
    own[var] = os.listdir(os.environ[var])
with open(os.environ["GPUHOP_METRICS_FILE"], "a") as f:
    f.write(json.dumps({"step": 1, "loss": 0.5}) + "\n")
own["work"] = sorted(os.listdir("."))
own["cuda"] = os.environ.get("CUDA_VISIBLE_DEVICES")
print(json.dumps({"own": own}), flush=True)
"""

VICTIM = r"""
import os, pathlib, time
out = pathlib.Path(os.environ["GPUHOP_ARTIFACTS_DIR"])
(out / "secret.txt").write_text("bob's secret")
print("ready", flush=True)
time.sleep(300)
"""


@pytest.fixture
def victim(tls_agent: Agent, remote, tokens, tmp_path: Path):
    """A running job of bob's, with a secret artifact, and the host pid of its script."""
    root = tmp_path / "bob"
    root.mkdir()
    (root / "victim.py").write_text(VICTIM)
    bob = remote(tokens["bob"])
    job = bob.submit(["victim.py"], workdir=root)
    jp = JobPaths(tls_agent.paths.job_dir(job.id))
    wait_until(lambda: jp.log.exists() and b"ready" in jp.log.read_bytes(), 60)
    yield {"job": job, "paths": jp, "pid": script_pid("victim.py"), "source": VICTIM}
    job.cancel(grace=0)
    job.wait(60)


def script_pid(name: str) -> int:
    """The host pid of the one process running the script `name` (not its leader)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if name.encode() in argv and not any(a.endswith(b"leader.py") for a in argv):
            found.append(int(pid))
    assert len(found) == 1, found
    return found[0]


def attack(remote, tokens, project, targets: dict) -> tuple[list[dict], list[list[str]]]:
    """Run the attack as alice; return its attempts and the listings it got."""
    root = project({"attack.py": ATTACK})
    with remote(tokens["alice"]) as alice:
        env = {"TARGETS": json.dumps(targets)}
        job = alice.submit(["attack.py"], workdir=root, gpus=1, env=env)
        info = job.wait(120)
        log = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    # What it may still do: its own files, its GPU's variable, as before.
    own = next(line["own"] for line in lines if "own" in line)
    assert own["cuda"] == "0"
    assert own["work"] == ["attack.py"]
    for var in ("GPUHOP_ARTIFACTS_DIR", "GPUHOP_CHECKPOINT_DIR", "GPUHOP_TENSORBOARD_DIR"):
        assert "mine.txt" in own[var]
    assert info.latest_metrics == {"step": 1, "loss": 0.5}
    attempts = [line for line in lines if "what" in line]
    return attempts, [line["listing"] for line in lines if "listing" in line]


def escaped(attempts: list[dict]) -> list[str]:
    assert attempts
    return [a["what"] for a in attempts if a["escaped"]]


def test_a_job_cannot_reach_the_agents_socket(tls_agent, remote, tokens, project):
    home = tls_agent.paths.home
    agent_pid = int(tls_agent.paths.pidfile.read_text())
    targets = {"connect": [str(home / "agent.sock"), f"/proc/{agent_pid}/root{home}/agent.sock"]}
    attempts, _ = attack(remote, tokens, project, targets)
    assert len(attempts) == 2 and escaped(attempts) == []


def test_a_job_sees_nothing_else_of_the_state_dir(tls_agent, victim, remote, tokens, project):
    home = tls_agent.paths.home
    targets = {"list": [str(home), str(home / "jobs"), str(home / "users")]}
    _, listings = attack(remote, tokens, project, targets)
    # Its own job's dir, and its own user's home (which holds its caches).
    assert sorted(listings[0]) == ["jobs", "users"]
    assert len(listings[1]) == 1 and listings[1] != [victim["job"].id]
    alice = json.loads((home / "identities.json").read_text())["alice"]
    assert listings[2] == [str(alice)]


def test_a_job_cannot_read_the_tls_key_tokens_or_job_store(tls_agent, remote, tokens, project):
    home = tls_agent.paths.home
    secrets = [home / "tokens.db", home / "jobs.db", home / "claims.db", *home.glob("tls/*")]
    assert len(secrets) >= 5 and all(p.is_file() for p in secrets)
    attempts, _ = attack(remote, tokens, project, {"read": [str(p) for p in secrets]})
    assert len(attempts) == len(secrets)
    assert escaped(attempts) == []


# Prints what it reads of its bucket's data.
FETCHED = """\
import os
print(open(os.path.join(os.environ["GPUHOP_DATA"], "other", "x.txt")).read(), flush=True)
"""


def test_a_job_cannot_read_the_secret_store_or_another_users_object_cache(
    tls_agent, remote, tokens, project, s3, tmp_path
):
    """Bob fetches a bucket's prefix with his own secrets (moto's server: test_bucket_data);
    a job of Alice's can read neither his secrets' store nor his cached objects, their index,
    or his view of them, by any path of the host."""
    home = tls_agent.paths.home
    root = tmp_path / "bob"
    root.mkdir()
    (root / "read.py").write_text(FETCHED)
    keys = {
        "AWS_ACCESS_KEY_ID": s3.key_id,
        "AWS_SECRET_ACCESS_KEY": s3.secret,
        "AWS_ENDPOINT_URL": s3.url,
    }
    with remote(tokens["bob"]) as bob:
        for name, value in keys.items():
            bob.set_secret(name, value)
        try:
            job = bob.submit(["read.py"], workdir=root, data=[f"s3://{BUCKET}/other"])
            info = job.wait(60)
            assert info.end_class == "succeeded", info.reason
            assert b"elsewhere" in b"".join(job.logs())
        finally:
            for name in keys:
                bob.remove_secret(name)
    cached = [p for p in home.glob("objects/*/*/**/*") if p.is_file()]
    assert [p.read_bytes() for p in cached if p.name == "x.txt"] == [b"elsewhere\n"]
    stores = [tls_agent.paths.secrets_db, home / "objects.db"]
    assert all(p.is_file() for p in [*stores, *cached]) and len(cached) >= 2
    targets = {
        "read": [str(p) for p in [*stores, *cached]],
        "list": [
            str(home / "objects"),
            str(home / "secrets"),
            *map(str, {p.parent for p in cached}),
        ],
    }
    attempts, listings = attack(remote, tokens, project, targets)
    assert len(attempts) == len(targets["read"]) + len(targets["list"])
    assert escaped(attempts) == [] and listings == []


def test_a_job_cannot_read_other_users_work_dirs_or_artifacts(
    victim,
    remote,
    tokens,
    project,
):
    jp = victim["paths"]
    targets = {
        "read": [str(jp.artifacts / "secret.txt"), str(jp.work / "victim.py"), str(jp.log)],
        "list": [str(jp.work), str(jp.artifacts), str(jp.root)],
    }
    attempts, _ = attack(remote, tokens, project, targets)
    assert len(attempts) == 6 and escaped(attempts) == []
    assert (jp.artifacts / "secret.txt").read_text() == "bob's secret"


def test_a_job_cannot_overwrite_a_stored_blob(tls_agent, victim, remote, tokens, project):
    digest = hashlib.sha256(victim["source"].encode()).hexdigest()
    blob = tls_agent.paths.blobs / digest[:2] / digest
    assert blob.read_text() == victim["source"]
    attempts, _ = attack(remote, tokens, project, {"write": [str(blob)]})
    assert len(attempts) == 4 and escaped(attempts) == []
    assert blob.read_text() == victim["source"]
    assert oct(blob.stat().st_mode & 0o777) == oct(0o444)


def test_a_job_cannot_signal_other_users_processes_or_the_agent(
    tls_agent,
    victim,
    remote,
    tokens,
    project,
):
    agent_pid = int(tls_agent.paths.pidfile.read_text())
    bob_pid = victim["pid"]
    attempts, _ = attack(remote, tokens, project, {"kill": [bob_pid, agent_pid]})
    assert escaped(attempts) == []
    os.kill(bob_pid, 0)  # still there
    os.kill(agent_pid, 0)
    assert victim["job"].refresh().state == JobState.running


@pytest.fixture
def no_namespace_agent(tmp_path: Path):
    """A real agent on a host that allows jobs no namespaces: it runs in a user namespace
    whose limit of PID namespaces is 0 (as a locked-down container would be)."""
    if shutil.which("unshare") is None:
        missing("unshare(1) is not installed (util-linux)")
    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    agent.paths.ensure()
    deny = 'echo 0 > /proc/sys/user/max_pid_namespaces && exec "$@"'
    cmd = ["unshare", "--user", "--map-root-user", "sh", "-c", deny, "sh"]
    cmd += [sys.executable, *AGENT_PYTHON_FLAGS, "-m", "gpuhop.agent", "--home", str(agent.home)]
    # Its output where the agent's own start puts it, so that what it logs is read too.
    log = agent.paths.logfile.open("ab")
    proc = subprocess.Popen(cmd, env=agent.env, stdout=log, stderr=subprocess.STDOUT)
    agent.pid = proc.pid
    try:
        wait_until(lambda: proc.poll() is not None or agent.paths.socket.exists(), 60)
        if proc.poll() is not None:
            pytest.skip(f"cannot deny namespaces here: {agent.paths.logfile.read_text()}")
        agent.watched()
        yield agent
    finally:
        agent.shutdown()
        proc.wait(30)
        log.close()


def test_without_namespaces_a_single_user_agent_runs_jobs_and_a_team_agent_none(
    no_namespace_agent, project
):
    root = project({"job.py": "print('ran')\n"})
    with no_namespace_agent.client() as owner:
        assert owner.submit(["job.py"], workdir=root).wait(60).state == JobState.succeeded
        owner.create_token("alice")
        owner.create_token("bob")  # two users: a team agent now
        refused = owner.submit(["job.py"], workdir=root).wait(60)
    assert refused.state == JobState.failed
    assert "serves a team" in refused.reason
    assert "allow unprivileged user namespaces" in refused.reason
    assert "No space left on device" in refused.reason  # the host's own answer


# Swaps, as fast as it can, a file of its artifacts with a link to `TARGET` (a file of the
# host) and a dir of them with a link to the dir that holds it, while its owner downloads.
SWAPPER = r"""
import ctypes, os
os.chdir(os.environ["GPUHOP_ARTIFACTS_DIR"])
target = os.environ["TARGET"]
open("kept.txt", "w").write("kept")
open("f", "w").write("harmless")
os.symlink(target, "l")
os.makedirs("d")
open(os.path.join("d", os.path.basename(target)), "w").write("harmless")
os.symlink(os.path.dirname(target), "e")
renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
print("swapping", flush=True)
while True:
    renameat2(-100, b"f", -100, b"l", 2)  # AT_FDCWD, RENAME_EXCHANGE
    renameat2(-100, b"d", -100, b"e", 2)
"""


def test_a_running_job_swapping_links_into_its_artifacts_gets_no_host_file_sent(
    tls_agent, remote, tokens, project
):
    """A job could read any host file as the agent (root) read it: the agent checked an
    artifact's path for links, then opened it by path, and a running job that swapped the
    file or a dir on its path for a link in between had its owner sent the agent's
    tokens.db. Downloads, the dashboard's zip and the listing now read only what was opened
    as a regular file under the artifacts dir, never through a link."""
    target = tls_agent.paths.home / "tokens.db"
    secret = target.read_bytes()
    root = project({"swap.py": SWAPPER})
    pem, _ = fetch_certificate(tls_agent.listener.url)
    with (
        remote(tokens["alice"]) as alice,
        httpx.Client(
            base_url=tls_agent.listener.url,
            verify=pinned_context(pem),
            headers={"Authorization": f"Bearer {tokens['alice']}"},
            timeout=30,
        ) as http,
    ):
        job = alice.submit(["swap.py"], workdir=root, env={"TARGET": str(target)})
        try:
            wait_until(lambda: b"swapping" in b"".join(job.logs()), 60)
            # A dashboard session: its cookie rides in the client's jar from here on.
            assert http.get("/ui/login", params={"code": code_for(http)}).status_code == 303
            sent, said = [], set()
            for _ in range(100):
                for name in ("f", "l", f"d/{target.name}", f"e/{target.name}"):
                    for route in ("/v1/jobs", "/ui/api/jobs"):
                        r = http.get(f"{route}/{job.id}/artifacts/{name}")
                        said.add(r.status_code)
                        sent.append(r.content)
                listed = {a["path"] for a in http.get(f"/v1/jobs/{job.id}/artifacts").json()}
                assert listed <= {"kept.txt", "f", "l", f"d/{target.name}", f"e/{target.name}"}
                # What never moves comes back whole, each time.
                assert http.get(f"/v1/jobs/{job.id}/artifacts/kept.txt").content == b"kept"
            for _ in range(20):
                r = http.get(f"/ui/api/jobs/{job.id}/archive")
                assert r.status_code == 200, r.text
                with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
                    sent += [zf.read(n) for n in zf.namelist()]
                    assert zf.read("kept.txt") == b"kept"
        finally:
            job.cancel(grace=0)
            job.wait(60)
    assert 200 in said and said <= {200, 400, 404}, said
    assert not [s for s in sent if secret[:16] in s or s == secret]
    assert set(sent) <= {b"harmless", b"kept"} | {s for s in sent if s.startswith(b"{")}
