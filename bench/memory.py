"""Agent memory: what large work dirs and datasets cost the agent, as its peak RSS (VmHWM)
over its RSS when idle, each case on a fresh agent (a peak never comes down).

The cases: one upload of a tree of N files (100,000; 20,000 with --quick), four such
uploads at once, four dataset manifests of N files at once (their chunks not on the agent,
so each is parsed and answered 409: the parse is the cost), and three jobs submitted and run
from one N-file tree. Trees name one stored 1-byte blob, so the numbers are the agent's
bookkeeping, not file data. Next to each: the size of the body sent, as the yardstick.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import Row, Settings, private_agent

from gpuhop import Client
from gpuhop.client.sync.upload import send_files
from gpuhop.client.sync.workdir import FileEntry
from gpuhop.home import AgentPaths, read_pid

NAME = "memory"
BLOB = b"x"
DIGEST = hashlib.sha256(BLOB).hexdigest()
JSON = {"content-type": "application/json"}


def tree(files: int, tag: str) -> bytes:
    entries = [
        {"path": f"{tag}/dir{i // 1000}/module_{i:06d}.py", "digest": DIGEST, "size": 1}
        for i in range(files)
    ]
    return json.dumps({"entries": entries}, separators=(",", ":")).encode()


def manifest(files: int, tag: str) -> bytes:
    entries = [
        {"path": f"{tag}/d{i // 1000}/f{i:06d}.tfrecord", "size": 1, "chunks": ["ab" * 32]}
        for i in range(files)
    ]
    return json.dumps({"files": entries}, separators=(",", ":")).encode()


def status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def peak_over_idle(work: Callable[[Client, Path], None]) -> float:
    """MB the agent's peak RSS rose to over its idle RSS while `work` ran."""
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-memory-") as tmp:
        root = Path(tmp)
        with private_agent(root) as agent:
            pid = read_pid(AgentPaths(agent.home))
            assert pid is not None
            blob = root / "x"
            blob.write_bytes(BLOB)
            with agent.client() as client:
                send_files(client.session, [FileEntry("x", str(blob), 1, DIGEST, False)], None)
                idle = status_mb(pid, "VmRSS")
                work(client, root)
            return status_mb(pid, "VmHWM") - idle


def run(settings: Settings) -> list[Row]:
    files = 20_000 if settings.quick else 100_000

    def post_all(client: Client, path: Callable[[int], str], bodies: list[bytes]) -> None:
        def post(i: int) -> None:
            # Answered 201, or 409 for a manifest whose chunks are not here: either is fine.
            with Client(client.paths.home, autostart=False) as own:
                own.session.http.post(path(i), content=bodies[i], headers=JSON, timeout=600)

        with ThreadPoolExecutor(len(bodies)) as pool:
            list(pool.map(post, range(len(bodies))))

    one = tree(files, "one")
    four = [tree(files, f"t{i}") for i in range(4)]
    manifests = [manifest(files, f"m{i}") for i in range(4)]

    def jobs(client: Client, _root: Path) -> None:
        stored = client.session.request("POST", "/v1/trees", content=one, headers=JSON)
        digest = stored.json()["digest"]
        ids = [
            client.session.request(
                "POST", "/v1/jobs", json={"command": ["true"], "tree": digest}
            ).json()["id"]
            for _ in range(3)
        ]
        for job_id in ids:
            client.job(job_id).wait(600)

    mb = 1 / 2**20
    cases = [
        (
            f"one tree of {files:,} files",
            lambda c, _r: c.session.request("POST", "/v1/trees", content=one, headers=JSON),
            len(one) * mb,
        ),
        (
            f"4 trees of {files:,} files at once",
            lambda c, _r: post_all(c, lambda i: "/v1/trees", four),
            sum(map(len, four)) * mb,
        ),
        (
            f"4 dataset manifests of {files:,} files at once",
            lambda c, _r: post_all(c, lambda i: f"/v1/datasets/m{i}", manifests),
            sum(map(len, manifests)) * mb,
        ),
        (f"3 jobs of one {files:,}-file tree, submitted and run", jobs, len(one) * mb),
    ]
    return [
        Row(
            NAME,
            f"agent peak RSS over idle: {what}",
            "MB",
            [peak_over_idle(work) for _ in range(settings.repeats(1, 1))],
            "the bodies' own size",
            [size],
        )
        for what, work, size in cases
    ]
