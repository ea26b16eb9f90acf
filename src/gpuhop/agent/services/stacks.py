"""Runs in the agent: `gpuhop stacks` (GET /v1/jobs/{ref}/stacks), every Python thread's
stack in a running job's processes now, as py-spy dumps them (`gpuhop.agent.host.pyspy`).

A job's processes are its leader's descendants (a sandboxed job's all are: an orphan in its
PID namespace goes to the namespace's first process, itself the leader's child), less the
leader's own forks (the leader, the namespace's first process: gpuhop's, not the job's),
told by their command line, which a fork keeps and an exec replaces. A worker's processes
carry its index in GPUHOP_WORKER_INDEX. A job in a container image has Podman's between
(`podman run`, its conmon, which the leader adopts, and the container's init): its own
processes are those in the container's PID namespace but its first.
"""

from __future__ import annotations

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.host import pyspy
from gpuhop.agent.host.gpuprocs import pid_namespace
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.services import jobs
from gpuhop.api import ErrorCode
from gpuhop.api.stacks import JobStacks, ProcessStacks
from gpuhop.backends import procs
from gpuhop.backends.listeners import descendants

# More processes than this in one job (a data loader's pool is a few dozen): the first ones.
MAX_PROCESSES = 64


def stacks_of(
    rt: AgentContext, ref: str, caller: Caller, worker: int | None, native: bool
) -> JobStacks:
    """The stacks of the job `ref` names (the caller's own, or any for an admin): of all its
    processes, or of worker `worker`'s only."""
    job = jobs.find(rt, ref, caller)
    check_reachable(rt, job, worker, "gpuhop stacks", "no stacks to show")
    try:
        tool = pyspy.find()
    except pyspy.NoPySpy as e:
        raise ApiError(409, ErrorCode.unsupported, str(e)) from None
    found = processes_of(job, worker)
    if not found and not (job.pid and procs.alive(job.pid, job.pid_start)):
        raise ApiError(409, ErrorCode.conflict, f"job {job.id} has just ended: no stacks to show")
    dumped = []
    for pid, index, command in found:
        stacks, error = pyspy.dump(tool, pid, native)
        if error is not None and procs.command_line(pid) is None:
            continue  # it ended meanwhile
        dumped.append(
            ProcessStacks(pid=pid, worker=index, command=command, stacks=stacks, error=error)
        )
    return JobStacks(job=job.id, native=native, processes=dumped)


def check_reachable(
    rt: AgentContext, job: JobRecord, worker: int | None, command: str, so_no: str
) -> None:
    """Refuse, in one line, a job whose processes `command` cannot reach now: on a Ray or
    Slurm cluster, not running (`so_no`: "no stacks to show"), or without worker `worker`."""
    if rt.backend.remote:
        raise ApiError(
            409,
            ErrorCode.unsupported,
            f"job {job.id} runs on {rt.backend.where}: {command} is not yet on the"
            f" {rt.backend.name.capitalize()} backend (only on the agent's own host)",
        )
    jobs.check_running(job, so_no)
    if worker is not None and worker >= job.spec.workers:
        has = f"{job.spec.workers} workers (0-{job.spec.workers - 1})"
        raise ApiError(
            404,
            ErrorCode.not_found,
            f"job {job.id} has {has if job.spec.workers > 1 else 'one worker (0)'};"
            f" there is no worker {worker}",
        )


def processes_of(job: JobRecord, worker: int | None) -> list[tuple[int, int | None, str]]:
    """(pid, worker index, command line) of each of the job's own processes, by pid;
    only worker `worker`'s if given."""
    if job.pid is None or not procs.alive(job.pid, job.pid_start):
        return []
    leader = procs.command_line(job.pid)
    hosts = pid_namespace(job.pid) if job.spec.image else None
    found = []
    for pid in sorted(descendants(job.pid)):
        command = procs.command_line(pid)
        if command is None or command == leader:
            continue
        if hosts is not None and (pid_namespace(pid) == hosts or pyspy.pid_inside(pid) == 1):
            continue  # Podman's, or the container's init
        index_text = procs.environ_value(pid, "GPUHOP_WORKER_INDEX")
        index = int(index_text) if index_text and index_text.isdigit() else None
        if job.spec.workers == 1:
            index = None
        if worker is not None and (index or 0) != worker:
            continue
        words = command.rstrip(b"\0").split(b"\0")
        found.append((pid, index, " ".join(w.decode(errors="replace") for w in words)))
    return found[:MAX_PROCESSES]
