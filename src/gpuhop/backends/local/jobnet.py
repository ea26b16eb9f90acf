"""Runs on the GPU host, in a job's leader: the job's private network, a network namespace
whose only interface is loopback, made by the leader before it starts the job (for a job that
asked for one, and for every multi-worker job: TensorFlow's gRPC ports have no
authentication), and the ports its workers are given there. Standard library only (the
leader runs with `python -I -S`, and imports this beside it).
"""

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


# Set once this process made the job's private network (before it gave up root, for a job
# with an identity of its own): the job is in it already.
_MADE = False


def private_network() -> None:
    """Move this process into a new network namespace whose only interface is loopback
    (a container job's containers are in it too: see leader.py's `_CONTAINER`).

    As root a plain network namespace; otherwise inside a user namespace that maps us to
    ourselves (no privilege is gained outside it). Raises OSError if neither is allowed.
    """
    global _MADE
    if _MADE:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
    _MADE = True


def free_ports(n: int) -> list:
    # Inside the job's own network namespace nothing else binds, so there is no race
    # between picking a port here and a worker binding it.
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def entered_or_refusal(who: str) -> dict | None:
    """Enter a private network namespace; on failure, say so in the log and return the
    job's result (it must not run with its ports exposed)."""
    try:
        private_network()
    except OSError as e:
        print(
            f"gpuhop: cannot create a private network namespace ({e.strerror}). {who},"
            " so that TensorFlow's unauthenticated gRPC ports are not exposed"
            " to other hosts. Allow unprivileged user namespaces"
            " (sysctl kernel.unprivileged_userns_clone=1) or run the agent as root.",
            flush=True,
        )
        return {"exit_code": 1, "signal": None, "detail": "no private network for the job"}
    return None
