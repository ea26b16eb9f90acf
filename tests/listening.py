"""Which sockets listen where, read from /proc: told apart by socket inode, never by port
number alone, since any other program on the machine may listen on the same number as a
job does in its own network namespace (a CI run failed when one held a worker's port)."""

from __future__ import annotations

import json
from pathlib import Path

from gpuhop.backends.listeners import descendants, socket_inodes
from gpuhop.home import JobPaths


def listening(net: str = "/proc/net") -> dict[str, int]:
    """Socket inode -> port of every TCP socket listening in the network namespace whose
    tables are under `net` (`/proc/net`: this process's; `/proc/PID/net`: that process's)."""
    found = {}
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(net, table).read_text().splitlines()[1:]
        except OSError:  # the process ended, or has no IPv6
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":  # LISTEN
                found[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def held_listening(pid: int) -> dict[str, int]:
    """Socket inode -> port of the listening TCP sockets that `pid` or a process below it
    holds, in whichever network namespace each process is."""
    held = {}
    for p in descendants(pid):
        inodes = socket_inodes({p})
        held |= {i: port for i, port in listening(f"/proc/{p}/net").items() if i in inodes}
    return held


def assert_listens_apart_from_the_host(job_dir: Path, port: int) -> None:
    """The job whose dir (in the agent's state dir) is `job_dir` listens on `port`, and no
    socket of its listens in this host's network namespace."""
    leader = json.loads(JobPaths(job_dir).leader_pid.read_text())["pid"]
    held = held_listening(int(leader))
    assert port in held.values(), f"no process of the job listens on {port}: {held}"
    assert not held.keys() & listening().keys(), "the job listens in the host's network"


def taken_on_the_host(port: int) -> bool:
    """Whether some socket listens on `port` in this host's network namespace (another
    program's, after assert_listens_apart_from_the_host: a connection there proves nothing)."""
    return port in listening().values()
