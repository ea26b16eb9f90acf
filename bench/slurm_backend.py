"""Slurm backend: a job on Slurm through gpuhop, next to what a Slurm user types instead.

Starts the test suite's Slurm clusters in turn (tests/slurm_backend/cluster.py: munged,
slurmctld and slurmd of this machine, started and stopped by pid), the one-node cluster and
the two-node one (each node in network and mount namespaces of its own, reached at its own
address), and a private agent on each with `--backend slurm`. Then, over repeats, hello.py
from launch to its line "hello": `gpuhop run --no-requirements hello.py` against a
hand-written `sbatch` of the same script plus `tail -f` of its output file (until the job
has left squeue). Both wait for the same Slurm scheduler (`sched_interval=1` in the test
cluster's slurm.conf). Skipped without Slurm, or when not run as root (the test cluster's
daemons run as root); the two-node row also where the machine gives no network namespaces.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import tempfile
from pathlib import Path

from harness import PYTHON, REPO, Row, Settings, private_agent, time_first_line

sys.path.insert(0, str(REPO))
from tests import netns
from tests.slurm_backend import cluster as slurm_cluster  # the test suite's Slurm clusters

NAME = "slurm_backend"
HELLO = 'print("hello", flush=True)\n'
ALTERNATIVE = "sbatch hello.py + tail -f of its output file"


def what(nodes: int) -> str:
    where = "one node" if nodes == 1 else f"{nodes} nodes, each its own address and /tmp"
    return f"hello.py on Slurm ({where}): launch → first output line"


def note(nodes: int) -> str:
    return f"both wait for the same slurmctld ({nodes} node(s), sched_interval=1)"


def by_hand(project: Path, out: Path) -> list[str]:
    """What a Slurm user runs: sbatch, then follow the output file until the job is gone."""
    q = shlex.quote
    script = (
        f": > {q(str(out))}; id=$(sbatch --parsable --output={q(str(out))} --open-mode=append"
        f" --wrap {q(f'{PYTHON} hello.py')}) || exit 1;"
        ' (while [ -n "$(squeue -h -j "$id" -o %i 2>/dev/null)" ]; do sleep 0.2; done) & w=$!;'
        # Not the last command, so bash does not exec tail: it reaps the watcher, whose
        # zombie tail --pid would otherwise wait on forever.
        f" tail -n +1 -f --pid=$w {q(str(out))}; exit 0"
    )
    return ["bash", "-c", script]


def run(settings: Settings) -> list[Row]:
    gone = slurm_cluster.missing()
    why = f"Slurm is not installed ({', '.join(gone)})" if gone else None
    if why is None and os.getuid() != 0:
        why = "the test Slurm cluster's daemons run as root"
    rows = []
    for nodes in (1, 2):
        skip = why if why is not None or nodes == 1 else netns.unavailable()
        if skip is not None:
            rows.append(Row(NAME, what(nodes), "s", [], ALTERNATIVE, None, f"skipped: {skip}"))
        else:
            rows.append(_measure(settings, nodes))
    return rows


def _measure(settings: Settings, nodes: int) -> Row:
    repeats = settings.repeats(default=5, quick=2)
    mine: list[float] = []
    theirs: list[float] = []
    # Not under /tmp: each node of the two-node cluster has its own.
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        (root / "slurm").mkdir()
        project = root / "project"
        project.mkdir()
        (project / "hello.py").write_text(HELLO)
        with contextlib.ExitStack() as stack:
            cluster = slurm_cluster.start(root / "slurm", nodes)
            stack.callback(cluster.stop)
            stack.enter_context(cluster.used_here())  # for the agent this starts
            agent = stack.enter_context(private_agent(root / "agent", "--backend", "slurm"))
            env = {**agent.env, "GPUHOP_CONFIG_DIR": str(root / "config")}
            gpuhop = [PYTHON, "-m", "gpuhop", "run", "--no-requirements", "hello.py"]
            hand = by_hand(project, root / "hello.out")
            for i in range(repeats + 1):  # the first round warms up (Python's caches)
                first, _ = time_first_line(gpuhop, project, env, b"hello")
                other, _ = time_first_line(hand, project, cluster.env, b"hello")
                if i:
                    mine.append(first)
                    theirs.append(other)
    return Row(NAME, what(nodes), "s", mine, ALTERNATIVE, theirs, note(nodes))
