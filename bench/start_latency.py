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
import tempfile
from pathlib import Path

from harness import PYTHON, Row, Settings, private_agent, time_first_line
from remotes import Remote, remote_host, ssh_remote, ssh_unavailable

NAME = "start_latency"
SYNC_SSH = "rsync -az + ssh"
BARE_SSH = "ssh host python hello.py"


def hand_written(lab: Remote, project: Path, remote: Path) -> dict[str, list[str]]:
    assert lab.server is not None
    ssh = f"ssh -F {shlex.quote(str(lab.server.ssh_config))}"
    host = remote_host(lab)
    there = f"cd {shlex.quote(str(remote))} && {shlex.quote(PYTHON)} hello.py"
    script = (
        f"rsync -az -e {shlex.quote(ssh)} {shlex.quote(f'{project}/')}"
        f" {shlex.quote(f'{host}:{remote}/')} && {ssh} {host} {shlex.quote(there)}"
    )
    bare = f"{ssh} {host} {shlex.quote(f'cd {remote} && {PYTHON} hello.py')}"
    return {"sync+ssh": ["sh", "-c", script], "bare ssh": ["sh", "-c", bare]}


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=5, quick=3)
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / "hello.py").write_text('print("hello")\n')
        with contextlib.ExitStack() as stack:
            agent = stack.enter_context(private_agent(root / "agent"))
            commands = {
                "gpuhop": [PYTHON, "-m", "gpuhop", "run", "--on", "local", "hello.py"],
                "python": [PYTHON, "hello.py"],
            }
            env = dict(agent.env)
            if ssh_unavailable() is None:
                lab = stack.enter_context(ssh_remote(root / "ssh", agent.env))
                env = lab.env
                commands["gpuhop ssh"] = [PYTHON, "-m", "gpuhop", "run", "--on", "lab", "hello.py"]
                commands.update(hand_written(lab, project, root / "remote"))
            for argv in commands.values():  # warm up: first sync, page cache, connection
                time_first_line(argv, project, env)
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
            for _ in range(repeats):
                for name, argv in commands.items():
                    samples[name].append(time_first_line(argv, project, env))

    def column(name: str, index: int) -> list[float] | None:
        return [sample[index] for sample in samples[name]] if name in samples else None

    skipped = f"skipped: {ssh_unavailable()}"
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
