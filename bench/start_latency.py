"""Start latency: from launching a hello-world script to its first stdout line, and to its exit.

`gpuhop run hello.py` against a warm local agent, next to plain `python hello.py` (the floor)
and the hand-written `rsync -az DIR host:DIR && ssh host 'cd DIR && python hello.py'`; and
`gpuhop run --on REMOTE hello.py` over SSH with a warm connection, next to that same
hand-written workflow and to a bare `ssh host python hello.py`. The "host" is this machine:
a private sshd on a loopback port, started here and stopped afterwards.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness import PYTHON, REPO, Row, Settings, private_agent, run_checked, time_first_line

from gpuhop.client.embedded import stop
from gpuhop.home import AgentPaths

sys.path.insert(0, str(REPO))
from tests import sshd  # the test suite's loopback sshd

NAME = "start_latency"
SYNC_SSH = "rsync -az + ssh"
BARE_SSH = "ssh host python hello.py"


@contextlib.contextmanager
def loopback_sshd(root: Path) -> Iterator[sshd.Sshd | None]:
    """A private sshd on loopback whose logins use `root/remote-home` as GPUHOP_HOME."""
    if sshd.available() is not None or shutil.which("rsync") is None:
        yield None
        return
    server = sshd.Sshd(
        root / "sshd",
        remote_env={"GPUHOP_HOME": str(root / "remote-home"), "TF_CPP_MIN_LOG_LEVEL": "2"},
    ).start()
    try:
        yield server
    finally:
        server.stop()


def hand_written(server: sshd.Sshd, project: Path, remote: Path) -> dict[str, list[str]]:
    ssh = f"ssh -F {shlex.quote(str(server.ssh_config))}"
    there = f"cd {shlex.quote(str(remote))} && {shlex.quote(PYTHON)} hello.py"
    script = (
        f"rsync -az -e {shlex.quote(ssh)} {shlex.quote(f'{project}/')}"
        f" {shlex.quote(f'{sshd.ALIAS}:{remote}/')} && {ssh} {sshd.ALIAS} {shlex.quote(there)}"
    )
    bare = f"{ssh} {sshd.ALIAS} {shlex.quote(f'cd {remote} && {PYTHON} hello.py')}"
    return {"sync+ssh": ["sh", "-c", script], "bare ssh": ["sh", "-c", bare]}


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=5, quick=3)
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / "hello.py").write_text('print("hello")\n')
        with private_agent(root / "agent") as agent, loopback_sshd(root) as server:
            commands = {
                "gpuhop": [PYTHON, "-m", "gpuhop", "run", "hello.py"],
                "python": [PYTHON, "hello.py"],
            }
            env = dict(agent.env)
            if server is not None:
                env.update(server.client_env, GPUHOP_CONFIG_DIR=str(root / "config"))
                run_checked([PYTHON, "-m", "gpuhop", "remote", "add", "lab", server.url(),
                             "--python", PYTHON], env=env)  # fmt: skip
                run_checked([PYTHON, "-m", "gpuhop", "remote", "bootstrap", "lab"], env=env)
                commands["gpuhop ssh"] = [PYTHON, "-m", "gpuhop", "run", "--on", "lab", "hello.py"]
                commands.update(hand_written(server, project, root / "remote"))
                # The local rows stay local: `remote add` made lab the default.
                commands["gpuhop"][4:4] = ["--on", "local"]
            try:
                for argv in commands.values():  # warm up: first sync, page cache, connection
                    time_first_line(argv, project, env)
                samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
                for _ in range(repeats):
                    for name, argv in commands.items():
                        samples[name].append(time_first_line(argv, project, env))
            finally:
                if server is not None:
                    run_checked([PYTHON, "-m", "gpuhop", "remote", "disconnect", "lab"], env=env)
                    stop(AgentPaths(root / "remote-home"))

    def column(name: str, index: int) -> list[float] | None:
        return [sample[index] for sample in samples[name]] if name in samples else None

    skipped = "skipped: needs sshd (scripts/setup-system) and rsync"
    rows = []
    for index, what in enumerate(("launch → first stdout line", "launch → exit")):
        local, over_ssh = column("gpuhop", index) or [], column("gpuhop ssh", index)
        note = "" if over_ssh is not None else skipped
        rows += [
            Row(NAME, f"hello.py: {what}", "s", local, "python hello.py",
                column("python", index), "the floor"),
            Row(NAME, f"hello.py: {what}", "s", local, SYNC_SSH,
                column("sync+ssh", index), note or "same machine over loopback ssh"),
            Row(NAME, f"hello.py over ssh: {what}", "s", over_ssh or [], SYNC_SSH,
                column("sync+ssh", index), note or "gpuhop with a warm connection"),
            Row(NAME, f"hello.py over ssh: {what}", "s", over_ssh or [], BARE_SSH,
                column("bare ssh", index), note or "no sync at all; a new login each time"),
        ]  # fmt: skip
    return rows
