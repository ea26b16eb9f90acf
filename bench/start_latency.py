"""Start latency: from launching a hello-world script to its first stdout line, and to its exit.

`gpuhop run hello.py` against a warm local agent, next to plain `python hello.py` (the floor)
and the hand-written `rsync -az DIR host:DIR && ssh host 'cd DIR && python hello.py'`; and
`gpuhop run --on REMOTE hello.py` over SSH with a warm connection, next to that same
hand-written workflow and to a bare `ssh host python hello.py`. The "host" is this machine:
a private sshd on a loopback port, started here and stopped afterwards.

The same `gpuhop run hello.py` also runs from a large environment (`big_env`): a venv whose
site-packages holds as many distributions as a PyTorch-sized conda env, with .pth files
that put directories before gpuhop's own on the path, so that what scales with the size of
a user's environment (the path searched per import, distributions scanned for metadata or
entry points) shows next to the same command from the plain one.
"""

from __future__ import annotations

import contextlib
import shlex
import site
import subprocess
import tempfile
from pathlib import Path

from harness import PYTHON, Row, Settings, private_agent, time_first_line
from remotes import Remote, remote_host, ssh_remote, ssh_unavailable

NAME = "start_latency"
SYNC_SSH = "rsync -az + ssh"
BARE_SSH = "ssh host python hello.py"
# The large environment: distributions (each a package and its dist-info, entry points
# included), and .pth files, each putting a directory of packages on the path.
BIG_DISTS = 1500
BIG_PTH_DIRS = 20


def big_env(root: Path, dists: int = BIG_DISTS, pth_dirs: int = BIG_PTH_DIRS) -> str:
    """A venv with `dists` distributions and `pth_dirs` .pth-added directories of packages
    besides this interpreter's own site-packages (gpuhop's), which it sees last through a
    .pth of its own. Returns its python."""
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(root)], check=True)
    packages = next(root.glob("lib/python*/site-packages"))
    for i in range(dists):
        (packages / f"bigpkg{i}").mkdir()
        (packages / f"bigpkg{i}" / "__init__.py").write_text("")
        info = packages / f"bigpkg{i}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: bigpkg{i}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[console_scripts]\nbig{i} = bigpkg{i}:main\n")
    for i in range(pth_dirs):
        extra = root / "extra" / str(i)
        (extra / f"extrapkg{i}").mkdir(parents=True)
        (extra / f"extrapkg{i}" / "__init__.py").write_text("")
        (packages / f"extra{i:02d}.pth").write_text(f"{extra}\n")
    ours = "".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages())
    (packages / "zz-gpuhop.pth").write_text(ours)  # last: after all the rest
    return str(root / "bin" / "python")


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
            big = big_env(root / "big")
            commands["gpuhop big env"] = [big, *commands["gpuhop"][1:]]
            commands["python big env"] = [big, "hello.py"]
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
            Row(NAME, f"hello.py from a large env ({BIG_DISTS} dists, {BIG_PTH_DIRS} .pth):"
                f" {what}", "s", column("gpuhop big env", index) or [],
                "gpuhop from the plain env", local, "ratio 1: the env's size costs nothing"),
            Row(NAME, f"hello.py from a large env: {what}", "s",
                column("gpuhop big env", index) or [], "python hello.py in the large env",
                column("python big env", index), "the floor there (site.py reads every .pth)"),
        ]  # fmt: skip
    return rows
