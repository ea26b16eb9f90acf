"""The model-server proxy's HTTP client (`agent.proxy.upstream`) against real servers on
loopback: uvicorn serving a Starlette app, as a model server does, and raw sockets that
answer as a broken or hostile job might."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gpuhop.agent.proxy import upstream
from gpuhop.agent.proxy.upstream import MAX_HEAD, Pool, UpstreamError, UpstreamTimeout

pytestmark = pytest.mark.timeout(60)


async def echo(request: Request) -> Response:
    body = await request.body()
    peer = request.client.port if request.client else 0
    return Response(body, headers={"x-peer": str(peer)}, media_type="text/plain")


async def chunks(request: Request) -> StreamingResponse:
    async def parts() -> AsyncIterator[bytes]:
        for i in range(5):
            yield b"%d" % i * 1000

    return StreamingResponse(parts(), media_type="text/plain")


APP = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/chunks", chunks)])


async def with_uvicorn(test: Callable[[int], Awaitable[None]], keep_alive: float = 5) -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(APP, log_level="warning", timeout_keep_alive=keep_alive)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        await test(sock.getsockname()[1])
    finally:
        server.should_exit = True
        await task
        sock.close()


async def with_raw(answer: bytes, test: Callable[[int], Awaitable[None]]) -> None:
    """A server that reads a request and writes `answer` verbatim, then closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        await test(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


async def until(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    """`tests.conftest.wait_until` for a test's own event loop: it runs while this waits."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s: {predicate}")
        await asyncio.sleep(0.02)


def test_requests_share_one_kept_connection():
    async def test(port: int) -> None:
        pool = Pool()
        try:
            peers = set()
            for i in range(20):
                answer = await pool.send(port, "POST", "/echo", {}, b"body %d" % i, 10)
                assert (answer.status, await answer.read(10)) == (200, b"body %d" % i)
                peers.add(answer.headers["x-peer"])
            assert len(peers) == 1
        finally:
            pool.close()

    asyncio.run(with_uvicorn(test))


def test_a_connection_the_server_closed_is_replaced():
    async def test(port: int) -> None:
        pool = Pool()
        try:
            first = await pool.send(port, "POST", "/echo", {}, b"one", 10)
            assert await first.read(10) == b"one"
            kept = pool._idle[("", port)][0]
            await until(kept.reader.at_eof)  # past the server's keep-alive: it closed its end
            second = await pool.send(port, "POST", "/echo", {}, b"two", 10)
            assert await second.read(10) == b"two"
            assert second.headers["x-peer"] != first.headers["x-peer"]
        finally:
            pool.close()

    asyncio.run(with_uvicorn(test, keep_alive=0.1))


def test_an_idle_connection_is_closed_after_a_while(monkeypatch):
    """A model server that ends must not leave the agent holding its connections: an idle
    one closes itself after IDLE_SECONDS, though the server would keep it (60 s here)."""
    monkeypatch.setattr(upstream, "IDLE_SECONDS", 0.2)

    async def test(port: int) -> None:
        pool = Pool()
        try:
            answer = await pool.send(port, "POST", "/echo", {}, b"one", 10)
            assert await answer.read(10) == b"one"
            kept = pool._idle[("", port)][0]
            await until(lambda: ("", port) not in pool._idle)
            assert kept.writer.is_closing()
            again = await pool.send(port, "POST", "/echo", {}, b"two", 10)
            assert await again.read(10) == b"two"
            assert again.headers["x-peer"] != answer.headers["x-peer"]
        finally:
            pool.close()

    asyncio.run(with_uvicorn(test, keep_alive=60))


def test_a_chunked_answer_streams_whole():
    async def test(port: int) -> None:
        pool = Pool()
        try:
            answer = await pool.send(port, "GET", "/chunks", {}, None, 10)
            assert answer.length is None
            body = b"".join([c async for c in answer.stream(10)])
            assert body == b"".join(b"%d" % i * 1000 for i in range(5))
        finally:
            pool.close()

    asyncio.run(with_uvicorn(test))


def test_an_answer_ended_by_close_is_read_to_the_end():
    async def test(port: int) -> None:
        pool = Pool()
        try:
            answer = await pool.send(port, "GET", "/", {}, None, 10)
            assert await answer.read(10) == b"until the end"
        finally:
            pool.close()

    asyncio.run(with_raw(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end", test))


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "the answer is not HTTP"),
        (b"HTTP/1.1 200 OK\r\nx: " + b"a" * (2 * MAX_HEAD) + b"\r\n\r\n", "headers are larger"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort", "closed the connection mid"),
        (b"", "closed the connection"),
    ],
)
def test_a_broken_answer_is_a_clear_error(answer, error):
    async def test(port: int) -> None:
        pool = Pool()
        try:
            with pytest.raises(UpstreamError, match=error):
                got = await pool.send(port, "GET", "/", {}, None, 10)
                await got.read(10)
        finally:
            pool.close()

    asyncio.run(with_raw(answer, test))


def test_nothing_listening_and_silence():
    async def test() -> None:
        pool = Pool()
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        refused = rf"cannot connect to 127\.0\.0\.1:{port} \(Connection refused\)"
        with pytest.raises(UpstreamError, match=refused):
            await pool.send(port, "GET", "/", {}, None, 10)

        held: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)  # reads nothing, answers nothing

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        try:
            with pytest.raises(UpstreamTimeout, match=r"no answer within 0\.2s"):
                await pool.send(server.sockets[0].getsockname()[1], "GET", "/", {}, None, 0.2)
        finally:
            pool.close()
            for writer in held:
                writer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(test())
