"""The object cache behind `--data s3://...`, against moto's S3 server (test_bucket_data's):
bounded by `object_cache_size` (the least recently used prefix no job needs goes first),
listed by `gpuhop data ls`, collected by `gpuhop gc`; identical bytes stored once for two
users, each reading them only through their own credentials; versioned buckets; and a fetch
interrupted by an agent SIGKILL or a server gone resuming with a ranged read."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuhop.agent.storage import bucketreads, buckets
from gpuhop.agent.storage.buckets import BucketError, Credentials
from gpuhop.agent.storage.objectdownloads import LATER_BYTES, PART, ObjectId, parts_done
from gpuhop.api import JobState
from gpuhop.client import Client
from gpuhop.home import read_pid
from tests.conftest import Agent, wait_until
from tests.integration import test_tls
from tests.integration.test_bucket_data import (  # the server fixture, and what it holds
    BUCKET,
    OBJECTS,
    S3,
    s3,  # noqa: F401
)
from tests.team import team_agent, team_tokens
from tests.throttle import Link

pytestmark = pytest.mark.timeout(180)

remote = test_tls.remote
CACHE = "gpuhop-cache"
MiB = 1 << 20
PIECES = {f"{p}/blob.bin": os.urandom(2 * MiB) for p in ("a", "b", "c")}
PIECES["shared/one.bin"] = os.urandom(MiB)
PIECES["shared/two.txt"] = b"two\n"

# Prints each file of $GPUHOP_DATA/NAME (path, size, sha256).
READ = """\
import hashlib, os, sys
root = os.path.join(os.environ["GPUHOP_DATA"], sys.argv[1])
for dirpath, dirs, files in sorted(os.walk(root)):
    for name in sorted(files):
        data = open(os.path.join(dirpath, name), "rb").read()
        print("file", os.path.relpath(os.path.join(dirpath, name), root), len(data),
              hashlib.sha256(data).hexdigest(), flush=True)
"""
# Reads its data again and again until cancelled.
HOLD = """\
import hashlib, os, time
root = os.path.join(os.environ["GPUHOP_DATA"], "a")
while True:
    print("read", hashlib.sha256(open(os.path.join(root, "blob.bin"), "rb").read()).hexdigest(),
          flush=True)
    time.sleep(0.1)
"""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _secrets(client: Client, url: str, key_id: str, secret: str) -> None:
    for name, value in (
        ("AWS_ACCESS_KEY_ID", key_id),
        ("AWS_SECRET_ACCESS_KEY", secret),
        ("AWS_ENDPOINT_URL", url),
        ("AWS_REGION", "us-east-1"),
    ):
        client.set_secret(name, value)


def _keys(server: S3) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": server.key_id, "AWS_SECRET_ACCESS_KEY": server.secret}


def _iam_user(server: S3, name: str, actions: list[str]) -> tuple[str, str]:
    """A new IAM user on the server allowed `actions` only: its key id and secret."""
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id=server.key_id,
        aws_secret_access_key=server.secret,
    )
    iam.create_user(UserName=name)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    allow = {"Effect": "Allow", "Action": actions, "Resource": "*"}
    iam.put_user_policy(
        UserName=name,
        PolicyName="some",
        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [allow]}),
    )
    iam.close()
    return key["AccessKeyId"], key["SecretAccessKey"]


@pytest.fixture(scope="module")
def pieces(s3: S3) -> S3:  # noqa: F811
    client = s3.client()
    client.create_bucket(Bucket=CACHE)
    for key, data in PIECES.items():
        client.put_object(Bucket=CACHE, Key=key, Body=data)
    client.close()
    return s3


@pytest.fixture(scope="module")
def tls_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """A team agent whose object cache holds 5 MiB, and whose gc takes any cached prefix
    no job needs."""
    root = Path(tmp_path_factory.mktemp("cache-agent"))
    config = 'object_cache_size = "5MiB"\nobject_keep_days = 0\n'
    with team_agent(root, 0, "--gc-every-hours", "0", config=config) as agent:
        yield agent


@pytest.fixture(scope="module")
def tokens(tls_agent: Agent) -> dict[str, str]:
    return team_tokens(tls_agent)


def _lines(job_output: bytes) -> list[str]:
    return sorted(ln for ln in job_output.decode().splitlines() if ln.startswith("file "))


def _expected(prefix: str, objects: dict[str, bytes]) -> list[str]:
    return sorted(
        f"file {k[len(prefix) :]} {len(v)} {_sha(v)}"
        for k, v in objects.items()
        if k.startswith(prefix)
    )


def test_the_least_recently_used_prefix_no_job_needs_goes_and_gc_takes_the_rest(
    tls_agent: Agent, pieces: S3, project
):
    root = project({"read.py": READ, "hold.py": HOLD})
    with tls_agent.client() as owner:
        _secrets(owner, pieces.url, pieces.key_id, pieces.secret)
        holder = owner.submit("hold.py", workdir=root, data=[f"s3://{CACHE}/a:a"])
        wait_until(lambda: b"read" in b"".join(holder.logs()), timeout=60)
        for name in ("c", "b"):  # c is cached, then b needs its room: c goes, not a
            done = owner.submit(["read.py", name], workdir=root, data=[f"s3://{CACHE}/{name}"])
            assert done.wait(timeout=60).end_class == "succeeded", done.info.reason
        listed = owner.data.cached()
        assert [(c.url, c.objects, c.bytes, c.in_use) for c in listed] == [
            (f"s3://{CACHE}/b/", 1, 2 * MiB, False),
            (f"s3://{CACHE}/a/", 1, 2 * MiB, True),
        ]
        shown = tls_agent.cli("data", "ls")
        assert f"s3://{CACHE}/a/ ({pieces.url})" in shown.stdout, shown.stdout
        # The job still reads its data whole after the eviction.
        offset = len(b"".join(holder.logs()))
        wait_until(lambda: b"read" in b"".join(holder.logs(offset=offset)), timeout=30)
        holder.cancel()
        out = b"".join(holder.logs()).decode().split()
        assert {w for w, _ in zip(out[1::2], out[::2], strict=True)} == {_sha(PIECES["a/blob.bin"])}

        # Larger than the whole cache: refused in so many words, not fetched.
        huge = owner.submit(["read.py", "t"], workdir=root, data=["s3://gpuhop-train/train:t"])
        ended = huge.wait(timeout=60)
        assert ended.end_class == "data-error" and "object_cache_size" in (ended.reason or "")

        would = json.loads(tls_agent.cli("gc", "--dry-run", "--json").stdout)
        assert would["freed"]["objects"] == {"count": 2, "bytes": 4 * MiB}
        assert len(owner.data.cached()) == 2
        before = would["usage"]["storage_bytes"]
        done = owner.gc()
        assert (done.freed["objects"].count, done.freed["objects"].bytes) == (2, 4 * MiB)
        assert before > 4 * MiB > 3 * MiB > done.usage.storage_bytes  # counted, then gone
        assert json.loads(tls_agent.cli("data", "ls", "--cached", "--json").stdout) == []
        assert list(tls_agent.home.glob("objects/*/by-id/*")) == []


def test_two_users_store_the_same_bytes_once_and_each_reads_through_their_own_credentials(
    tls_agent: Agent, pieces: S3, tokens: dict[str, str], remote: Callable[..., Client], project
):
    root = project({"read.py": READ})
    alice, bob, carol = (remote(tokens[u]) for u in ("alice", "bob", "carol"))
    _secrets(alice, pieces.url, pieces.key_id, pieces.secret)
    _secrets(bob, pieces.url, *_iam_user(pieces, "bob", ["s3:*"]))
    # May list the bucket, not read its objects: the cache must not read for it.
    _secrets(carol, pieces.url, *_iam_user(pieces, "lister", ["s3:ListBucket"]))
    shared = f"s3://{CACHE}/shared:shared"
    expected = _expected("shared/", PIECES)
    first = alice.submit(["read.py", "shared"], workdir=root, data=[shared])
    assert first.wait(timeout=60).end_class == "succeeded", first.info.reason
    assert _lines(b"".join(first.logs())) == expected
    mark = pieces.mark()
    second = bob.submit(["read.py", "shared"], workdir=root, data=[shared])
    assert second.wait(timeout=60).end_class == "succeeded", second.info.reason
    assert _lines(b"".join(second.logs())) == expected
    # Bob's own credentials read each object (nothing tells him Alice has it) ...
    assert sorted(r for r in pieces.requests(mark) if r.startswith(f"GET /{CACHE}/shared/")) == [
        f"GET /{CACHE}/shared/one.bin",
        f"GET /{CACHE}/shared/two.txt",
    ]
    # ... and the disk holds the bytes once: both users' files are the one blob.
    big = [p for p in tls_agent.home.glob("objects/*/views/*/one.bin")]
    assert len(big) == 2 and big[0].samefile(big[1])
    assert big[0].samefile(
        tls_agent.paths.blobs / _sha(PIECES["shared/one.bin"])[:2] / _sha(PIECES["shared/one.bin"])
    )
    assert big[0].stat().st_nlink == 5  # the blob, each user's by-id entry and view

    refused = carol.submit(["read.py", "shared"], workdir=root, data=[shared]).wait(timeout=60)
    assert refused.end_class == "data-error" and "AccessDenied" in (refused.reason or "")
    # Each user sees their own cached prefixes only.
    assert [c.url for c in carol.data.cached()] == []
    assert [c.url for c in bob.data.cached()] == [f"s3://{CACHE}/shared/"]


def test_a_versioned_bucket_caches_each_version_by_its_version_id(
    tls_agent: Agent, pieces: S3, tokens: dict[str, str], remote: Callable[..., Client], project
):
    root = project({"read.py": READ})
    alice = remote(tokens["alice"])
    _secrets(alice, pieces.url, pieces.key_id, pieces.secret)
    client = pieces.client()
    client.create_bucket(Bucket="gpuhop-versioned")
    client.put_bucket_versioning(
        Bucket="gpuhop-versioned", VersioningConfiguration={"Status": "Enabled"}
    )
    seen = []
    for text in (b"one\n", b"two\n"):
        put = client.put_object(Bucket="gpuhop-versioned", Key="v/data.txt", Body=text)
        mark = pieces.mark()
        job = alice.submit(["read.py", "v"], workdir=root, data=["s3://gpuhop-versioned/v"])
        assert job.wait(timeout=60).end_class == "succeeded", job.info.reason
        seen += _lines(b"".join(job.logs()))
        gets = [r for r in pieces.requests(mark) if r.startswith("GET /gpuhop-versioned/v/")]
        assert gets == [f"GET /gpuhop-versioned/v/data.txt?versionId={put['VersionId']}"]
    assert seen == [f"file data.txt 4 {_sha(text)}" for text in (b"one\n", b"two\n")]
    client.close()


def test_an_interrupted_fetch_goes_on_from_where_it_stopped(make_agent, s3: S3, project):  # noqa: F811
    """A SIGKILL of the agent, then a server gone for good (the job ends as data-error) and
    back (the next job): each time the next read asks only for the bytes not yet here."""
    agent = make_agent()
    root = project({"read.py": READ})
    data = {"one/one.bin": os.urandom(2 * MiB), "two/two.bin": os.urandom(2 * MiB)}
    client = s3.client()
    client.create_bucket(Bucket="gpuhop-slow")
    for key, body in data.items():
        client.put_object(Bucket="gpuhop-slow", Key=key, Body=body)
    client.close()
    host, port = re.match(r"http://(.+):(\d+)", s3.url).groups()  # type: ignore[union-attr]
    partials = lambda: [p for p in agent.home.glob("objects/*/partial/*")]  # noqa: E731

    def partly(least: int) -> bool:
        return any(p.stat().st_size >= least for p in partials())

    with Link((host, int(port)), rate=2 * MiB) as link, agent.client() as user:
        _secrets(user, link.url, s3.key_id, s3.secret)
        # The download stalls after its first chunk (1 MiB): under way when the agent dies.
        link.limit(MiB + MiB // 2)
        job = user.submit(["read.py", "one"], workdir=root, data=["s3://gpuhop-slow/one"])
        wait_until(lambda: partly(MiB // 4), timeout=30)
        os.kill(agent.pid, signal.SIGKILL)
        wait_until(lambda: read_pid(agent.paths) is None, timeout=10)
        had = max(p.stat().st_size for p in partials())
        sent = len(link.sent())
        link.limit(None)
        agent.start()
        assert job.wait(timeout=60).end_class == "succeeded", job.info.reason
        assert _lines(b"".join(job.logs())) == [
            f"file one.bin {2 * MiB} {_sha(data['one/one.bin'])}"
        ]
        ranges = re.findall(r"(?i)\nrange: bytes=(\d+)-\r\n", link.sent()[sent:])
        assert len(ranges) == 1 and had <= int(ranges[0]) < 2 * MiB, ranges
        assert partials() == []

        two = ["s3://gpuhop-slow/two"]
        link.limit(MiB + MiB // 2)
        gone = user.submit(["read.py", "two"], workdir=root, data=two)
        wait_until(lambda: partly(MiB // 4), timeout=30)
        link.cut()
        ended = gone.wait(timeout=60)
        assert ended.state == JobState.failed and ended.end_class == "data-error"
        assert "two/two.bin" in (ended.reason or "") and "tried 3 times" in (ended.reason or "")
        had = max(p.stat().st_size for p in partials())  # kept for the next try
        link.mend()
        link.limit(None)
        sent = len(link.sent())
        again = user.submit(["read.py", "two"], workdir=root, data=two)
        assert again.wait(timeout=60).end_class == "succeeded", again.info.reason
        ranges = re.findall(r"(?i)\nrange: bytes=(\d+)-\r\n", link.sent()[sent:])
        assert len(ranges) == 1 and int(ranges[0]) == had, ranges


def test_a_large_object_is_hashed_after_its_job_starts_and_its_bytes_kept_once(
    make_agent,
    s3: S3,  # noqa: F811
    project,
):
    """An object read in parts is named for its job before its bytes are hashed: the job
    reads the right bytes, and then the same bytes under two keys are one file on the disk
    (the blob, each key's `by-id` name and view). An agent stopped before it hashed them
    (two copies, named, their rows unhashed) hashes them as it starts again, and keeps one."""
    agent = make_agent()
    root = project({"read.py": READ})
    data = os.urandom(LATER_BYTES + MiB + 7)
    client = s3.client()
    client.create_bucket(Bucket="gpuhop-later")
    for prefix in ("x", "y"):
        client.put_object(Bucket="gpuhop-later", Key=f"{prefix}/big.bin", Body=data)
    client.close()
    with agent.client() as user:
        _secrets(user, s3.url, s3.key_id, s3.secret)
        for prefix in ("x", "y"):
            job = user.submit(
                ["read.py", prefix], workdir=root, data=[f"s3://gpuhop-later/{prefix}"]
            )
            assert job.wait(timeout=60).end_class == "succeeded", job.info.reason
            assert _lines(b"".join(job.logs())) == [f"file big.bin {len(data)} {_sha(data)}"]
    blob = agent.paths.blobs / _sha(data)[:2] / _sha(data)
    by_id = {p.name: p for p in agent.home.glob("objects/*/by-id/*")}
    views = {p.parent.name: p for p in agent.home.glob("objects/*/views/*/big.bin")}
    assert len(by_id) == 2 and len(views) == 2, (by_id, views)

    def kept_once() -> bool:
        return blob.exists() and all(p.samefile(blob) for p in [*by_id.values(), *views.values()])

    wait_until(kept_once, timeout=60)
    assert blob.stat().st_nlink == 5

    # What an agent stopped between naming and hashing leaves: each key's names one copy of
    # its own, no blob, the rows unhashed.
    agent.shutdown()
    index = sqlite3.connect(agent.home / "objects.db")
    with index:
        pairs = index.execute(
            "SELECT o.id, v.view FROM objects o JOIN view_objects v ON v.id = o.id"
        ).fetchall()
        index.execute("UPDATE objects SET sha256 = ''")
    index.close()
    assert {o for o, _ in pairs} == set(by_id) and {v for _, v in pairs} == set(views), pairs
    for oid, view in pairs:
        copy = by_id[oid].with_name(f"{oid}.copy")
        shutil.copyfile(blob, copy)
        for name in (by_id[oid], views[view]):
            name.unlink()
            os.link(copy, name)
        copy.unlink()
    blob.unlink()
    assert not kept_once() and by_id[pairs[0][0]].stat().st_nlink == 2
    agent.start()
    wait_until(kept_once, timeout=60)
    assert blob.stat().st_nlink == 5
    with agent.client() as user:  # and a job reads them as before
        again = user.submit(["read.py", "x"], workdir=root, data=["s3://gpuhop-later/x"])
        assert again.wait(timeout=60).end_class == "succeeded", again.info.reason
        assert _lines(b"".join(again.logs())) == [f"file big.bin {len(data)} {_sha(data)}"]


def _reader_and_object(s3: S3, link: Link, key: str) -> tuple[Any, ObjectId]:  # noqa: F811
    """The fetch's reader, with the user's keys, through `link`; and the object `key` as
    a listing names it (its ETag and size, looked up directly)."""
    creds = Credentials("me", {"AWS_ENDPOINT_URL": link.url, **_keys(s3)}, own_config=False)
    direct = s3.client()
    head = direct.head_object(Bucket=BUCKET, Key=key)
    direct.close()
    etag, size = head["ETag"].strip('"'), head["ContentLength"]
    return buckets.client(creds, 4), ObjectId(link.url, BUCKET, key, etag, size)


def test_a_large_objects_download_reads_only_the_parts_not_yet_written(s3: S3, tmp_path: Path):  # noqa: F811
    """The fetch's reader itself (what the agent runs), against the server through a link
    that shows the requests: part 0 of the 17 MiB object is here and noted, the rest is
    read in ranged parts; a changed object (another ETag) is refused, not mixed in. No hash
    is given either way (the cache hashes a large object after its job starts)."""
    data = OBJECTS["train/big.bin"]
    host, port = re.match(r"http://(.+):(\d+)", s3.url).groups()  # type: ignore[union-attr]
    with Link((host, int(port)), rate=1 << 30) as link:
        client, oid = _reader_and_object(s3, link, "train/big.bin")
        whole = tmp_path / "whole"
        assert bucketreads.download(client, oid, whole, lambda n: None) is None
        assert whole.read_bytes() == data
        before = len(link.sent())  # the requests of the whole read

        part = tmp_path / "partial"
        part.write_bytes(data[:PART] + bytes(len(data) - PART))  # part 0 whole, the rest not
        (tmp_path / "partial.parts").write_text("0\n")
        came: list[int] = []
        assert bucketreads.download(client, oid, part, came.append) is None
        assert part.read_bytes() == data and sum(came) == len(data) - PART
        ranges = set(re.findall(r"(?i)\nrange: bytes=(\d+-\d+)\r\n", link.sent()[before:]))
        assert ranges == {f"{PART}-{2 * PART - 1}", f"{2 * PART}-{len(data) - 1}"}

        (tmp_path / "partial.parts").write_text("0\n")
        with pytest.raises(BucketError, match="PreconditionFailed") as refused:
            bucketreads.download(client, oid._replace(etag="0" * 32), part, came.append)
        assert not refused.value.transient
        client.close()


def test_a_parts_note_is_written_only_once_its_bytes_are_on_the_disk(
    s3: S3,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    """Issue 38: a resumed download skips the parts its note names, so a note that reached
    the disk before its part's bytes (a power loss) would leave zeros in the object. The
    fetch's reader itself, its real files: each flush of the partial is recorded (which parts
    the note named then, which parts the file held whole then), one part at a time (with
    several, another part's flush could cover a note written too early), and every part
    noted was held whole by a flush that came before its note."""
    data = OBJECTS["train/big.bin"]  # 3 parts
    count = -(-len(data) // PART)
    creds = Credentials("me", {"AWS_ENDPOINT_URL": s3.url, **_keys(s3)}, own_config=False)
    client = buckets.client(creds, 1)
    direct = s3.client()
    etag = direct.head_object(Bucket=BUCKET, Key="train/big.bin")["ETag"].strip('"')
    direct.close()
    oid = ObjectId(s3.url, BUCKET, "train/big.bin", etag, len(data))
    part = tmp_path / "partial"
    flushed: set[int] = set()  # parts whole in the file when a flush of it began
    noted_early: list[int] = []  # parts noted before a flush of their bytes
    real = os.fdatasync

    def whole() -> set[int]:
        held = part.read_bytes()
        return {
            i
            for i in range(count)
            if held[i * PART : (i + 1) * PART] == data[i * PART : (i + 1) * PART]
        }

    def recording(fd: int) -> None:
        noted_early.extend(sorted((parts_done(part) or set()) - flushed))
        held = whole()
        real(fd)
        flushed.update(held)

    monkeypatch.setattr(os, "fdatasync", recording)
    monkeypatch.setattr(buckets, "PART_THREADS", 1)
    try:
        bucketreads.download(client, oid, part, lambda n: None)
    finally:
        client.close()
    monkeypatch.undo()
    assert part.read_bytes() == data
    assert parts_done(part) == set(range(count))
    assert noted_early == [] and flushed == set(range(count))


def test_jobs_fetching_the_same_object_at_once_download_it_once(
    shared_agent: Agent,
    s3: S3,  # noqa: F811
    project,
):
    """Two jobs with the same data, and a third whose prefix holds it too, submitted while
    the first one's download of the object is under way (through a link that holds it after
    its first MiB, let go once all three fetches are downloading): the later fetches wait
    for that download rather than write the same partial object beside it. The object is
    read from the bucket once, stored once, and each job reads its whole bytes."""
    root = project({"read.py": READ})
    big, other = os.urandom(2 * MiB), b"other\n"
    client = s3.client()
    client.create_bucket(Bucket="gpuhop-race")
    client.put_object(Bucket="gpuhop-race", Key="r/big.bin", Body=big)
    client.put_object(Bucket="gpuhop-race", Key="other.txt", Body=other)
    client.close()
    host, port = re.match(r"http://(.+):(\d+)", s3.url).groups()  # type: ignore[union-attr]
    partials = lambda: list(shared_agent.home.glob("objects/*/partial/*"))  # noqa: E731
    same = ["s3://gpuhop-race/r:r"]
    with Link((host, int(port)), rate=2 * MiB) as link, shared_agent.client() as user:
        _secrets(user, link.url, s3.key_id, s3.secret)
        try:
            mark = s3.mark()
            link.limit(MiB + MiB // 2)  # the download stalls after its first chunk (1 MiB)
            first = user.submit(["read.py", "r"], workdir=root, data=same)
            wait_until(lambda: any(p.stat().st_size for p in partials()), timeout=60)
            second = user.submit(["read.py", "r"], workdir=root, data=same)
            wider = user.submit(["read.py", "all"], workdir=root, data=["s3://gpuhop-race:all"])
            wait_until(
                lambda: all(" objects" in (j.refresh().waiting or "") for j in (second, wider)),
                timeout=60,
            )
            link.limit(None)
            for job in (first, second, wider):
                assert job.wait(timeout=60).end_class == "succeeded", job.info.reason
            whole = f"{2 * MiB} {_sha(big)}"
            assert _lines(b"".join(first.logs())) == [f"file big.bin {whole}"]
            assert _lines(b"".join(second.logs())) == [f"file big.bin {whole}"]
            assert _lines(b"".join(wider.logs())) == [
                f"file other.txt 6 {_sha(other)}",
                f"file r/big.bin {whole}",
            ]
            gets = [r for r in s3.requests(mark) if r.startswith("GET /gpuhop-race/r/big.bin")]
            assert gets == ["GET /gpuhop-race/r/big.bin"]
            # Each job's record says which of its objects its own fetch read: the first the
            # big one, the others none of it (the wider one, its other object alone).
            fetched = [
                (d["objects"], d["fetched"], d["fetched_bytes"])
                for job in (first, second, wider)
                for d in job.provenance_json()["data"]
            ]
            assert fetched == [(1, 1, 2 * MiB), (1, 0, 0), (2, 1, len(other))]
            # One blob, linked as the user's object and in the two views (same data: one).
            blob = shared_agent.paths.blobs / _sha(big)[:2] / _sha(big)
            assert blob.stat().st_nlink == 4
            assert partials() == []
        finally:
            for name in (
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_ENDPOINT_URL",
                "AWS_REGION",
            ):
                user.remove_secret(name)


def test_a_team_agents_reads_heed_none_of_the_agents_own_aws_variables(
    s3: S3,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    """obstore reads every AWS_* variable of the process as it makes a store: on a team agent
    (the user's secrets only), the agent's own endpoint, session token, requester-pays and
    SSE-C customer key must not reach a user's GET. A key gone since its listing fails in
    the bucket's words, not as a way to try again."""
    agents = {
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",  # the discard port: nothing answers
        "AWS_ENDPOINT": "http://127.0.0.1:9",
        "AWS_SESSION_TOKEN": "the-agents-own-token",
        "AWS_REQUEST_PAYER": "true",
        "AWS_SERVER_SIDE_ENCRYPTION": "sse-c",
        "AWS_SSE_CUSTOMER_KEY_BASE64": "VGhlIGFnZW50J3Mgb3duIGtleSwgMzIgYnl0ZXMhISE=",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true",
        "AWS_SKIP_SIGNATURE": "true",
    }
    for name, value in agents.items():
        monkeypatch.setenv(name, value)
    data = OBJECTS["train/a.txt"]
    host, port = re.match(r"http://(.+):(\d+)", s3.url).groups()  # type: ignore[union-attr]
    with Link((host, int(port)), rate=1 << 30) as link:
        client, oid = _reader_and_object(s3, link, "train/a.txt")
        part = tmp_path / "partial"
        came = bucketreads.download(client, oid, part, lambda n: None)
        assert part.read_bytes() == data
        assert came == (hashlib.sha256(data).hexdigest(), len(data))
        sent = link.sent().lower()
        assert f"get /{BUCKET}/train/a.txt " in sent and "authorization: aws4-hmac-sha256" in sent
        for word in ("the-agents-own-token", "x-amz-request-payer", "customer", "x-amz-security"):
            assert word not in sent, word

        with pytest.raises(
            BucketError, match=r"^NoSuchKey: The specified key does not exist"
        ) as gone:
            bucketreads.download(client, oid._replace(key="train/gone.txt"), tmp_path / "gone", len)
        assert not gone.value.transient
        client.close()


def test_a_link_local_endpoint_is_refused_as_the_clouds_metadata_service(
    tls_agent: Agent, remote: Callable[..., Client], project
):
    """On the GPU host's network 169.254.169.254 is the cloud's metadata service, which
    answers with the host's own credentials; a failed listing's error words would hand its
    answers to the user. The fetch never reaches it (nor does anything here: it is refused
    before any request)."""
    with tls_agent.client() as owner:
        dave = remote(owner.create_token("dave").token)
    _secrets(dave, "http://169.254.169.254", "AKIAIOSFODNN7EXAMPLE", "x" * 40)
    root = project({"read.py": READ})
    job = dave.submit(["read.py", "creds"], workdir=root, data=["s3://latest/meta-data:creds"])
    info = job.wait(timeout=60)
    assert info.end_class == "data-error", info.reason
    said = "the endpoint your secret AWS_ENDPOINT_URL names is a link-local address (169.254"
    assert said in (info.reason or ""), info.reason
    assert "instance metadata service" in (info.reason or "")
