"""Runs in the agent: which loopback address reaches a port that a job's own processes
listen on, on the host's network (for `gpuhop forward` to a job without a private network).

A job that shares the host's network shares its loopback with every other job and service
there, so "connect to 127.0.0.1:PORT" alone reaches whatever listens on PORT: another user's
model server, a database, the agent itself. So the agent first asks the kernel who listens:
the listening TCP sockets on PORT (/proc/net/tcp, tcp6) that a connection to 127.0.0.1 or
::1 would reach, and the sockets that the job's processes hold (/proc/PID/fd of every
descendant of the job's leader; a sandboxed job's processes all are, in its PID namespace).
The forward goes to the address where every listener is the job's, and to none if another
process listens there too (SO_REUSEPORT shares a port among processes of one user).
"""

from __future__ import annotations

import os

from gpuhop.backends.procs import parent

LISTEN = "0A"
# A listener bound to one of these (hex, as /proc/net shows them) answers on 127.0.0.1 ...
_V4 = {"00000000", "0100007F"}
_V4_IN_V6 = {
    "00000000000000000000000000000000",  # :: (dual-stack unless IPV6_V6ONLY)
    "0000000000000000FFFF000000000000",  # ::ffff:0.0.0.0
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1
}
# ... and to one of these on ::1.
_V6 = {"00000000000000000000000000000000", "00000000000000000000000001000000"}


def descendants(pid: int) -> set[int]:
    """`pid` and every process below it, by parent pid."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (ppid := parent(int(entry))) is not None:
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo.extend(children.get(p, ()))
    return found


def socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _listeners(port: int) -> dict[str, set[str]]:
    """The inodes of the TCP sockets listening on `port` that answer on each loopback."""
    found: dict[str, set[str]] = {"127.0.0.1": set(), "::1": set()}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] != LISTEN or int(hex_port, 16) != port:
                continue
            if address in (_V4 if table == "tcp" else _V4_IN_V6):
                found["127.0.0.1"].add(fields[9])
            if table == "tcp6" and address in _V6:
                found["::1"].add(fields[9])
    return found


def job_loopback(leader: int, port: int) -> tuple[str | None, str]:
    """(the loopback address to reach the job's listener on `port`, "") or (None, why not)."""
    listeners = _listeners(port)
    if not any(listeners.values()):
        return None, "nothing listens there"
    own = socket_inodes(descendants(leader))
    for host, inodes in listeners.items():
        if inodes and inodes <= own:
            return host, ""
    if any(inodes & own for inodes in listeners.values()):
        return None, "another process listens on the same port too"
    return None, "the job's processes do not listen there; another process does"
