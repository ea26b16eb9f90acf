"""Runs in the agent: what Slurm says now of the partition's nodes (`sinfo`) and of the
agent's user's jobs there (`squeue --me`), for `gpuhop gpus`.

Every job of the agent's user is listed, gpuhop's and others: on a cluster, jobs the user
submitted by hand hold GPUs too. A gpuhop job is named `gpuhop-<job id>` in Slurm (see
gpuhop.backends.slurm.leader), which is how its gpuhop id is found.
"""

from __future__ import annotations

import subprocess

from gpuhop.api.agent import ClusterInfo, ClusterJob, ClusterNode

COMMAND_TIMEOUT = 30.0
JOB_PREFIX = "gpuhop-"
# `-O` fields, each ended by "|" (no width: not cut, not padded).
NODE_FIELDS = ("NodeList", "Gres", "GresUsed", "StateLong")
JOB_FIELDS = ("JobID", "Name", "State", "NodeList", "tres-per-node", "tres-per-task", "Reason")


class SlurmViewError(Exception):
    """sinfo or squeue did not answer; the message says what they said."""


def _fields(names: tuple[str, ...]) -> str:
    return ",".join(f"{n}:|" for n in names)


def _rows(argv: list[str], width: int) -> list[list[str]]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as e:
        raise SlurmViewError(f"{argv[0]} failed: {e}") from None
    if out.returncode != 0:
        raise SlurmViewError(f"{argv[0]} failed: {out.stderr.strip()}")
    rows = []
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.split("|")][:width]
        if len(cells) == width and cells[0]:
            rows.append(cells)
    return rows


def _gres(text: str) -> str:
    """Slurm's "gres:gpu:1" (or "gres/gpu:1") as "gpu:1"; "" for none ("N/A", "(null)")."""
    if text in ("", "N/A", "(null)"):
        return ""
    return ",".join(part.split("gres", 1)[-1].lstrip(":/") for part in text.split(","))


def nodes(scope: list[str]) -> list[ClusterNode]:
    """The partition's nodes, each once (`scope`: the agent's --partition, if any)."""
    partition = [a for a in scope if a.startswith("--partition=")]
    argv = ["sinfo", "-h", "-N", *partition, "-O", _fields(NODE_FIELDS)]
    seen: dict[str, ClusterNode] = {}
    for name, gres, used, state in _rows(argv, len(NODE_FIELDS)):
        seen.setdefault(name, ClusterNode(name=name, gres=gres, gres_used=used, state=state))
    return list(seen.values())


def jobs() -> list[ClusterJob]:
    """The agent's user's jobs that Slurm holds now, any partition."""
    argv = ["squeue", "-h", "--me", "-O", _fields(JOB_FIELDS)]
    out = []
    for slurm_id, name, state, where, per_node, per_task, reason in _rows(argv, len(JOB_FIELDS)):
        gpus = _gres(per_node) or (f"{_gres(per_task)} per task" if _gres(per_task) else "")
        job_id = name[len(JOB_PREFIX) :] if name.startswith(JOB_PREFIX) else None
        out.append(
            ClusterJob(
                cluster_id=slurm_id,
                job_id=job_id or None,
                name=name,
                state=state,
                nodes=where,
                gpus=gpus,
                reason=reason if reason not in ("None", "") else None,
            )
        )
    return out


def describe(scope: list[str], partition: str | None) -> ClusterInfo:
    """Raises SlurmViewError when sinfo or squeue does not answer."""
    return ClusterInfo(backend="slurm", partition=partition, nodes=nodes(scope), jobs=jobs())
