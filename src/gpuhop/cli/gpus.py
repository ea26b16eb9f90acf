"""Runs on the user's machine: `gpuhop gpus`, the GPU host's GPUs and who holds them."""

from __future__ import annotations

import typer

from gpuhop.api import GpuInfo, format_mb
from gpuhop.api.agent import ClusterInfo
from gpuhop.cli.connect import OnOption, client_for
from gpuhop.cli.output import fail, print_json, print_table, say
from gpuhop.client import GpuhopError


def gpus(
    json_out: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    release: int | None = typer.Option(
        None,
        "--release",
        metavar="N",
        help="Put GPU N, quarantined for a hardware fault, back in service (admins only).",
    ),
    on: str | None = OnOption,
) -> None:
    """List the host's GPUs: memory used, load, the jobs holding each (read live), and
    which are quarantined for a hardware fault (XID, ECC, retired pages, off the bus).

    On an agent with the Slurm backend: the partition's nodes as Slurm lists them now
    (GRES, in use, state) and your Slurm jobs, with the gpuhop job each runs."""
    if release is not None:
        _release(release, on)
        return
    cluster: ClusterInfo | None = None
    try:
        with client_for(on) as client:
            infos = client.gpus()
            info = client.info() if infos else None
            if info is not None and info.backend == "slurm" and not json_out:
                cluster = client.cluster()
    except GpuhopError as e:
        fail(e.message)
    if json_out:
        print_json([g.model_dump(mode="json") for g in infos])
        return
    if not infos:
        say("this host has no GPU; jobs run on the CPU")
        return
    if cluster is not None:
        _slurm(cluster, len(infos))
        return
    if any(g.node for g in infos):
        # A Ray cluster's GPUs: Ray places the jobs, so gpuhop knows only how many are held.
        print_table(
            ("GPU", "NODE", "NAME", "JOBS"),
            [(str(g.index), g.node or "-", g.name, ", ".join(g.job_ids) or "-") for g in infos],
        )
        say("GPUs of the Ray cluster; Ray decides which node and GPU each job gets")
        return
    # A HEALTH column only when some GPU is out of service: the usual table stays narrow.
    health = any(g.quarantined for g in infos)
    print_table(
        ("GPU", "MODEL", "GROUP", "MEMORY USED", "UTIL", "RESERVED", "JOBS")
        + (("HEALTH",) if health else ()),
        [
            (
                str(g.index),
                g.name,
                g.group or "-",
                f"{_mb(g.memory_used_mb)} / {format_mb(g.memory_mb)}",
                "-" if g.utilization is None else f"{g.utilization}%",
                _reserved(g),
                holders(g.job_ids, g.memory_reserved_mb),
            )
            + ((("QUARANTINED" if g.quarantined else "ok"),) if health else ())
            for g in infos
        ],
    )
    for g in infos:
        if g.quarantined:
            say(
                f"GPU {g.index} is quarantined: {g.quarantined}; no job gets it until an admin"
                f" runs: gpuhop gpus --release {g.index}"
            )
    if info is not None and info.fake_gpus:
        say("these GPUs are fake (agent started with --fake-gpus); jobs run on the CPU")


def _slurm(cluster: ClusterInfo, gpus: int) -> None:
    """The partition's nodes as sinfo lists them, then the user's Slurm jobs (squeue)."""
    part = f"partition {cluster.partition}" if cluster.partition else "default partition"
    print_table(
        ("NODE", "GRES", "IN USE", "STATE"),
        [(n.name, n.gres, n.gres_used, n.state) for n in cluster.nodes],
    )
    if cluster.jobs:
        print_table(
            ("SLURM JOB", "GPUHOP JOB", "NAME", "STATE", "NODES", "GPUS", "REASON"),
            [
                (
                    j.cluster_id,
                    j.job_id or "-",
                    j.name,
                    j.state,
                    j.nodes or "-",
                    j.gpus or "-",
                    j.reason or "-",
                )
                for j in cluster.jobs
            ],
        )
    else:
        say("you have no job on the Slurm cluster now")
    say(
        f"the nodes of Slurm's {part} (sinfo) and your Slurm jobs (squeue --me); {gpus} GPU(s)"
        " there for gpuhop's jobs: Slurm decides which node and GPU each gets, and keeps a job"
        " pending while other jobs hold them"
    )


def _release(index: int, on: str | None) -> None:
    try:
        with client_for(on) as client:
            info = client.release_gpu(index)
    except GpuhopError as e:
        fail(e.message)
    say(f"GPU {info.index} ({info.name}) is back in service; new jobs may get it")


def _mb(mb: int | None) -> str:
    return "?" if mb is None else format_mb(mb)


def holders(job_ids: list[str], reserved_mb: int) -> str:
    """The JOBS of a GPU: the ids of those the caller may see, and, where jobs they may not
    see hold some of it too (other users' jobs, to a user who is not an admin), a word that
    says so: such a GPU is taken, not free."""
    if reserved_mb and not job_ids:
        return "other users' jobs"
    return ", ".join(job_ids) or "-"


def _reserved(g: GpuInfo) -> str:
    # From the memory reserved, not the ids listed: another user's job is not listed to a
    # user who is not an admin, but what it holds is.
    if not g.memory_reserved_mb:
        return "-"
    if g.memory_reserved_mb >= g.memory_mb and len(g.job_ids) <= 1:
        # A whole-GPU job, or one share that takes it all: either way, nothing else fits.
        return "all"
    return f"{format_mb(g.memory_reserved_mb)} of {format_mb(g.memory_mb)} (shared)"


def register(app: typer.Typer) -> None:
    app.command()(gpus)
