"""Runs in the agent: the Slurm backend, which runs every job as one `sbatch` job of the
agent's own user on the Slurm cluster of the host it runs on (a login node).

Each attempt is led from this host by gpuhop.backends.slurm.leader (submit, follow with
`squeue`, cancel with `scancel`), and runs on its compute node under
gpuhop.backends.slurm.task. The job's work dir, log, metrics, artifacts and checkpoints are
those in the agent's state dir, which must be on a filesystem the compute nodes see.

The scheduler hands out the partition's GPUs (GRES `gpu`) as `sinfo` listed them at start,
so a job waits in gpuhop's queue while the agent's own jobs hold them all; Slurm decides
where each job runs, and while it keeps a job pending its reason shows in `show`.
A multi-worker job (--workers N) is one Slurm job of N tasks, one per node (several with
--pack), that `srun` starts together (gpuhop.backends.slurm.gang); each worker gets its
TF_CONFIG (or Keras 3's distribution variables) for its peers on the allocation's nodes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

from gpuhop.api import ErrorCode, GpuInfo
from gpuhop.api.agent import ClusterInfo
from gpuhop.api.spec import JobSpec
from gpuhop.backends import clusterjob, kerasmode
from gpuhop.backends.base import (
    SCRUBBED_ENV,
    Attempt,
    GpuHost,
    Refused,
    Started,
    StartError,
)
from gpuhop.backends.leader import LeaderBackend
from gpuhop.backends.settings import BackendSettings
from gpuhop.backends.slurm import rendezvous, shared, view
from gpuhop.home import AgentError, JobPaths

log = logging.getLogger("gpuhop.agent")

SPEC_NAME = "slurm-spec.json"
EXIT_NAME = "slurm-exit.json"
COMMAND_TIMEOUT = 60.0
DOCTOR_WAIT = 30  # seconds doctor's probe waits for Slurm to start it on a node
# Seconds a cancelled job's leader gets after the grace for Slurm to end the job.
CLEAN_UP_SECONDS = 30.0
_SHARING = re.compile(r"(?:^|[|,])(shard|mps)(?=[:,(\s]|$)", re.MULTILINE)
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")
SAME_USER = (
    "jobs run on the Slurm cluster's nodes as the agent's own user, unsandboxed, and the"
    " agent's state dir (its tokens, TLS key and job store) is on a filesystem they see:"
    " any job could read it and act as the agent's owner"
)


class Site(NamedTuple):
    """What a site sets for its cluster in agent.toml's [slurm]."""

    ports: tuple[int, int] = rendezvous.DEFAULT_PORTS  # a multi-worker job's, on the nodes
    scratch: str | None = None  # node-local disk on every node (below $SLURM_TMPDIR)


def runs_on_slurm(jp: JobPaths) -> bool:
    """Whether this job (any attempt) was submitted to Slurm."""
    return (jp.root / SPEC_NAME).exists()


class SlurmBackend(LeaderBackend):
    name = "slurm"
    remote = True
    where = "the Slurm cluster"

    def __init__(
        self,
        settings: BackendSettings,
        nodes: list[tuple[str, int]],
        python: str,
        home: Path,
        seen: shared.SharedCheck | None = None,
        site: Site | None = None,
    ):
        super().__init__(GpuHost("slurm", gpus=_gpus(nodes)), python)
        self.settings = settings
        self.home = home
        self.nodes = nodes
        self.seen = seen or shared.SharedCheck(None, "not checked")
        self.site = site or Site()
        self.sharing: set[str] = set()  # GRES for a share of a GPU that the nodes offer
        self.address = None  # Slurm's commands find the cluster (slurm.conf, $SLURM_CONF)

    @classmethod
    def connect(
        cls,
        settings: BackendSettings,
        home: Path,
        python: str,
        site: Site | None = None,
    ) -> SlurmBackend:
        """Ask `sinfo` for the partition's nodes; raise AgentError saying why it cannot.
        `site`: agent.toml's [slurm] settings (None: the defaults)."""
        if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
            raise AgentError(
                "the slurm backend needs Slurm's commands (sbatch, squeue, scancel, sinfo)"
                " on the agent's host: run the agent on the cluster's login node"
            )
        argv = ["sinfo", "-h", "-N", "-o", "%N|%G"]
        if settings.slurm_partition:
            argv += ["-p", settings.slurm_partition]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
        except (OSError, subprocess.SubprocessError) as e:
            raise AgentError(f"sinfo failed: {e}") from None
        if out.returncode != 0:
            raise AgentError(f"sinfo failed: {out.stderr.strip()}")
        nodes = _nodes(out.stdout)
        if not nodes:
            where = f"in partition {settings.slurm_partition}" if settings.slurm_partition else ""
            raise AgentError(f"sinfo lists no nodes {where}".strip() + _partitions())
        jobs = home / "jobs"
        jobs.mkdir(parents=True, exist_ok=True)
        seen = shared.check(jobs, home, scope(settings), python)
        if not seen.ok:
            log.warning("cannot tell whether Slurm's nodes see %s: %s", jobs, seen.detail)
        backend = cls(settings, nodes, python, home, seen, site)
        backend.sharing = set(_SHARING.findall(out.stdout))
        return backend

    def describe(self) -> str:
        part = self.settings.slurm_partition or "the default partition"
        gpus = sum(n for _, n in self.nodes)
        return (
            f"running jobs as Slurm jobs in {part}: {len(self.nodes)} node(s), {gpus} GPU(s);"
            f" their files are under {self.home}, which the compute nodes must see"
        )

    def isolation(self) -> str | None:
        return SAME_USER

    def files_seen(self) -> tuple[bool | None, str] | None:
        return self.seen.ok, self.seen.detail

    def cluster(self) -> ClusterInfo | None:
        try:
            return view.describe(scope(self.settings), self.settings.slurm_partition)
        except view.SlurmViewError as e:
            raise Refused(ErrorCode.unsupported, f"Slurm does not answer: {e}") from None

    def work_view(self, owned: bool = False) -> str | None:
        return (
            "each job runs on a Slurm compute node from a copy of its files in its work dir"
            f" under {self.home}, which must be on a filesystem the nodes see"
        )

    def check_submit(self, spec: JobSpec) -> None:
        """Refuse, with what to do instead, the jobs that need the agent's own host."""
        why = None
        if spec.image is not None:
            why = (
                "container images (--image) run on the local backend only; this agent runs"
                " jobs on Slurm, whose nodes' own Python runs them. Run without --image,"
                " or on an agent with the local backend"
            )
        elif spec.data or spec.data_sources:
            why = (
                "datasets (and buckets' data) are mounted from the agent's host and cannot"
                " reach Slurm's compute"
                " nodes; put the data on the shared filesystem"
            )
        elif spec.secrets:
            why = (
                "secrets (--secret) are given only to jobs on the agent's own host, whose"
                " leader masks them in the job's log; this agent runs jobs on Slurm"
            )
        elif spec.requirements is not None:
            why = (
                "jobs on Slurm run with the nodes' own Python packages; a requirements file"
                " (requirements.txt is sent by default) cannot be installed there. Use"
                " --no-requirements, and install what the job needs where the nodes see it"
            )
        elif spec.gpu_memory_mb is not None:
            why = (
                "shares of a GPU (--gpu-memory) are not supported on Slurm, which hands out"
                " whole GPUs"
            )
            if self.sharing:
                why += (
                    f" (the partition's nodes offer {' and '.join(sorted(self.sharing))} GRES,"
                    " which gpuhop does not ask for: submit such a job with sbatch yourself)"
                )
        elif spec.private_network:
            why = (
                "a private network (TensorFlow servers) exists only on the agent's own host,"
                " and this agent runs jobs on Slurm"
            )
        elif spec.workers > 1:
            try:
                kerasmode.decide(spec.env, lambda m: True)  # the nodes' packages are theirs
            except kerasmode.KerasRefusal as e:
                why = str(e)
        if why is not None:
            raise Refused(ErrorCode.bad_request, f"{why} (agent started with --backend slurm)")
        self._check_room(spec)

    def _check_room(self, spec: JobSpec) -> None:
        largest = max((n for _, n in self.nodes), default=0)
        per_worker = spec.gpus // spec.workers
        if per_worker > largest:
            each = "the job asks" if spec.workers == 1 else "each worker asks"
            raise Refused(
                ErrorCode.unsatisfiable,
                f"{each} for {per_worker} GPU(s) on one node; the largest node of the"
                f" Slurm partition has {largest}",
            )
        if spec.workers > 1 and not spec.pack and spec.workers > len(self.nodes):
            raise Refused(
                ErrorCode.unsatisfiable,
                f"the job's {spec.workers} workers run one per node, and the Slurm partition"
                f" has {len(self.nodes)} node(s): use --pack to allow several per node",
            )
        low, high = self.site.ports
        if spec.workers > high - low + 1:
            raise Refused(
                ErrorCode.unsatisfiable,
                f"the job's {spec.workers} workers need a port each, and the agent's Slurm"
                f" ports ({low}-{high}, [slurm] ports in its agent.toml) are {high - low + 1}",
            )
        if spec.workers > 1 and spec.gpus > sum(n for _, n in self.nodes):
            raise Refused(
                ErrorCode.unsatisfiable,
                f"the job asks for {spec.gpus} GPU(s) in all; the Slurm partition has"
                f" {sum(n for _, n in self.nodes)}",
            )

    def leader(
        self, attempt: Attempt, jp: JobPaths, deps: dict[str, Any]
    ) -> tuple[list[str], dict[str, str]]:
        exit_file = jp.root / EXIT_NAME
        exit_file.unlink(missing_ok=True)
        (jp.root / "grace").unlink(missing_ok=True)
        clusterjob.forget(jp.root)
        spec = {
            "job_id": attempt.job_id,
            "attempt": attempt.number,
            "retries": attempt.spec.retries,
            "command": attempt.command,
            "python": deps.get("python") or self.python,
            "env": dict(attempt.spec.env),
            "gpus": attempt.spec.gpus,
            "timeout": attempt.spec.time_limit,
            "partition": self.settings.slurm_partition,
            "account": self.settings.slurm_account,
            "qos": self.settings.slurm_qos,
            "work": str(jp.work),
            "log": str(jp.log),
            "artifacts": str(jp.artifacts),
            "checkpoints": str(jp.checkpoints),
            "metrics": str(jp.metrics),
            "exit_file": str(exit_file),
            "scratch": self.site.scratch,
        }
        views = jp.root / "worker-views"
        shutil.rmtree(views, ignore_errors=True)  # a killed gang's (only worker 0's come back)
        if attempt.spec.workers > 1:
            try:
                mode = kerasmode.decide(attempt.spec.env, lambda m: True)
            except kerasmode.KerasRefusal as e:
                raise StartError(str(e)) from None
            spec.update(
                workers=attempt.spec.workers,
                pack=bool(deps.get("pack")),
                mode=mode.mode,
                mode_env=mode.env,
                worker_timeout=attempt.spec.worker_timeout,
                ports=list(self.site.ports),
                views=str(views),
                worker_logs=[str(jp.worker_log(i)) for i in range(attempt.spec.workers)],
            )
            for i in range(attempt.spec.workers):
                jp.worker_log(i).touch()
        (jp.root / SPEC_NAME).write_text(json.dumps(spec))
        argv = [self.python, "-m", "gpuhop.backends.slurm.leader"]
        argv += [str(jp.status), str(jp.leader_pid), str(jp.root / SPEC_NAME)]
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in SCRUBBED_ENV and not k.startswith(("GPUHOP_", "SLURM_"))
        }
        if "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        env["PYTHONUNBUFFERED"] = "1"
        return argv, env

    def elsewhere(self, jp: JobPaths) -> bool:
        return runs_on_slurm(jp)

    def doctor_command(self, argv: list[str]) -> list[str] | None:
        """One task on one node of the partition, with one GPU where it has any, started
        within DOCTOR_WAIT seconds or not at all (a busy partition is said, not waited on)."""
        srun = ["srun", "--nodes=1", "--ntasks=1", f"--immediate={DOCTOR_WAIT}", "--time=5"]
        srun += ["--job-name=gpuhop-doctor", "--export=ALL", *scope(self.settings)]
        if any(n for _, n in self.nodes):
            srun.append("--gres=gpu:1")
        return [*srun, *argv]

    def stop(self, jp: JobPaths, started: Started, grace: float) -> float:
        """Tell the job's leader its grace, then SIGTERM; how long to wait before SIGKILL."""
        (jp.root / "grace").write_text(f"{grace}")
        super().stop(jp, started, grace)
        return grace + CLEAN_UP_SECONDS

    def end_the_rest(self, jp: JobPaths) -> str | None:
        """The leader is gone: cancel its Slurm job if it is still there (a leader killed
        before it saw the job end), so that a job never runs twice."""
        record = clusterjob.read(jp.root)
        if record is None:
            return None
        slurm_id = record["job_id"]
        done = None
        try:
            out = subprocess.run(
                ["scancel", str(slurm_id)], capture_output=True, timeout=COMMAND_TIMEOUT
            )
            if out.returncode == 0:
                done = (
                    f"its leader on the agent's host vanished with no exit status, so Slurm"
                    f" job {slurm_id} was cancelled (a job never runs twice)"
                )
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("could not cancel Slurm job %s: %s", slurm_id, e)
        return done


def scope(settings: BackendSettings) -> list[str]:
    """The sbatch/srun options that put a job where the agent's settings say."""
    out = []
    for option, value in (
        ("partition", settings.slurm_partition),
        ("account", settings.slurm_account),
        ("qos", settings.slurm_qos),
    ):
        if value:
            out.append(f"--{option}={value}")
    return out


def _partitions() -> str:
    """ "; the cluster's partitions are: ..." as sinfo lists them, or "" if it cannot."""
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    names = sorted(set(out.stdout.split())) if out.returncode == 0 else []
    return f"; the cluster's partitions are: {', '.join(names)}" if names else ""


def _nodes(sinfo: str) -> list[tuple[str, int]]:
    """(node, GPUs) from `sinfo -N -o '%N|%G'`, each node once."""
    out: dict[str, int] = {}
    for line in sinfo.splitlines():
        name, _, gres = line.strip().partition("|")
        if name:
            out[name] = sum(int(n) for n in _GPU_GRES.findall(gres))
    return list(out.items())


def _gpus(nodes: list[tuple[str, int]]) -> list[GpuInfo]:
    out: list[GpuInfo] = []
    for name, count in nodes:
        for _ in range(count):
            out.append(GpuInfo(index=len(out), name="GPU", memory_mb=0, node=name))
    return out
