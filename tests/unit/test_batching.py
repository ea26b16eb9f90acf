"""The batcher (gpuhop.serving.batching) with a numpy model: what goes into each call.

The "model" doubles its input and records the shape of every call; the batcher under test
is the real one. Batches that must fill are given a long timeout, so filling them, not the
clock, is what ends the wait.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from gpuhop.serving.batching import Batcher
from gpuhop.serving.codec import Predict, Signature, TensorSpec

F32 = np.dtype("float32")
SIGS = {
    name: Signature(name, {"x": TensorSpec(F32, None)}, ("y",)) for name in ("serving_default", "b")
}
LONG = 60.0  # seconds: a batch that waits this long has failed the test long before


class Doubler:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        self.lock = threading.Lock()

    def __call__(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.lock:
            self.calls.append((signature, inputs["x"].shape))
        if signature == "bad" or np.isnan(inputs["x"]).any():
            raise ValueError("no NaN here")
        return {"y": inputs["x"] * 2}


def request(rows: int, width: int = 3, signature: str = "serving_default", fill=1.0) -> Predict:
    x = np.full((rows, width), fill, dtype=F32)
    return Predict(
        SIGS.get(signature) or Signature(signature, SIGS["b"].inputs, ("y",)), {"x": x}, rows, False
    )


def run(batcher: Batcher, *requests: Predict) -> list[object]:
    async def main() -> list[object]:
        try:
            return await asyncio.gather(
                *(batcher.predict(r) for r in requests), return_exceptions=True
            )
        finally:
            await batcher.close()

    return asyncio.run(main())


def test_concurrent_requests_share_one_model_call_and_get_their_own_rows():
    model = Doubler()
    batcher = Batcher(model, max_batch_size=6, timeout=LONG)
    reqs = [request(1, fill=1), request(2, fill=2), request(3, fill=3)]
    results = run(batcher, *reqs)
    assert model.calls == [("serving_default", (6, 3))]
    for req, result in zip(reqs, results, strict=True):
        assert isinstance(result, dict)
        np.testing.assert_array_equal(result["y"], req.inputs["x"] * 2)
    assert batcher.stats.to_json()["requests_per_call"] == {"3": 1}


def test_other_shapes_and_signatures_are_batched_separately():
    model = Doubler()
    batcher = Batcher(model, max_batch_size=2, timeout=LONG)
    run(
        batcher,
        request(1, width=3),
        request(1, width=4),
        request(1, width=3),
        request(1, width=4, signature="b"),
        request(1, width=4),
        request(1, width=4, signature="b"),
    )
    assert sorted(model.calls) == [
        ("b", (2, 4)),
        ("serving_default", (2, 3)),
        ("serving_default", (2, 4)),
    ]


def test_a_request_as_large_as_a_batch_runs_alone_at_once():
    model = Doubler()
    batcher = Batcher(model, max_batch_size=4, timeout=LONG)
    [result] = run(batcher, request(5))
    assert model.calls == [("serving_default", (5, 3))]
    assert isinstance(result, dict) and result["y"].shape == (5, 3)


def test_a_lone_request_runs_when_its_wait_is_over():
    model = Doubler()
    run(Batcher(model, max_batch_size=8, timeout=0.001), request(1))
    assert model.calls == [("serving_default", (1, 3))]


def test_one_bad_request_fails_alone_not_its_batch():
    model = Doubler()
    batcher = Batcher(model, max_batch_size=3, timeout=LONG)
    good, bad, other = run(batcher, request(1), request(1, fill=np.nan), request(1, fill=3))
    assert isinstance(bad, ValueError)
    assert isinstance(good, dict) and isinstance(other, dict)
    np.testing.assert_array_equal(other["y"], np.full((1, 3), 6.0))


@pytest.mark.parametrize("size", [0, 1])
def test_without_batching_every_request_runs_on_its_own(size: int):
    model = Doubler()
    run(Batcher(model, max_batch_size=size, timeout=LONG), request(1), request(1), request(2))
    assert sorted(shape for _, shape in model.calls) == [(1, 3), (1, 3), (2, 3)]
