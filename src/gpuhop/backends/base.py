"""Runs in the agent: the one interface the agent calls to run a job's attempts somewhere
(a backend), and the plain data that crosses it.

The agent keeps each job's lifecycle: the states in its store, retries, which GPUs a job
holds. A backend starts an attempt's process group, re-attaches to it after an agent
restart, stops it with a grace period, and reports how it ended; it offers the scheduler its
GPUs and refuses the kinds of job it cannot run. It never imports `gpuhop.agent`: what it
needs of a job arrives as an `Attempt` (with the job's `JobSpec`), the job's dirs as
`JobPaths`, and what the job needs besides its files as the dict of `gpuhop.backends.jobdeps`.

Every backend leads each attempt from one process on the agent's host, its leader (local,
Ray and Slurm alike: `local/leader.py`, `ray/leader.py`, `slurm/leader.py`), that writes
its pid to `JobPaths.leader_pid` first and the attempt's end to `JobPaths.status` last (see
`gpuhop.backends.leader`); so a restarted agent finds its jobs the same way whichever
backend started them.

Standard library only at run time: `commands` imports StartError from here on Ray's nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpuhop.api import ErrorCode, GpuInfo
    from gpuhop.api.agent import ClusterInfo
    from gpuhop.api.spec import JobSpec
    from gpuhop.home import JobPaths

# Variables the agent's own environment must not hand to a job (or to Ray's processes).
SCRUBBED_ENV = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "GPUHOP_HOME", "GPUHOP_REMOTE")
# What a team agent's jobs get of the agent's own environment (plus what agent.toml's
# `job_env_pass` names): how to find programs and libraries, the locale, and how the host's
# GPUs and math libraries are set up. Nothing else: the operator's credentials, SSH agent
# and whatever the shell that started the agent held never reach another user's job.
JOB_ENV_ALLOWED = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS",
    "TF_CPP_MIN_LOG_LEVEL",
)
JOB_ENV_ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "OPENBLAS_", "MKL_", "XLA_FLAGS")


def allowed_for_jobs(name: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether a team agent passes its variable `name` on to jobs."""
    return name in JOB_ENV_ALLOWED or name in extra or name.startswith(JOB_ENV_ALLOWED_PREFIXES)


# TF_CPP_MIN_LOG_LEVEL for jobs that do not set it: 2 hides TensorFlow's INFO and WARNING
# lines from C++ (the oneDNN notice, CUDA probing on a CPU host); 3 would hide errors too.
QUIET_TF = "2"


class StartError(ValueError):
    """The job could not be started; the message says why, for the user."""


class Refused(Exception):
    """The backend cannot run this job; the message says why and what to do instead."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Usage:
    memory_used_mb: int | None
    utilization: int | None  # percent


@dataclass(frozen=True)
class Energy:
    """One GPU's energy readings now: NVML's total-energy counter (millijoules since the
    driver loaded; Volta and later), and where there is none, its power draw (milliwatts).
    None where the GPU (or the host) does not say."""

    total_mj: int | None
    power_mw: int | None = None


@dataclass(frozen=True)
class Fault:
    """A hardware fault of one GPU, as its driver reports it: the GPU must not run jobs.

    `kind` is one of a few words ("xid", "ecc", "retired-pages", "lost"), for metrics;
    `detail` says what was seen, in words; a different detail is a new fault.
    """

    kind: str
    detail: str


@dataclass
class GpuHost:
    """The GPUs a backend offers the scheduler, and where their facts come from.

    `source` is "nvml", "nvidia-smi", "fake" or "none" for this host's GPUs (found by
    gpuhop.agent.host.gpus), or the name of a cluster backend ("ray"). `error` says why a
    driver that seems to be there did not answer (for `gpuhop doctor`); it is None when all
    is well, and also on a host that simply has no NVIDIA GPU.
    """

    source: str
    gpus: list[GpuInfo] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None  # the newest CUDA the driver supports, e.g. "12.4"
    error: str | None = None

    @property
    def fake(self) -> bool:
        return self.source == "fake"

    def usage(self) -> dict[int, Usage]:
        """Memory used and utilisation of each GPU now. Unknown readings are None."""
        return {g.index: Usage(0, 0) if self.fake else Usage(None, None) for g in self.gpus}

    def processes(self) -> dict[int, dict[int, int]]:
        """GPU index -> pid (on this host) -> MiB of the GPU's memory that process holds, for
        the GPUs whose processes can be read now (none where the driver does not say)."""
        return {}

    def energy(self, indices: list[int]) -> dict[int, Energy]:
        """The energy readings of the GPUs `indices` now, for those that have any."""
        return {}

    def process_utilization(self, index: int) -> dict[int, int] | None:
        """How busy each process (host pid) kept GPU `index` since the last call, as NVML's
        per-process samples say it (the sum of their SM load, percent): {} where none was;
        None where the GPU or the host does not tell."""
        return None

    def faults(self) -> dict[int, Fault]:
        """The GPUs with a hardware fault now (or, for one-off events such as an XID error,
        seen since the last call). None known: an empty dict."""
        return {}

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job, as a backend starts it: what it runs, on which of the GPUs the
    scheduler gave it, and what the job asked for (its spec, settled: `gpus` is the total
    of a multi-worker job's)."""

    job_id: str
    number: int  # 1-based
    command: list[str]
    gpu_ids: list[int]
    spec: JobSpec


@dataclass(frozen=True)
class Started:
    """The process that leads an attempt's process group on the agent's host."""

    pid: int
    pid_start: str | None  # its start time, so that a reused pid is never taken for it


@dataclass(frozen=True)
class Ending:
    """How an attempt ended, as its leader recorded it (`recorded` False: it wrote nothing)."""

    recorded: bool
    exit_code: int | None = None
    signal: int | None = None
    ended_at: float | None = None
    detail: str | None = None  # the leader's own words for the end, which replace the agent's
    leader_returncode: int | None = None  # None: not the agent's child (adopted), or unknown
    # The job's own cgroup counted an OOM kill (a leader that puts its job in one says so).
    oom_killed: bool = False
    # The leader's class for the end (api.EndClass), where it knows better than the agent:
    # a cluster's own time limit ("timeout").
    end_class: str | None = None

    @classmethod
    def from_status(cls, status: dict[str, Any] | None, leader_returncode: int | None) -> Ending:
        if status is None:
            return cls(recorded=False, leader_returncode=leader_returncode)
        if status.get("lost"):
            # The leader saw the job lost where it ran (a cluster's node failed): no exit
            # status, in the leader's words.
            return cls(
                recorded=False, detail=str(status["lost"]), leader_returncode=leader_returncode
            )
        return cls(
            recorded=True,
            exit_code=status.get("exit_code"),
            signal=status.get("signal"),
            ended_at=float(status["ended_at"]) if status.get("ended_at") else None,
            detail=status.get("detail") or None,
            leader_returncode=leader_returncode,
            oom_killed=bool(status.get("oom_killed")),
            end_class=status.get("end_class") or None,
        )


class Backend(Protocol):
    """Where a job's processes run. The agent calls it; it never calls back into the agent."""

    name: str  # "local", "ray", "slurm"
    address: str | None  # the cluster's address; None for the agent's own host
    remote: bool  # whether jobs run on other hosts than the agent's (no ports, no serving)
    where: str  # in words: "this host", "the Ray cluster"
    gpu_host: GpuHost  # the GPUs it offers the scheduler
    python: str  # the interpreter of gpuhop's own helpers (and of scripts, by default)
    # Whether a team agent's jobs run as an unprivileged identity per user here (deps'
    # "identity"); where not (a cluster), they run as the cluster's user, as before.
    identities: bool

    def describe(self) -> str:
        """One line for the agent's log."""
        ...

    def check_submit(self, spec: JobSpec) -> None:
        """Raise Refused if this backend cannot run a job that asks for `spec` (settled)."""
        ...

    def isolation(self) -> str | None:
        """None when every job runs in its own view of the agent's host, seeing none of the
        agent's state but its own files; else why not, and what to allow."""
        ...

    def files_seen(self) -> tuple[bool | None, str] | None:
        """None where jobs use their files on the agent's host (or get copies of them:
        Ray); else whether the cluster's nodes were seen to share the agent's jobs dir (None:
        not checked), and where the files are, in words."""
        ...

    def cluster(self) -> ClusterInfo | None:
        """What the cluster's own scheduler says now of its nodes and of the user's jobs
        there (`gpuhop gpus`); None where it has nothing to add to the GPUs it offers. Raises
        Refused when the scheduler does not answer."""
        ...

    def work_view(self, owned: bool = False) -> str | None:
        """None when each job sees its tree's shared checkout (`deps["checkout"]`) through
        a writable view of its own, so the agent materialises each tree once; else why each
        job gets a copy of every file in its work dir instead. `owned`: for a job that runs
        as an identity of its own (deps' "identity"), in whose view the files are its own."""
        ...

    def start(self, attempt: Attempt, jp: JobPaths, deps: dict[str, Any]) -> Started:
        """Start one attempt (its work dir, or its checkout, is in place) with its output
        going to `jp.log`. Raises StartError, or OSError, saying why it could not (the agent
        fails the attempt with that reason on any exception, and frees its GPUs)."""
        ...

    def adopt(self, jp: JobPaths) -> Started | None:
        """After an agent restart: the leader of an attempt the agent did not see start
        (from its pid file), or None if it never ran."""
        ...

    def alive(self, started: Started) -> bool: ...

    def wait(self, jp: JobPaths, started: Started) -> Ending:
        """Block until the attempt's leader is gone, end what is left of its process group,
        and say how it ended. For a leader started by another agent too (re-attach)."""
        ...

    def ending(self, jp: JobPaths, started: Started | None) -> Ending:
        """How an attempt whose leader is already gone ended; ends what is left of it."""
        ...

    def stop(self, jp: JobPaths, started: Started, grace: float) -> float:
        """Ask the attempt to stop (SIGTERM to its group; its workers get `grace` seconds);
        returns how long to wait before `kill`."""
        ...

    def interrupt(self, started: Started) -> None:
        """SIGTERM to the attempt's group, with no grace period of its own."""
        ...

    def kill(self, started: Started) -> None:
        """SIGKILL to the attempt's group."""
        ...

    def elsewhere(self, jp: JobPaths) -> bool:
        """Whether this job (any attempt) runs on other hosts than the agent's."""
        ...

    def running_since(self, jp: JobPaths, started: float) -> float | None:
        """When the attempt began to run where it runs: `started` (when the agent started
        it) on a backend that runs it at once; on a cluster that may hold it (Slurm keeps it
        pending, Ray has not placed it), when the cluster started it, or None while it has
        not. A --timeout runs from then."""
        ...

    def waiting(self, jp: JobPaths) -> str | None:
        """Why a started attempt does not run yet, in the cluster's words (Slurm's pending
        reason, Ray's unplaced workers); None when it runs, or on a backend that starts jobs
        at once."""
        ...

    def doctor_command(self, argv: list[str]) -> list[str] | None:
        """`argv` (doctor's TensorFlow probe) made to run where jobs run: as it is on this
        host, in a short job on a node of a cluster; None where it cannot be (then doctor
        says so rather than judge the agent's host)."""
        ...

    def cluster_job(self, jp: JobPaths) -> str | None:
        """The cluster's own name for the job's latest attempt ("Slurm job 812"), once it
        has one and from then on; None on the agent's own host."""
        ...

    def close(self) -> None:
        """Release what the backend holds (a helper process) when the agent stops; jobs
        already started go on."""
        ...
