"""Ports for the servers the tests start (sshd, slurmctld, Ray, echo servers): free now, and
drawn from below the kernel's ephemeral range, which every client socket on this machine
takes its own port from.

A port found by binding to 0 and closing comes from that ephemeral range, so any connection
made meanwhile (by this suite, or anything else on a busy machine) may take it before the
server binds it; one from below the range is taken only by a server that asks for it.
"""

from __future__ import annotations

import os
import random
import socket

# Below Linux's default ephemeral range (32768-60999), above the well-known and the usual
# registered services' ports.
LOW, HIGH = 20000, 32000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _own_range() -> range:
    """The ports this process draws from: all of LOW to the ephemeral range, or, in one of
    pytest-xdist's workers (gw0, gw1, ...), a slice of its own, so that two workers never
    draw the same port."""
    high = min(HIGH, _ephemeral_low())
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return range(LOW, high)
    size = (high - LOW) // count
    start = LOW + int(worker[2:]) * size
    return range(start, start + size)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports on `host` that nothing listens on now, from below the ephemeral
    range, in a random order (two suites on one machine rarely draw the same)."""
    ports = _own_range()
    found: list[int] = []
    for port in random.sample(ports, len(ports)):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        found.append(port)
        if len(found) == n:
            return found
    raise RuntimeError(f"no {n} free ports from {ports.start} to {ports.stop} on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def port_block(n: int) -> range:
    """`n` consecutive ports from this process's own range (some may be in use)."""
    ports = _own_range()
    start = random.randrange(ports.start, ports.stop - n)
    return range(start, start + n)
