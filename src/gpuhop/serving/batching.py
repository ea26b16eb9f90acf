"""Runs in the serving job: dynamic batching of concurrent predict requests.

Requests wait in one list, in arrival order; a single worker task takes the oldest and
gathers every waiting request that can be stacked with it (the same signature, input
dtypes and shapes past the first dimension: `Predict.batch_key`), oldest first, until the
batch holds `max_batch_size` rows or the oldest has waited `timeout` seconds. It runs the
model once, in a thread so the event loop keeps accepting requests, and hands each
request its own rows of the outputs. Requests of other shapes stay in the list for a
batch of their own. A request with `max_batch_size` rows or more, whose inputs share no
first dimension, or whose signature has an output that is not one row per example
(`Signature.batchable`), runs alone at once and never waits: batching never changes an
answer. A failed model call in a batch is retried request by request, so each request
gets its own error; any other failure is answered to every request of the batch as a 500
and logged, and the worker goes on with the next batch.

With `max_batch_size` 1 (or 0) there is no batching: every request runs at once, in its
own thread, concurrently with the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpuhop.serving.codec import Predict
from gpuhop.serving.errors import ServingError, internal

# Runs the model: (signature name, inputs) -> outputs, in a worker thread.
RunFn = Callable[[str, dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass
class _Waiting:
    request: Predict
    future: asyncio.Future[dict[str, np.ndarray]]
    arrived: float = field(default_factory=time.monotonic)


@dataclass
class BatchStats:
    """What the batcher did: how many requests each model call served."""

    requests: int = 0
    calls: int = 0
    rows: int = 0
    # requests per model call -> how many calls had that many
    requests_per_call: Counter[int] = field(default_factory=Counter)

    def record(self, requests: int, rows: int) -> None:
        self.requests += requests
        self.calls += 1
        self.rows += rows
        self.requests_per_call[requests] += 1

    def to_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "model_calls": self.calls,
            "rows": self.rows,
            "largest_batch": max(self.requests_per_call, default=0),
            "requests_per_call": {str(k): v for k, v in sorted(self.requests_per_call.items())},
        }


class Batcher:
    def __init__(self, run: RunFn, max_batch_size: int, timeout: float):
        self.run = run
        self.max_batch_size = max_batch_size
        self.timeout = timeout
        self.stats = BatchStats()
        self._waiting: list[_Waiting] = []
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 1

    async def predict(self, request: Predict) -> dict[str, np.ndarray]:
        """The model's outputs for `request` alone (its rows of a batch's outputs)."""
        rows = request.rows
        if (
            not self.batching
            or not request.signature.batchable
            or rows is None
            or rows >= self.max_batch_size
        ):
            outputs = await asyncio.to_thread(self.run, request.signature.name, request.inputs)
            self.stats.record(1, rows or 0)
            return outputs
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work(), name="batcher")
        waiting = _Waiting(request, asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        self._wake.set()
        return await waiting.future

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    async def _work(self) -> None:
        while True:
            while not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            oldest = self._waiting[0]
            # Wait for company until the batch is full or the oldest has waited long enough.
            while True:
                batch = self._gather(oldest)
                left = oldest.arrived + self.timeout - time.monotonic()
                if sum(w.request.rows or 0 for w in batch) >= self.max_batch_size or left <= 0:
                    break
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            taken = {id(w) for w in batch}
            self._waiting = [w for w in self._waiting if id(w) not in taken]
            try:
                await self._run(batch)
            except Exception as e:
                # A fault of the server's, not of a request: every request of the batch
                # hears of it, and the next batch runs as usual.
                error = internal(e, f"running a batch of {len(batch)} predict requests")
                for w in batch:
                    _settle(w, error=error)

    def _gather(self, oldest: _Waiting) -> list[_Waiting]:
        """The waiting requests that fit in one batch with `oldest`, oldest first."""
        key, rows, batch = oldest.request.batch_key, 0, []
        for w in self._waiting:
            n = w.request.rows or 0
            if w.request.batch_key == key and rows + n <= self.max_batch_size:
                batch.append(w)
                rows += n
        return batch

    async def _run(self, batch: list[_Waiting]) -> None:
        if len(batch) == 1:
            await self._run_alone(batch[0])
            return
        first = batch[0].request
        sizes = [w.request.rows or 0 for w in batch]
        total = sum(sizes)
        inputs = {
            name: np.concatenate([w.request.inputs[name] for w in batch]) for name in first.inputs
        }
        try:
            outputs = await asyncio.to_thread(self.run, first.signature.name, inputs)
        except Exception:
            outputs = {}  # one bad request must not fail the others: each runs alone
        if not outputs or any(o.ndim == 0 or o.shape[0] != total for o in outputs.values()):
            # The batch failed, or an output is not one row per example after all (its
            # signature said so; the values say otherwise): each request runs on its own,
            # and gets the answer it would have got alone.
            for w in batch:
                await self._run_alone(w)
            return
        self.stats.record(len(batch), total)
        start = 0
        for w, n in zip(batch, sizes, strict=True):
            _settle(w, {k: v[start : start + n] for k, v in outputs.items()})
            start += n

    async def _run_alone(self, w: _Waiting) -> None:
        request = w.request
        try:
            result = await asyncio.to_thread(self.run, request.signature.name, request.inputs)
        except ServingError as e:
            _settle(w, error=e)
        except Exception as e:
            _settle(w, error=internal(e, "running a predict request"))
        else:
            _settle(w, result)
        self.stats.record(1, request.rows or 0)


def _settle(
    w: _Waiting, result: dict[str, np.ndarray] | None = None, error: Exception | None = None
) -> None:
    # A request whose client went away has a cancelled future: nothing to hand it.
    if w.future.done():
        return
    if error is not None:
        w.future.set_exception(error)
    else:
        w.future.set_result(result or {})
