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
from gpuhop.serving.errors import ServingError

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
        if np.isnan(inputs["x"]).any():  # as the model answers a bad value: a 400
            raise ServingError(400, "no NaN here")
        if np.isinf(inputs["x"]).any():  # a fault of the server's own
            raise RuntimeError("out of luck")
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
    assert isinstance(bad, ServingError) and (bad.status, bad.message) == (400, "no NaN here")
    assert isinstance(good, dict) and isinstance(other, dict)
    np.testing.assert_array_equal(other["y"], np.full((1, 3), 6.0))


def test_a_model_that_fails_unexpectedly_answers_500_and_the_batcher_goes_on(capfd):
    model = Doubler()
    batcher = Batcher(model, max_batch_size=2, timeout=LONG)

    async def main() -> list[object]:
        try:
            first = await asyncio.gather(
                batcher.predict(request(1, fill=np.inf)),
                batcher.predict(request(1)),
                return_exceptions=True,
            )
            second = await asyncio.gather(batcher.predict(request(1)), batcher.predict(request(1)))
            return [*first, *second]
        finally:
            await batcher.close()

    failed, good, *later = asyncio.run(main())
    assert isinstance(failed, ServingError) and failed.status == 500
    assert failed.message == "RuntimeError: out of luck"
    assert isinstance(good, dict) and all(isinstance(r, dict) for r in later)
    assert "out of luck" in capfd.readouterr().err  # the job's log has the traceback


def test_a_fault_in_the_batcher_itself_fails_its_batch_and_not_the_next():
    """The model answers something that cannot be split (not arrays): every request of that
    batch gets a 500, and the next batch is served as usual."""
    calls = []

    def broken_then_fine(signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        calls.append(inputs["x"].shape)
        if len(calls) == 1:
            return {"y": [1, 2]}  # type: ignore[dict-item]
        return {"y": inputs["x"] * 2}

    batcher = Batcher(broken_then_fine, max_batch_size=2, timeout=LONG)
    a, b, c, d = run(batcher, request(1), request(1), request(1, fill=2), request(1, fill=3))
    for failed in (a, b):
        assert isinstance(failed, ServingError) and failed.status == 500
        assert "AttributeError" in failed.message
    assert isinstance(c, dict) and isinstance(d, dict)
    np.testing.assert_array_equal(d["y"], np.full((1, 3), 6.0))


def test_a_signature_with_outputs_not_per_example_is_never_batched():
    """A [3] list of labels next to the rows, or a scalar: each request runs alone, so its
    answer is the one it would get without batching."""
    model = Doubler()
    batcher = Batcher(model, max_batch_size=4, timeout=LONG)
    whole = Signature("serving_default", SIGS["serving_default"].inputs, ("y",), batchable=False)
    reqs = [Predict(whole, {"x": np.ones((1, 3), F32)}, 1, False) for _ in range(3)]
    run(batcher, *reqs)
    assert model.calls == [("serving_default", (1, 3))] * 3


def test_outputs_that_turn_out_not_per_example_are_not_split():
    """The signature promised rows, the values are not (a total over the batch): each
    request runs again alone and gets its own total, never a share of the batch's."""

    def total(signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"] * 2, "total": np.array([inputs["x"].sum()])}

    batcher = Batcher(total, max_batch_size=3, timeout=LONG)
    results = run(batcher, request(1, fill=1), request(1, fill=2), request(1, fill=4))
    assert [r["total"].tolist() for r in results] == [[3.0], [6.0], [12.0]]  # type: ignore[index]


@pytest.mark.parametrize("size", [0, 1])
def test_without_batching_every_request_runs_on_its_own(size: int):
    model = Doubler()
    run(Batcher(model, max_batch_size=size, timeout=LONG), request(1), request(1), request(2))
    assert sorted(shape for _, shape in model.calls) == [(1, 3), (1, 3), (2, 3)]
