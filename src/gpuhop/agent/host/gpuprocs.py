"""Runs in the agent: which job each process on a GPU belongs to, so that a shared GPU's
memory is told per job (NVML reads it per process; `gpuhop ps` shows each job its own).

A process belongs to the job whose PID namespace it is in. Every sandboxed job has its own
(its first process, `init` in the leader's pid file, is that namespace's PID 1), and no
process can leave its PID namespace: a job cannot make its memory count as another's, or
hide it, whatever it does with its environment, process groups or parents. A job that runs
without the sandbox has no namespace of its own, and is not told apart: its GPU's figure
stays the whole GPU's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuhop.backends.procs import alive


def pid_namespace(pid: int) -> int | None:
    """The PID namespace `pid` is in (the inode of /proc/PID/ns/pid), or None if gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def memory_by_job(
    processes: Mapping[int, Mapping[int, int]], inits: Mapping[str, tuple[int, str | None]]
) -> dict[int, dict[str, int]]:
    """GPU index -> job id -> MiB its processes hold there, for the GPUs in `processes`
    (GPU index -> host pid -> MiB). `inits`: each job's first process and its start time,
    from its leader's pid file. Processes of no job (another program's) count for none."""
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
