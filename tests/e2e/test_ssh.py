"""The SSH transport end to end: a real sshd on loopback, `gpuhop remote bootstrap` through
it, then jobs run with `--on`, as a user does it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuhop.client import Client, GpuhopError
from gpuhop.client.embedded import stop
from gpuhop.home import AgentPaths, read_pid
from tests import sshd
from tests.conftest import AGENT_FLAGS_ENV, EXAMPLES, Agent, missing, wait_until
from tests.integration.test_forward import PAGE, SERVERS, echo_through, start_servers
from tests.integration.test_ui import raw

if (no_sshd := sshd.available()) is not None:
    missing(no_sshd)


@dataclass
class Side:
    """The user's machine (config, cache) and, through sshd, the 'remote' one (its home)."""

    server: sshd.Sshd
    root: Path

    @property
    def remote_home(self) -> Path:
        return self.root / "remote-home"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHOP_")}
        env.update(
            GPUHOP_CONFIG_DIR=str(self.root / "config"),
            GPUHOP_CACHE_DIR=str(self.root / "cache"),
            GPUHOP_HOME=str(self.root / "local-home"),
            TF_CPP_MIN_LOG_LEVEL="2",
            **AGENT_FLAGS_ENV,
            **self.server.client_env,
        )
        return env

    def cli(
        self, *args: str, cwd: Path | None = None, timeout: float = 300, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuhop", *args],
            cwd=cwd,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def drop_connections(self) -> None:
        """Kill every master connection as a network drop would (no clean `-O exit`)."""
        for control in self.server.runtime.glob("cm-*"):
            check = subprocess.run(
                ["ssh", "-F", str(self.server.ssh_config), "-o", f"ControlPath={control}",
                 "-O", "check", sshd.ALIAS],
                capture_output=True, text=True, timeout=10,
            )  # fmt: skip
            if found := re.search(r"pid=(\d+)", check.stderr):
                pid = int(found.group(1))
                os.kill(pid, signal.SIGKILL)
                # Gone, not only signalled: a master still dying (a busy machine) would
                # take the next request and then reset it, as no dropped network does.
                wait_until(lambda pid=pid: _dead(pid))

    def logins(self) -> int:
        """How many SSH logins the server has accepted so far."""
        return (self.server.root / "sshd.log").read_text().count("Accepted publickey")


def _dead(pid: int) -> bool:
    """Whether process `pid` has exited (a zombie has: its sockets are closed)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Side]:
    root = Path(tmp_path_factory.mktemp("ssh"))
    remote_home = root / "remote-home"
    server = sshd.Sshd(
        root / "sshd",
        remote_env={
            "GPUHOP_HOME": str(remote_home),
            "GPUHOP_CACHE_DIR": str(root / "remote-cache"),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            # The host cannot reach a package index: bootstrap must not need one.
            "PIP_NO_INDEX": "1",
            **AGENT_FLAGS_ENV,
        },
    ).start()
    s = Side(server, root)
    # The agents the commands start (the remote's, by bootstrap; the local one `--on local`
    # starts): their logs are read after every test, as a test's own agents' are.
    agents = [
        Agent(remote_home, root / "remote-cache", None).watched(),
        Agent(root / "local-home", root / "cache", None).watched(),
    ]
    try:
        yield s
    finally:
        with contextlib.ExitStack() as stopping:  # each stops, whichever one's log fails
            stopping.callback(server.stop)  # last
            for agent in agents:  # with their jobs
                stopping.callback(agent.shutdown)


@pytest.fixture(scope="module")
def lab(side: Side) -> Side:
    """A remote 'lab' over ssh, bootstrapped."""
    added = side.cli("remote", "add", "lab", side.server.url(), "--python", sys.executable)
    assert added.returncode == 0, added.stderr
    boot = side.cli("remote", "bootstrap", "lab")
    assert boot.returncode == 0, boot.stderr
    assert "gpuhop installed on 'lab'" in boot.stderr
    assert "agent started" in boot.stderr
    return side


def test_bootstrap_reports_the_host_and_is_idempotent(lab: Side) -> None:
    venv = lab.remote_home / "gpuhop-venv"
    stamp = (venv / "gpuhop-stamp").stat()
    pid = read_pid(AgentPaths(lab.remote_home))
    assert pid is not None

    again = lab.cli("remote", "bootstrap", "lab")

    assert again.returncode == 0, again.stderr
    assert "already up to date" in again.stderr
    assert "agent running" in again.stderr
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in again.stderr
    assert "TensorFlow: 2." in again.stderr  # the host's TensorFlow, seen through the venv
    assert "GPUs: none" in again.stderr
    # Nothing changed on the host: same install, same agent.
    assert (venv / "gpuhop-stamp").stat().st_mtime_ns == stamp.st_mtime_ns
    assert read_pid(AgentPaths(lab.remote_home)) == pid
    # The agent runs from the venv bootstrap made, with this very version.
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[0].decode().startswith(str(venv))


def test_remote_test_reports_the_agent(lab: Side) -> None:
    result = lab.cli("remote", "test", "lab")
    assert result.returncode == 0, result.stderr
    assert "remote 'lab' answers: gpuhop" in result.stderr
    assert "GPUs: none" in result.stderr


def test_a_warm_connection_needs_no_new_login(lab: Side) -> None:
    first = lab.cli("ps", "--on", "lab")
    assert first.returncode == 0, first.stderr
    logins = lab.logins()

    for _ in range(3):
        again = lab.cli("ps", "--on", "lab")
        assert again.returncode == 0, again.stderr

    assert lab.logins() == logins


@pytest.mark.tf
def test_digits_train_over_ssh_end_to_end(lab: Side, tmp_path: Path) -> None:
    out = tmp_path / "pulled"
    run = lab.cli(
        "run", "--on", "lab", "--pull", str(out), "train.py", "--epochs", "2",
        cwd=EXAMPLES / "digits",
    )  # fmt: skip

    assert run.returncode == 0, run.stdout + run.stderr
    assert "test accuracy" in run.stdout.lower()
    assert "succeeded" in run.stderr
    assert any(out.rglob("saved_model.pb")), sorted(p.name for p in out.rglob("*"))
    # The job ran on the remote side's agent.
    assert any((lab.remote_home / "jobs").glob("*/output.log"))


def test_the_default_remote_and_env_select_the_host(lab: Side, project) -> None:
    root = project({"hello.py": "import os; print('home', os.environ['GPUHOP_JOB_ID'])"})
    via_env = lab.cli("run", "-q", "hello.py", cwd=root, GPUHOP_REMOTE="lab")
    assert via_env.returncode == 0, via_env.stderr
    job_id = via_env.stdout.split()[-1]
    assert (lab.remote_home / "jobs" / job_id).is_dir()

    # `remote add` made 'lab' the default (it was the first); 'local' overrides it.
    by_default = lab.cli("show", job_id, "--json")
    assert by_default.returncode == 0, by_default.stderr
    local = lab.cli("show", job_id, "--on", "local")
    assert local.returncode != 0
    assert "no job" in local.stderr


def test_unknown_host_key_is_refused(lab: Side) -> None:
    lab.cli("remote", "add", "unknown", lab.server.url(f"{sshd.ALIAS}-unknown-key"))
    result = lab.cli("ps", "--on", "unknown")
    assert result.returncode != 0
    assert "host key" in result.stderr and "not known" in result.stderr
    assert "never accepts one silently" in result.stderr
    # The way to check it, pasted, uses the ssh command gpuhop is configured with.
    tested = lab.cli("remote", "test", "unknown")
    assert tested.returncode != 0
    login = f"ssh -F {lab.server.ssh_config} {sshd.ALIAS}-unknown-key"
    assert f"add it by connecting once yourself: {login}" in tested.stderr.replace("\n", " ")


def test_changed_host_key_is_refused_loudly(lab: Side) -> None:
    lab.cli("remote", "add", "changed", lab.server.url(f"{sshd.ALIAS}-changed-key"))
    result = lab.cli("ps", "--on", "changed")
    assert result.returncode != 0
    assert "host key" in result.stderr and "CHANGED" in result.stderr
    assert "will not connect" in result.stderr


def test_refused_key_says_so(lab: Side) -> None:
    lab.cli("remote", "add", "stranger", lab.server.url(f"{sshd.ALIAS}-stranger"))
    result = lab.cli("ps", "--on", "stranger")
    assert result.returncode != 0
    assert "refused the login" in result.stderr


def test_unreachable_host_says_so(lab: Side) -> None:
    lab.cli("remote", "add", "closed", lab.server.url(f"{sshd.ALIAS}-closed"))
    result = lab.cli("ps", "--on", "closed")
    assert result.returncode != 0
    assert "cannot reach remote 'closed'" in result.stderr
    assert "Connection refused" in result.stderr


def test_a_host_name_that_does_not_resolve_says_what_to_do(lab: Side) -> None:
    # It said only "cannot resolve the host name of remote 'typo' (...)".
    lab.cli("remote", "add", "typo", "ssh://me@no-such-host.invalid")
    result = lab.cli("ps", "--on", "typo")
    assert result.returncode == 2
    # The login to try is the user's ssh as configured (here the test's -F CONFIG).
    said, login = result.stderr.split("`")[:2]
    assert said == (
        "gpuhop: error: cannot resolve the host name of remote 'typo' (no-such-host.invalid):"
        " check the name ("
    )
    assert login.startswith("ssh ") and login.endswith(" me@no-such-host.invalid")
    assert result.stderr.endswith(
        " must connect; a host alias goes in ~/.ssh/config), or give the remote another"
        " with `gpuhop remote add typo ssh://USER@HOST --replace`\n"
    )


def test_no_python_on_the_host(lab: Side) -> None:
    result = lab.cli("remote", "bootstrap", "lab", "--python", "/nonexistent/python3")
    assert result.returncode != 0
    assert "no Python at '/nonexistent/python3'" in result.stderr
    # Nothing was harmed: the agent still answers.
    assert lab.cli("ps", "--on", "lab").returncode == 0


def test_agent_not_running_then_bootstrap_starts_it(lab: Side) -> None:
    paths = AgentPaths(lab.remote_home)
    assert stop(paths, timeout=10) is not None

    down = lab.cli("ps", "--on", "lab")
    assert down.returncode != 0
    assert "the gpuhop agent on remote 'lab' is not running" in down.stderr
    assert "gpuhop remote bootstrap lab" in down.stderr

    boot = lab.cli("remote", "bootstrap", "lab")
    assert boot.returncode == 0, boot.stderr
    assert "agent started" in boot.stderr
    assert lab.cli("ps", "--on", "lab").returncode == 0


def test_remote_config_commands(lab: Side) -> None:
    listed = lab.cli("remote", "ls", "--json")
    assert listed.returncode == 0
    names = {r["name"]: r for r in json.loads(listed.stdout)}
    assert names["lab"]["default"] is True
    config = lab.root / "config" / "remotes.json"
    assert config.stat().st_mode & 0o777 == 0o600

    dup = lab.cli("remote", "add", "lab", "ssh://elsewhere")
    assert dup.returncode != 0 and "exists" in dup.stderr
    bad = lab.cli("remote", "add", "x", "ftp://host")
    assert bad.returncode != 0 and "ssh://" in bad.stderr
    unknown = lab.cli("ps", "--on", "nope")
    assert unknown.returncode != 0 and "no remote named 'nope'" in unknown.stderr
    assert json.loads(config.read_text())["remotes"]["lab"]["url"] == lab.server.url()


def _use_lab(lab: Side, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's SDK pointed at `lab`."""
    for key, value in lab.env.items():
        if key.startswith("GPUHOP_"):
            monkeypatch.setenv(key, value)


def _servers_project(lab: Side, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """test_forward's servers as a project, and this process's SDK pointed at `lab`."""
    _use_lab(lab, monkeypatch)
    root = tmp_path / "servers"
    (root / "www").mkdir(parents=True)
    (root / "servers.py").write_text(SERVERS)
    (root / "www" / "index.html").write_text(PAGE)
    return root


def test_a_port_forwards_through_the_ssh_tunnel(
    lab: Side, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = _servers_project(lab, monkeypatch, tmp_path)
    with Client(remote="lab") as client:
        job, _, echo_port = start_servers(client, root)
        try:
            with job.forward(echo_port) as fwd:
                payload = os.urandom(1 << 20)
                assert echo_through(("127.0.0.1", fwd.local_port), payload) == payload
        finally:
            job.cancel(grace=0)
    assert (lab.remote_home / "jobs" / job.id).is_dir()


def test_logs_follow_survives_a_dropped_ssh_connection(lab: Side, project) -> None:
    # `logs -f` said it would resume a dropped connection, yet waited 30 s on the local
    # socket of a master that was gone, and failed as if the agent had been lost.
    root = project(
        {"slow.py": "import time\nprint('before', flush=True)\ntime.sleep(5)\nprint('after')\n"}
    )
    started = lab.cli("run", "--on", "lab", "-d", "slow.py", cwd=root)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    log = lab.remote_home / "jobs" / job_id / "output.log"
    follow = subprocess.Popen(
        [sys.executable, "-m", "gpuhop", "logs", "-f", "--on", "lab", job_id],
        env=lab.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (log.exists() and "before" in log.read_text()):
            assert time.monotonic() < deadline, "the job printed nothing"
            time.sleep(0.05)
        time.sleep(0.5)  # `logs -f` has it, and waits for more

        lab.drop_connections()

        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    assert out.split() == ["before", "after"]  # nothing lost, nothing twice


def test_a_forward_survives_a_dropped_ssh_connection(
    lab: Side, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A forward refused every connection after the master connection dropped.
    servers = _servers_project(lab, monkeypatch, tmp_path)
    with Client(remote="lab") as client:
        job, _, echo_port = start_servers(client, servers)
        try:
            with job.forward(echo_port) as fwd:
                assert echo_through(("127.0.0.1", fwd.local_port), b"one") == b"one"
                lab.drop_connections()
                # The forward's next connection opens the tunnel again.
                assert echo_through(("127.0.0.1", fwd.local_port), b"two") == b"two"
        finally:
            job.cancel(grace=0)


def test_a_long_lived_client_reopens_a_dropped_ssh_connection(
    lab: Side, project, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An SDK Client kept open across a network drop failed its next plain request with
    # "lost the ssh connection ... Connection refused": only `logs -f` and forwards reopened.
    _use_lab(lab, monkeypatch)
    root = project({"sleepy.py": "import time\ntime.sleep(60)\n"})
    with Client(remote="lab") as client:
        job = client.submit(["sleepy.py"], workdir=root)
        lab.drop_connections()

        assert client.job(job.id).id == job.id  # a GET
        # Dropped again at once: a reopen that worked holds the next one back no while.
        lab.drop_connections()
        job.cancel(grace=0)  # a POST
        assert job.wait(timeout=60).state == "cancelled"


def test_the_dashboard_proxy_reopens_a_dropped_ssh_connection(
    lab: Side, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `gpuhop ui --on lab` answered every page with 502 "lost the ssh connection" after a
    # network drop, until restarted.
    _use_lab(lab, monkeypatch)
    with Client(remote="lab") as client, client.dashboard() as dashboard:
        # 401: the agent's own answer (no login), so the request went through.
        assert raw(dashboard.port, "GET", "/ui/api/jobs")[0] == 401
        lab.drop_connections()
        assert raw(dashboard.port, "GET", "/ui/api/jobs")[0] == 401


def test_a_dropped_ssh_connection_that_cannot_be_reopened_says_why(
    lab: Side, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It said only "lost the ssh connection ... Connection refused", not why ssh could
    # not connect again.
    _use_lab(lab, monkeypatch)
    with Client(remote="lab") as client:
        client.jobs()
        lab.drop_connections()
        # And the host cannot be reached now: ssh gets no answer.
        ssh = os.environ["GPUHOP_SSH_COMMAND"]
        monkeypatch.setenv("GPUHOP_SSH_COMMAND", f"{ssh} -o ProxyCommand=false")
        with pytest.raises(GpuhopError) as failed:
            client.jobs()
    message = failed.value.message
    assert message.startswith("lost the ssh connection to remote 'lab'"), message
    # Then ssh's failure, in the words of any ssh error (its own text varies with timing).
    reopen = message.partition("; opening it again failed: ")[2]
    assert "ssh" in reopen and "remote 'lab'" in reopen, message


def test_ctrl_c_names_the_remote_in_its_hints(lab: Side, project) -> None:
    # Detached from a job on a remote chosen with --on, the hints said `gpuhop logs -f ID`:
    # with another default (this machine, say), that answered "no job matches".
    root = project({"sleepy.py": "import time\nprint('up', flush=True)\ntime.sleep(60)\n"})
    started = lab.cli("run", "--on", "lab", "-d", "sleepy.py", cwd=root)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    follow = subprocess.Popen(
        [sys.executable, "-m", "gpuhop", "logs", "-f", "--on", "lab", job_id],
        env=lab.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == "up\n"
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=30)
    finally:
        follow.kill()
    assert follow.returncode == 130, err
    assert f"re-attach: gpuhop logs -f --on lab {job_id}" in err
    assert f"stop it:   gpuhop cancel --on lab {job_id}" in err
    # The hint, as printed, reaches the job from where the default is this machine.
    cancel = lab.cli("cancel", "--on", "lab", job_id, GPUHOP_REMOTE="local")
    assert cancel.returncode == 0, cancel.stderr
