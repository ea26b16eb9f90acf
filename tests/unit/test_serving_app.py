"""The model server's app (`gpuhop.serving.app`) on a real uvicorn server on loopback, in a
thread of its own, with a stand-in model (numpy, no TensorFlow): a big predict request is
parsed, and its answer written, while the server goes on answering other requests.

"While" is proved by order, not by time: a gate holds the big request's parse (or the
writing of its answer) where it is, in the middle of it, until the test has had its other
requests answered. With the parse on the event loop, those requests were answered only
after it: the gate, never opened, gave up after PATIENCE seconds and the test failed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from gpuhop.serving import app as serving_app
from gpuhop.serving.batching import Batcher
from gpuhop.serving.codec import Signature, TensorSpec

pytestmark = pytest.mark.timeout(120)

NAME = "half"
PATH = f"/v1/models/{NAME}:predict"
# The answers to other requests that must come while the big one is held.
OTHERS = 3
# How long the gate or a request waits before the test fails (never reached when it passes).
PATIENCE = 20.0


class Gate:
    """Where a request is held: the first `hold()` waits, in the server, until the test
    opens the gate; later ones (the other requests') pass."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def hold(self) -> None:
        if self.reached.is_set():
            return
        self.reached.set()
        if not self.opened.wait(PATIENCE):
            raise AssertionError("the test never opened the gate")


class HeldSignatures(dict[str, Signature]):
    """The model's signatures, looked up by the parse once the body is read: the lookup of
    an armed map waits at its gate."""

    def __init__(self, signatures: dict[str, Signature]) -> None:
        super().__init__(signatures)
        self.gate: Gate | None = None

    def get(self, key: str, default: Any = None) -> Any:
        if self.gate is not None:
            self.gate.hold()
        return super().get(key, default)


class HeldOutputs(dict[str, np.ndarray]):
    """A model's outputs whose names, asked for first by the writing of the answer, wait at
    the gate."""

    def __init__(self, outputs: dict[str, np.ndarray], gate: Gate) -> None:
        super().__init__(outputs)
        self.gate = gate

    def __iter__(self) -> Iterator[str]:
        self.gate.hold()
        return super().__iter__()


class Server:
    """The app on uvicorn, on a loopback port the kernel picks, in a thread and event loop
    of its own (the test's requests must not depend on the server's loop)."""

    def __init__(self, signatures: dict[str, Signature], run: Callable[..., Any]) -> None:
        batcher = Batcher(run, max_batch_size=1, timeout=0)
        app = serving_app.create_app(NAME, signatures, dict, batcher)
        self.sock = socket.create_server(("127.0.0.1", 0))
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=asyncio.run, args=(self.server.serve(sockets=[self.sock]),)
        )
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(PATIENCE)
        self.sock.close()


SIGNATURES = {
    "serving_default": Signature(
        "serving_default", {"x": TensorSpec(np.dtype(np.float32), (None, 4))}, ("y",)
    )
}
ROWS = 4096  # a body of some 100 KB, an answer of 16,384 values: both done in a thread


def big_body() -> bytes:
    body = json.dumps({"instances": [[0.5, 1.0, 1.5, 2.0]] * ROWS}).encode()
    assert len(body) > serving_app.INLINE_BYTES
    assert ROWS * 4 > serving_app.INLINE_VALUES
    return body


def double(signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"y": inputs["x"] * 2}


def others_while_held(url: str, gate: Gate, big: Future[httpx.Response]) -> list[int]:
    """Once the big request is at the gate: a status and a small predict request, OTHERS
    times, each answered before the gate opens; then the gate opens."""
    try:
        while not gate.reached.wait(0.1):
            if big.done():  # it never reached the gate: say how it ended
                pytest.fail(f"the big request was answered without being held: {big.result()}")
        statuses = []
        with httpx.Client(base_url=url, timeout=PATIENCE) as client:
            for _ in range(OTHERS):
                statuses.append(client.get(f"/v1/models/{NAME}").status_code)
                small = client.post(PATH, json={"instances": [[1.0, 2.0, 3.0, 4.0]]})
                assert small.json() == {"predictions": [[2.0, 4.0, 6.0, 8.0]]}
        assert not big.done(), "the others were answered only once the big request was"
        return statuses
    finally:
        gate.opened.set()


def test_a_big_request_is_parsed_while_other_requests_are_answered():
    signatures = HeldSignatures(SIGNATURES)
    gate = Gate()
    with Server(signatures, double) as server, ThreadPoolExecutor(1) as pool:
        body = big_body()
        signatures.gate = gate  # only the big request's parse looks the signature up now
        big = pool.submit(httpx.post, f"{server.url}{PATH}", content=body, timeout=PATIENCE * 2)
        assert others_while_held(server.url, gate, big) == [200] * OTHERS
        answer = big.result()
    assert answer.status_code == 200
    assert answer.json() == {"predictions": [[1.0, 2.0, 3.0, 4.0]] * ROWS}


def test_a_big_answer_is_written_while_other_requests_are_answered():
    gate = Gate()
    held: list[bool] = []

    def run(signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = double(signature, inputs)
        if len(inputs["x"]) < ROWS:
            return outputs
        held.append(True)
        return HeldOutputs(outputs, gate)

    with Server(SIGNATURES, run) as server, ThreadPoolExecutor(1) as pool:
        big = pool.submit(
            httpx.post, f"{server.url}{PATH}", content=big_body(), timeout=PATIENCE * 2
        )
        assert others_while_held(server.url, gate, big) == [200] * OTHERS
        answer = big.result()
    assert held == [True]
    assert answer.status_code == 200
    assert answer.json() == {"predictions": [[1.0, 2.0, 3.0, 4.0]] * ROWS}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        # The last row's value is no number: the same words as a small body's.
        (
            b'{"instances": [' + b"[1.0, 2.0, 3.0, 4.0], " * ROWS + b'[1.0, 2.0, 3.0, "x"]]}',
            f"Failed to process element: {ROWS} of 'instances' list. Error: INVALID_ARGUMENT:"
            ' JSON Value: "x" Type: String is not of expected type: float',
        ),
        # Nested deeper than Python's parser goes, read in a thread.
        (
            b'{"instances": ' + b"[" * 30000 + b"]" * 30000 + b"}",
            "JSON Parse error: the document is nested too deeply",
        ),
        (
            b'{"instances": [' + b" " * 20000 + b"}",
            "JSON Parse error: Invalid value. at offset: 20015",
        ),
    ],
)
def test_a_big_bad_request_is_refused_as_a_small_one_is(body, error):
    assert len(body) > serving_app.INLINE_BYTES
    with Server(SIGNATURES, double) as server:
        answer = httpx.post(f"{server.url}{PATH}", content=body, timeout=PATIENCE)
    assert (answer.status_code, answer.json()) == (400, {"error": error})
