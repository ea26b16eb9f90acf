"""Runs in the agent: what every backend shares, each attempt led by one process on the
agent's host, the attempt's leader (the local backend's, Ray's or Slurm's), in a session of
its own.

The leader writes its pid to `JobPaths.leader_pid` first and the attempt's end (exit_code,
signal, detail, ended_at) to `JobPaths.status` last, atomically, and outlives the agent; so
an agent started again finds it, waits for it, and reads how the attempt ended, whichever
backend started it. A backend supplies the leader's argv and environment (`leader`); this
class starts it with stdout and stderr going straight to the job's log (no pipe through the
agent), watches it, signals its process group, and reads its status.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from gpuhop.api.agent import ClusterInfo
from gpuhop.backends import clusterjob
from gpuhop.backends.base import Attempt, Ending, GpuHost, Started, StartError
from gpuhop.backends.procs import alive, signal_group, start_time
from gpuhop.home import JobPaths

POLL_SECONDS = 0.5


class LeaderBackend:
    """A backend whose attempts are process groups led from the agent's host."""

    name: str
    address: str | None = None
    identities = False
    remote = False
    where = "this host"

    def __init__(self, gpu_host: GpuHost, python: str):
        self.gpu_host = gpu_host
        self.python = python
        # The leaders this agent started, so that `wait` reaps its own children.
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def leader(
        self, attempt: Attempt, jp: JobPaths, deps: dict[str, Any]
    ) -> tuple[list[str], dict[str, str]]:
        """The argv and environment of the attempt's leader. Raises StartError."""
        raise NotImplementedError

    def start(self, attempt: Attempt, jp: JobPaths, deps: dict[str, Any]) -> Started:
        try:
            program, env = self.leader(attempt, jp, deps)
            with open(jp.log, "ab") as logfile:
                proc = subprocess.Popen(
                    program,
                    cwd=jp.work,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except (StartError, OSError):
            raise
        except Exception as e:
            # An argument or variable no OS takes (UnicodeEncodeError, an embedded NUL), a
            # path too deep (RecursionError): the job's fault, said as a StartError.
            raise StartError(f"{type(e).__name__}: {e}") from e
        with self._lock:
            self._children[proc.pid] = proc
        return Started(proc.pid, start_time(proc.pid))

    def adopt(self, jp: JobPaths) -> Started | None:
        leader = read_json(jp.leader_pid)
        if leader is None:
            return None
        pid = int(leader["pid"])
        # The start time the leader wrote beside its pid: a process that took the pid after
        # the leader ended (while no agent ran) is not it. (A file without one: read now.)
        recorded = leader.get("pid_start")
        return Started(pid, str(recorded) if recorded is not None else start_time(pid))

    def alive(self, started: Started) -> bool:
        return alive(started.pid, started.pid_start)

    def wait(self, jp: JobPaths, started: Started) -> Ending:
        with self._lock:
            proc = self._children.pop(started.pid, None)
        if proc is not None:
            proc.wait()
            return self._ending(jp, started, proc.returncode)
        while alive(started.pid, started.pid_start):
            time.sleep(POLL_SECONDS)
        return self._ending(jp, started, None)

    def ending(self, jp: JobPaths, started: Started | None) -> Ending:
        return self._ending(jp, started, None)

    def _ending(self, jp: JobPaths, started: Started | None, returncode: int | None) -> Ending:
        done = None
        if started is not None:
            # Sweep what the job left in its process group (daemons, stuck workers), unless
            # another process has the leader's pid now: the kernel gives no pid that is still
            # a group's id, so the job's group is gone, and that pid's group is another's.
            now = start_time(started.pid)
            if now is None or now == started.pid_start:
                signal_group(started.pid, signal.SIGKILL)
            done = self.end_the_rest(jp)
        # The leader removes its relay's socket (and a cluster's leader its wait), unless it
        # was killed first.
        jp.relay.unlink(missing_ok=True)
        clusterjob.released(jp.root)
        end = Ending.from_status(read_json(jp.status), returncode)
        if done and not end.recorded and end.detail is None:
            end = dataclasses.replace(end, detail=done)
        return end

    def end_the_rest(self, jp: JobPaths) -> str | None:
        """Once the leader is gone: end, and wait for, what else is left of the attempt
        outside its process group, so that its GPUs are free when this returns. What it
        ended, in words for an attempt whose leader left no status (None: nothing to say)."""
        return None

    def stop(self, jp: JobPaths, started: Started, grace: float) -> float:
        signal_group(started.pid, signal.SIGTERM)
        return grace

    def interrupt(self, started: Started) -> None:
        signal_group(started.pid, signal.SIGTERM)

    def kill(self, started: Started) -> None:
        signal_group(started.pid, signal.SIGKILL)

    def elsewhere(self, jp: JobPaths) -> bool:
        return False

    def files_seen(self) -> tuple[bool | None, str] | None:
        return None

    def cluster(self) -> ClusterInfo | None:
        return None

    def running_since(self, jp: JobPaths, started: float) -> float | None:
        """`started` for an attempt on this host; for one on a cluster, when its leader saw
        the cluster run it (None while the cluster holds it: see `clusterjob`)."""
        return clusterjob.running_since(jp.root) if self.elsewhere(jp) else started

    def waiting(self, jp: JobPaths) -> str | None:
        return clusterjob.waiting(jp.root)  # a cluster's leader wrote it (none on this host)

    def doctor_command(self, argv: list[str]) -> list[str] | None:
        return argv

    def cluster_job(self, jp: JobPaths) -> str | None:
        record = clusterjob.read(jp.root)  # a cluster's leader wrote it (none on this host)
        return None if record is None else str(record["said"])

    def close(self) -> None:
        pass


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
