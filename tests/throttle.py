"""A slow TCP link for the tests: a loopback port that forwards to a server, passing the
server's bytes at a bounded rate, recording what clients sent (their request headers), and
that a test can cut (every connection closed, new ones closed at once, as a server that died
would) and mend. Its threads end when it closes."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType

PIECE = 16 << 10


class Link:
    def __init__(self, upstream: tuple[str, int], rate: int):
        """Forward 127.0.0.1:`self.port` to `upstream`, its answers at `rate` bytes/s."""
        self.upstream = upstream
        self.rate = rate
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sent = bytearray()
        self._open: list[socket.socket] = []  # connections up now
        self._all: list[socket.socket] = []  # every socket made, closed at the end
        self._down = False
        self._closed = False
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sent(self) -> str:
        """What clients sent through the link so far, as text."""
        with self._lock:
            return self._sent.decode(errors="replace")

    def cut(self) -> None:
        """Close every connection; new ones are closed as they come, until `mend`."""
        with self._lock:
            self._down = True
            conns, self._open = self._open, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def mend(self) -> None:
        with self._lock:
            self._down = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for thread in self._threads:
            thread.join(timeout=10)
        for conn in self._all:
            conn.close()

    def __enter__(self) -> Link:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                down = self._down
            if down:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
                self._all += [client, server]
            for args in ((client, server, False), (server, client, True)):
                thread = threading.Thread(target=self._pump, args=args, daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        try:
            while True:
                data = src.recv(PIECE)
                if not data:
                    break
                if not slow:
                    with self._lock:
                        self._sent += data
                dst.sendall(data)
                if slow:
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
