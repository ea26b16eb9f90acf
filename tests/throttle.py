"""A slow TCP link for the tests: a loopback port that forwards to a server, passing the
server's bytes at a bounded rate, recording what clients sent (their request headers), and
that a test can cut (every connection closed, new ones closed at once, as a server that died
would) and mend, or stall after a number of bytes (`limit`: a download is then surely under
way and unfinished, however slow the machine). Its threads end when it closes."""

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
        self._changed = threading.Condition(self._lock)
        self._budget: int | None = None  # the server's bytes still passed; None: no bound
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

    def limit(self, budget: int | None) -> None:
        """Pass at most `budget` more bytes of the server's answers (all connections
        together), then hold the rest, the connections open (a stalled server), until a
        `limit` that allows more; None: no bound."""
        with self._changed:
            self._budget = budget
            self._changed.notify_all()

    def cut(self) -> None:
        """Close every connection; new ones are closed as they come, until `mend`."""
        with self._changed:
            self._down = True
            self._changed.notify_all()  # a held answer is dropped with its connection
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
                    continue
                while data:
                    n = self._allowed(len(data))
                    dst.sendall(data[:n])
                    data = data[n:]
                    time.sleep(n / self.rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _allowed(self, wanted: int) -> int:
        """How many of `wanted` bytes of an answer may pass now: waits while the budget is
        spent; OSError once the link is cut or closed."""
        with self._changed:
            while self._budget == 0 and not (self._down or self._closed):
                self._changed.wait()
            if self._down or self._closed:
                raise OSError("the link was cut")
            n = wanted if self._budget is None else min(wanted, self._budget)
            if self._budget is not None:
                self._budget -= n
            return n
