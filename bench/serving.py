"""Serving: the digits demo's SavedModel under 32 concurrent clients, through the agent's
proxy, with dynamic batching (`gpuhop serve`'s default: up to 32 rows, 2 ms) and without
(`--max-batch-size 1`); and with batching, through the agent next to straight at the
server's loopback port. The server listens only inside its job's own network namespace (no
other process on the host reaches it), so the straight load runs in there (`nsenter`, which
needs root: without it those two rows are left out).

The model is trained by a real job (two epochs) and served from its artifacts by two
model server jobs. Each client sends one-digit :predict requests (row format) one after
another over its own keep-alive connection; a sample is the whole run's throughput, and
the 99th percentile of its request latencies. Clients, agent and servers share the
machine's CPUs, as they would on a one-box GPU host.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from harness import REPO, BenchError, Row, Settings, percentile, private_agent

from gpuhop.home import AgentPaths

NAME = "serving"
CLIENTS = 32
PIXELS = [[0.5] * 64]


async def load(client: httpx.AsyncClient, url: str, per_client: int) -> tuple[float, list[float]]:
    """(requests per second, latencies in ms) of CLIENTS clients, each sending in turn."""
    body = json.dumps({"instances": PIXELS}).encode()
    headers = {"content-type": "application/json"}
    latencies: list[float] = []

    async def one_client() -> None:
        for _ in range(per_client):
            start = time.perf_counter()
            answer = await client.post(url, content=body, headers=headers)
            latencies.append((time.perf_counter() - start) * 1000)
            answer.raise_for_status()

    for _ in range(3):  # warm-up: connections, the first calls of each batch size
        await asyncio.gather(
            *(client.post(url, content=body, headers=headers) for _ in range(CLIENTS))
        )
    start = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
    return len(latencies) / (time.perf_counter() - start), latencies


def measure(base: str, transport: httpx.AsyncBaseTransport | None, model: str, n: int):
    async def main() -> tuple[float, list[float]]:
        limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
        async with httpx.AsyncClient(
            base_url=base, transport=transport, limits=limits, timeout=120
        ) as client:
            return await load(client, f"/v1/models/{model}:predict", n)

    return asyncio.run(main())


def job_pid(job_id: str) -> int:
    """A process of the job (found by its GPUHOP_JOB_ID), to enter its network namespace."""
    mark = f"GPUHOP_JOB_ID={job_id}".encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue  # gone, or not ours to read
    raise BenchError(f"no process of job {job_id} found")


def measure_inside(job_id: str, port: int, model: str, n: int) -> tuple[float, list[float]]:
    """`measure` straight at the server's port, from inside its job's network namespace."""
    argv = ["nsenter", "-t", str(job_pid(job_id)), "-n", sys.executable, __file__]
    done = subprocess.run(
        [*argv, f"http://127.0.0.1:{port}", model, str(n)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise BenchError(f"the load inside job {job_id}'s network failed: {done.stderr[-2000:]}")
    rate, latencies = json.loads(done.stdout)
    return rate, latencies


def run(settings: Settings) -> list[Row]:
    repeats = settings.repeats(default=3, quick=1)
    per_client = 10 if settings.quick else 40
    keys = ["batched", "unbatched"] + (["direct"] if os.geteuid() == 0 else [])
    samples: dict[str, list[tuple[float, float]]] = {key: [] for key in keys}
    with (
        tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp,
        private_agent(Path(tmp) / "agent") as agent,
        agent.client() as client,
    ):
        trainer = client.submit(["train.py", "--epochs", "2"], workdir=REPO / "examples" / "digits")
        if trainer.wait(timeout=600).state.value != "succeeded":
            raise BenchError(f"training the demo failed: {trainer.info.reason}")
        models = {
            "batched": client.serve(trainer, name="batched"),
            "unbatched": client.serve(trainer, name="unbatched", max_batch_size=1),
        }
        sock = str(AgentPaths(agent.home).socket)
        try:
            for _ in range(repeats):
                for key in keys:
                    model = models["batched" if key == "direct" else key]
                    if key == "direct":
                        port = model.info.port
                        rate, latencies = measure_inside(model.job.id, port, model.name, per_client)
                    else:
                        base = f"http://agent/v1/serve/{model.info.job}"
                        transport = httpx.AsyncHTTPTransport(uds=sock)
                        rate, latencies = measure(base, transport, model.name, per_client)
                    samples[key].append((rate, percentile(latencies, 99)))
            stats = models["batched"].stats()
        finally:
            for model in models.values():
                model.job.cancel(grace=5)
    rate = {k: [s[0] for s in v] for k, v in samples.items()}
    p99 = {k: [s[1] for s in v] for k, v in samples.items()}
    total = CLIENTS * per_client
    note = f"{CLIENTS} clients x {per_client} one-digit requests per sample; local agent socket"
    batches = (
        f"; batched server: {stats['requests']} requests in {stats['model_calls']} model calls,"
        f" largest {stats['largest_batch']}"
    )
    rows = [
        Row(NAME, f"throughput, {CLIENTS} clients, batching", "req/s", rate["batched"],
            "no batching", rate["unbatched"], note + batches),
        Row(NAME, f"p99 latency, {CLIENTS} clients, batching", "ms", p99["batched"],
            "no batching", p99["unbatched"], f"{total} requests per sample"),
    ]  # fmt: skip
    if "direct" not in samples:
        return rows
    return [
        *rows,
        Row(NAME, "throughput through the agent (batching)", "req/s", rate["batched"],
            "server's loopback port directly", rate["direct"], "the proxy's cost"),
        Row(NAME, "p99 latency through the agent (batching)", "ms", p99["batched"],
            "server's loopback port directly", p99["direct"], ""),
    ]  # fmt: skip


if __name__ == "__main__":  # measure_inside's load, in the job's network namespace
    base, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print(json.dumps(measure(base, None, model, n)))
