"""A prefix of 10,000 small objects behind `--data s3://...`, against moto's S3 server on
loopback (a server of this module's own, its bucket filled through moto's backend in the
server's process before it serves: fixture data, not what is tested, and 10,000 PUTs over
HTTP would cost the suite about a minute of CPU). The agent's host fetches the prefix whole,
over HTTP, across ListObjectsV2's pages of 1,000 keys; the job reads every object's bytes;
and the next job's fetch of the unchanged prefix lists it and downloads nothing."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import Agent
from tests.integration.test_bucket_data import S3, _served_at

pytest.importorskip("boto3")
pytest.importorskip("moto")

# About 80 s of CPU in all (the agent's fetch 45 s, the server 20 s): a minute on a quiet
# 2-core machine, four on a loaded one.
pytestmark = pytest.mark.timeout(600)

BUCKET = "gpuhop-many"
COUNT = 10_000
PAGE = 1_000  # ListObjectsV2's most keys a page
# Objects of 6-60 bytes, each its own bytes, in 10 folders: the listing's pages end inside
# folders, not at their edges.
OBJECTS = {f"many/{i % 10}/{i:05d}.txt": f"{i:05d}\n".encode() * (1 + i % 10) for i in range(COUNT)}

# Runs as the server: puts OBJECTS (JSON on stdin) in the bucket through moto's backend, then
# serves moto's S3 app (what `python -m moto.server` serves for S3, and with its request
# handler) on a port of its choosing, a line per request on stdout. Not `moto.server` itself:
# its way to the S3 app (asking each request's host which of moto's services it is for, a
# look at the disk each) and its request log (Python's logging, a lock each line) cost 1.7 ms
# of CPU a request more on this machine, 17 s of the suite's CPU for these 10,000 objects.
SERVER = """\
import json, os, sys
from moto.core import DEFAULT_ACCOUNT_ID
from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
from moto.s3.models import s3_backends
from werkzeug.serving import make_server

bucket = sys.argv[1]
backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
backend.create_bucket(bucket, "us-east-1")
for key, text in json.load(sys.stdin).items():
    backend.put_object(bucket, key, text.encode())

class Logged(MotoRequestHandler):
    def log_request(self, code="-", size="-"):
        os.write(1, f'"{self.requestline}" {code}\\n'.encode())

server = make_server("127.0.0.1", 0, create_backend_app("s3"), True, request_handler=Logged)
os.write(1, f"Running on http://127.0.0.1:{server.server_port}\\n".encode())
server.serve_forever()
"""

# Reads every file of $GPUHOP_DATA/many: their count, total size, and one digest of each
# path and its bytes' sha256 (sorted by path); then the files named on its command line.
JOB = """\
import hashlib, os, sys
root = os.path.join(os.environ["GPUHOP_DATA"], "many")
lines, size = [], 0
for dirpath, dirs, files in os.walk(root):
    for name in files:
        path = os.path.join(dirpath, name)
        data = open(path, "rb").read()
        size += len(data)
        lines.append(f"{os.path.relpath(path, root)} {hashlib.sha256(data).hexdigest()}\\n")
print("count", len(lines), "bytes", size)
print("digest", hashlib.sha256("".join(sorted(lines)).encode()).hexdigest())
for rel in sys.argv[1:]:
    print("spot", rel, open(os.path.join(root, rel), "rb").read())
"""
# Objects at the listing's page edges, and the first and last.
SPOTS = [f"{i % 10}/{i:05d}.txt" for i in (0, PAGE - 1, PAGE, 5 * PAGE + 1, COUNT - 1)]


def _expected() -> list[str]:
    lines = sorted(
        f"{key.removeprefix('many/')} {hashlib.sha256(data).hexdigest()}\n"
        for key, data in OBJECTS.items()
    )
    size = sum(len(data) for data in OBJECTS.values())
    return [
        f"count {COUNT} bytes {size}",
        f"digest {hashlib.sha256(''.join(lines).encode()).hexdigest()}",
        *(f"spot {rel} {OBJECTS['many/' + rel]!r}" for rel in SPOTS),
    ]


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """moto's S3 server on a loopback port of its choosing, its bucket holding OBJECTS (any
    key signs: this server checks no IAM policy). Stopped at the module's end."""
    log = tmp_path_factory.mktemp("moto-many") / "requests.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, BUCKET],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        assert server.stdin is not None
        with server.stdin:
            server.stdin.write(json.dumps({k: v.decode() for k, v in OBJECTS.items()}).encode())
        yield S3(_served_at(log, server), "AKIAMANYSMALLOBJECTS", "any-secret", log)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


@pytest.fixture
def signed_in(shared_agent: Agent, many: S3) -> Iterator[Agent]:
    """The shared agent's user with secrets for this module's server."""
    client = shared_agent.client()
    values = {
        "AWS_ACCESS_KEY_ID": many.key_id,
        "AWS_SECRET_ACCESS_KEY": many.secret,
        "AWS_ENDPOINT_URL": many.url,
        "AWS_REGION": "us-east-1",
    }
    try:
        for name, value in values.items():
            client.set_secret(name, value)
        yield shared_agent
    finally:
        for name in values:
            client.remove_secret(name)
        client.close()


def _listings(requests: list[str]) -> list[str]:
    return [r for r in requests if r.startswith(f"GET /{BUCKET}?") and "list-type=2" in r]


def _object_reads(requests: list[str]) -> list[str]:
    return [r for r in requests if r.startswith((f"GET /{BUCKET}/", f"HEAD /{BUCKET}/"))]


def test_ten_thousand_small_objects_come_whole_and_an_unchanged_prefix_only_lists(
    signed_in: Agent, many: S3, project
):
    root = project({"job.py": JOB})
    source = [f"s3://{BUCKET}/many:many"]
    with signed_in.client() as client:
        mark = many.mark()
        first = client.submit(["job.py", *SPOTS], workdir=root, data=source)
        assert first.wait(timeout=480).end_class == "succeeded", first.info.reason
        assert b"".join(first.logs()).decode().splitlines() == _expected()
        asked = many.requests(mark)
        assert len(_listings(asked)) == COUNT // PAGE  # every page, each once
        # Every object read once, in one GET each (small: no ranged parts).
        assert sorted(_object_reads(asked)) == sorted(f"GET /{BUCKET}/{k}" for k in OBJECTS)
        assert asked.count(f"GET /{BUCKET}?versioning") == 1  # beside the first page

        mark = many.mark()
        second = client.submit(["job.py", *SPOTS], workdir=root, data=source)
        assert second.wait(timeout=120).end_class == "succeeded", second.info.reason
        assert b"".join(second.logs()).decode().splitlines() == _expected()
        asked = many.requests(mark)
        assert _object_reads(asked) == []  # nothing downloaded again: one listing only
        assert len(_listings(asked)) == COUNT // PAGE
        # The versioning as the first fetch was told it (buckets.VERSIONING_SECONDS).
        assert [r for r in asked if r not in _listings(asked)] == []
