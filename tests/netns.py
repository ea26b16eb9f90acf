"""A private test network on this one machine (a Slurm cluster's nodes, a registry): each node
a network namespace of its own, with its own address on a private /24 of 10.0.0.0/8, joined
to a bridge on this host (the login node, where slurmctld and the agent run) by a veth pair.

The nodes reach each other and this host by their addresses only: a node's Slurm name
(NodeName) resolves nowhere. Everything is made by `Network.make` and removed by
`Network.remove` (deleting a namespace deletes the veth pair in it). Names carry the pid of
the process that made them, so a network whose maker died without removing it (a SIGKILLed
test run) is removed by the next one made on this machine.

Needs root and iproute2's `ip netns`; `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field

PREFIX = "gpuhop-test-"
_OURS = re.compile(rf"^{PREFIX}(\d+)-([0-9a-f]{{6}})-n\d+$")


class NetworkError(Exception):
    """The network could not be made; the message says which command failed and how."""


def _ip(*args: str) -> str:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def unavailable() -> str | None:
    """Why this machine cannot give a test its own network namespaces, or None if it can."""
    if os.getuid() != 0:
        return "network namespaces for the test nodes need root"
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "iproute2's `ip` or util-linux's `nsenter` is not installed"
    tried = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True, timeout=30)
    if tried.returncode != 0:
        return f"this machine allows no network namespaces ({tried.stderr.strip()})"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> None:
    """Remove the networks of makers that are gone (a run killed before its teardown)."""
    with contextlib.suppress(NetworkError):
        for line in _ip("netns", "list").splitlines():
            m = _OURS.match(line.split()[0]) if line.strip() else None
            if m and not _alive(int(m.group(1))):
                with contextlib.suppress(NetworkError):
                    _ip("netns", "delete", m.group(0))
                with contextlib.suppress(NetworkError):
                    _ip("link", "delete", f"ghb{m.group(2)}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.0.0.0/8 that no route of this host's overlaps."""
    routes = _ip("-4", "route", "show", "table", "all")
    used = []
    for line in routes.splitlines():
        words = line.split()
        dest = words[1] if words and words[0] in ("local", "broadcast") else words[0]
        with contextlib.suppress(ValueError, IndexError):
            used.append(ipaddress.ip_network(dest, strict=False))
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{random.randint(100, 254)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise NetworkError("no free /24 in 10.0.0.0/8 for the test nodes")


@dataclass
class Network:
    """This host's bridge (`gateway`, its address) and one namespace per node (`netns`,
    whose addresses are `addresses`)."""

    tag: str
    gateway: str
    addresses: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"ghb{self.tag}"

    def enter(self, index: int) -> list[str]:
        """The argv prefix that runs a command in node `index`'s network namespace. (Not
        `ip netns exec`, which mounts a /sys without the host's cgroup filesystems, which
        slurmd needs.)"""
        return ["nsenter", f"--net=/run/netns/{self.netns[index]}"]

    @classmethod
    def make(cls, nodes: int) -> Network:
        remove_stale()
        tag = secrets.token_hex(3)
        subnet = _free_subnet()
        hosts = list(subnet.hosts())
        net = cls(tag, str(hosts[0]))
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
            _ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
            for i in range(nodes):
                ns = f"{PREFIX}{os.getpid()}-{tag}-n{i + 1}"
                _ip("netns", "add", ns)
                net.netns.append(ns)
                addr = str(hosts[i + 1])
                host_end = f"ghv{tag}{i + 1}"
                _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", host_end, "master", net.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "route", "add", "default", "via", net.gateway)
                net.addresses.append(addr)
        except BaseException:
            net.remove()
            raise
        return net

    def remove(self) -> None:
        """Delete the namespaces (and so their veth pairs) and the bridge."""
        for ns in self.netns:
            with contextlib.suppress(NetworkError):
                _ip("netns", "delete", ns)
        self.netns.clear()
        with contextlib.suppress(NetworkError):
            _ip("link", "delete", self.bridge)
