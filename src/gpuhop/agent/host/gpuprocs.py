"""Runs in the agent: which job each process on a GPU belongs to, so that a shared GPU's
memory and load are told per job (NVML reads them per process; `gpuhop ps` shows each job
its own memory, and a shared GPU's energy is split by each job's load).

A process belongs to the job whose PID namespace it is in. Every sandboxed job has its own
(its first process, `init` in the leader's pid file, is that namespace's PID 1; a job in
a container image, its container's), and no
process can leave its PID namespace: a job cannot make its memory count as another's, or
hide it, whatever it does with its environment, process groups or parents. A job that runs
without the sandbox has no namespace of its own, and is not told apart: its GPU's figure
stays the whole GPU's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gpuhop.backends.leader import read_json
from gpuhop.backends.listeners import descendants
from gpuhop.backends.procs import alive, parent, start_time

# A job's first process and its start time, from its leader's pid file.
Init = tuple[int, str | None]


def pid_namespace(pid: int) -> int | None:
    """The PID namespace `pid` is in (the inode of /proc/PID/ns/pid), or None if gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def init_of(leader_pid: Path) -> Init | None:
    """The job's first process and its start time, as its leader wrote them in its pid file
    (`JobPaths.leader_pid`), or for a job in a container image, its container's first
    process; None where there is none (yet), or the job has no PID namespace of its own."""
    leader = read_json(leader_pid) or {}
    init, started = leader.get("init"), leader.get("init_start")
    if not isinstance(init, int):
        pid, containers = leader.get("pid"), leader.get("containers")
        if not isinstance(pid, int) or not isinstance(containers, list) or len(containers) != 1:
            return None
        init = container_init(pid)
        if init is None:
            return None
        started = start_time(init)
    return init, None if started is None else str(started)


def container_init(leader: int) -> int | None:
    """The first process of the one container below the job's leader (which adopts what
    Podman's conmon starts: leader.py), the one process there whose PID namespace is not
    its parent's; None while there is none."""
    own = pid_namespace(leader)
    for pid in sorted(descendants(leader)):
        namespace, up = pid_namespace(pid), parent(pid)
        if namespace not in (None, own) and up is not None and pid_namespace(up) == own:
            return pid
    return None


def per_job(
    processes: Mapping[int, Mapping[int, int]], inits: Mapping[str, Init]
) -> dict[int, dict[str, int]]:
    """GPU index -> job id -> the sum of its processes' figures there (MiB they hold, or
    their load), for the GPUs in `processes` (GPU index -> host pid -> figure). `inits`:
    each job's first process and its start time (`init_of`). Processes of no job (another
    program's) count for none."""
    ours = pid_namespace(os.getpid())
    jobs_of: dict[int, str] = {}
    for job, (init, started) in inits.items():
        namespace = pid_namespace(init)
        # The start time vouches for the pid (not reused); the agent's own namespace is no
        # job's (a job without the sandbox).
        if namespace is not None and namespace != ours and alive(init, started):
            jobs_of[namespace] = job
    out: dict[int, dict[str, int]] = {}
    for index, held in processes.items():
        used = out.setdefault(index, {})
        for pid, mb in held.items():
            owner = jobs_of.get(pid_namespace(pid) or -1)
            if owner is not None:
                used[owner] = used.get(owner, 0) + mb
    return out
