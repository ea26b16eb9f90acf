"""Runs on the GPU host, in the leader of a job with a private network: lets the agent reach
the job's ports. Standard library only (the leader runs with `python -I -S`).

A private network namespace has only its own loopback, so the agent (outside it) cannot
connect to a port there. Unix sockets are not network-namespaced, though: the leader, inside
the namespace, listens on a Unix socket in the job's dir (mode 0600, in the agent's 0700
state dir, so only the agent's user reaches it) and connects each connection it accepts
to 127.0.0.1:PORT inside the namespace. Nothing listens on any network address for this.

Why a relay rather than the agent entering the namespace with setns(2): for an agent that
is not root the namespace belongs to a user namespace the leader made, and a process can only
join a user namespace while it is single-threaded, which the agent never is. The relay
works the same for root and non-root agents, and the agent needs no privilege at all.

Protocol, per connection: the agent sends the port as 2 bytes (big-endian); the relay
answers 1 byte, 0 if it connected, else the errno of the failed connect (capped at 255).
With the 0 comes the connected socket itself (SCM_RIGHTS), and the relay is done: the
agent reads and writes the job's port directly, with no copy through this process (a
remote TensorFlow op is many small messages, and each hop costs every one of them). An
older leader's relay sent the 0 alone and then moved the bytes itself; the agent still
takes that from jobs that outlived an agent upgrade.
"""

import contextlib
import errno
import os
import socket
import struct
import threading

CONNECT_TIMEOUT = 5.0
LOOPBACKS = (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6))


def listen(path: str) -> socket.socket:
    """The relay's listening socket at `path` (replacing a stale one), mode 0600."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # no moment where another user could connect
    try:
        server.bind(path)
    finally:
        os.umask(old)
    server.listen(128)
    return server


def start(path: str) -> socket.socket:
    """Listen at `path` and serve connections on a daemon thread; returns the listener."""
    return serve(listen(path))


def serve(server: socket.socket) -> socket.socket:
    """Serve a listener's connections on a daemon thread; returns the listener."""
    threading.Thread(target=_accept_loop, args=(server,), name="relay", daemon=True).start()
    return server


def _accept_loop(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return  # closed
        threading.Thread(target=_serve, args=(conn,), daemon=True).start()


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _connect(port: int) -> socket.socket:
    error: OSError = OSError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))
    for host, family in LOOPBACKS:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect((host, port))
        except OSError as e:
            sock.close()
            error = e
            continue
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise error


def _serve(conn: socket.socket) -> None:
    with conn:
        header = _recv_exactly(conn, 2)
        if len(header) != 2:
            return
        (port,) = struct.unpack("!H", header)
        try:
            target = _connect(port)
        except OSError as e:
            with contextlib.suppress(OSError):
                conn.sendall(bytes([min(e.errno or errno.ETIMEDOUT, 255)]))
            return
        with target, contextlib.suppress(OSError):
            # The agent now holds the connection; this process's copy closes.
            socket.send_fds(conn, [b"\x00"], [target.fileno()])
