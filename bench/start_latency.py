"""Start latency: from launching a hello-world script to its first stdout line, and to its exit.

`gpuhop run hello.py` against a warm local agent, next to plain `python hello.py` (the floor)
and, where rsync is installed and an sshd answers on localhost without a password, the
hand-written `rsync -az DIR localhost:DIR && ssh localhost 'cd DIR && python hello.py'`.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness import PYTHON, Row, Settings, private_agent, time_first_line

NAME = "start_latency"
SSH_NAME = "rsync -az + ssh localhost"


def ssh_workflow(project: Path, remote: Path) -> tuple[list[str] | None, str]:
    """The rsync + ssh command line, or None and why it cannot run here."""
    if shutil.which("ssh") is None:
        return None, "skipped: ssh not installed"
    probe = subprocess.run(
        ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2", "localhost", "true"],
        capture_output=True,
    )
    if probe.returncode != 0:
        return None, "skipped: no sshd on localhost"
    if shutil.which("rsync") is None:
        return None, "skipped: rsync not installed"
    there = f"cd {shlex.quote(str(remote))} && {shlex.quote(PYTHON)} hello.py"
    script = (
        f"rsync -az {shlex.quote(f'{project}/')} {shlex.quote(f'localhost:{remote}/')}"
        f" && ssh -o BatchMode=yes localhost {shlex.quote(there)}"
    )
    return ["sh", "-c", script], "same machine over loopback ssh"


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=5, quick=3)
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / "hello.py").write_text('print("hello")\n')
        ssh_argv, ssh_note = ssh_workflow(project, root / "remote")
        commands = {
            "gpuhop": [PYTHON, "-m", "gpuhop", "run", "hello.py"],
            "python": [PYTHON, "hello.py"],
        }
        if ssh_argv is not None:
            commands["ssh"] = ssh_argv
        with private_agent(root / "agent") as agent:
            for argv in commands.values():  # warm up: first sync, page cache, ssh host keys
                time_first_line(argv, project, agent.env)
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
            for _ in range(repeats):
                for name, argv in commands.items():
                    samples[name].append(time_first_line(argv, project, agent.env))

    def column(name: str, index: int) -> list[float]:
        return [sample[index] for sample in samples[name]]

    rows = []
    for index, what in enumerate(("launch → first stdout line", "launch → exit")):
        gpuhop = column("gpuhop", index)
        ssh = column("ssh", index) if ssh_argv is not None else None
        rows += [
            Row(
                NAME,
                f"hello.py: {what}",
                "s",
                gpuhop,
                "python hello.py",
                column("python", index),
                "the floor",
            ),
            Row(NAME, f"hello.py: {what}", "s", gpuhop, SSH_NAME, ssh, ssh_note),
        ]
    return rows
