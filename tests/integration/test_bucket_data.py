"""`--data s3://BUCKET/PREFIX[:NAME]` against a real S3 API server (moto's, on loopback, with
its IAM checks on): the agent's host fetches the prefix with the user's own secrets while the
job waits, the job reads it read-only at $GPUHOP_DATA/NAME, an unchanged prefix costs the next
job one listing and a changed object only itself, and a bad secret or bucket ends the job as
`data-error` in the bucket's own words."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from gpuhop.cli.progress import JobStatus
from tests.conftest import Agent, wait_until
from tests.integration.test_ui import code_for, login, with_cookie
from tests.throttle import Link

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")
TransferConfig = pytest.importorskip("boto3.s3.transfer").TransferConfig

pytestmark = pytest.mark.timeout(120)

BUCKET = "gpuhop-train"
OBJECTS = {
    "train/a.txt": b"alpha\n",
    "train/sub dir/\u00e9t\u00e9 \u00f1.txt": "\u00e9t\u00e9 \u00f1\n".encode(),
    "train/deep/er/b.bin": os.urandom(3000),
    # Past the single-GET size: read in ranged parts. Uploaded in 5 MiB parts, so its ETag is
    # a multipart one ("MD5-OF-PART-MD5S-4"), not the MD5 of its bytes.
    "train/big.bin": os.urandom(17 << 20),
    "train/": b"",  # a folder marker: no file
    "train2/not-this.txt": b"a sibling prefix, not under train/\n",
    "other/x.txt": b"elsewhere\n",
}

MULTIPART = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)

# Lists the data it sees (path, size, sha256) and whether it can write there.
JOB = """\
import hashlib, os
root = os.path.join(os.environ["GPUHOP_DATA"], "train")
for dirpath, dirs, files in sorted(os.walk(root)):
    for name in sorted(files):
        path = os.path.join(dirpath, name)
        data = open(path, "rb").read()
        print("file", os.path.relpath(path, root), len(data), hashlib.sha256(data).hexdigest())
print("read-only mount", bool(os.statvfs(root).f_flag & os.ST_RDONLY))
try:
    open(os.path.join(root, "new.txt"), "w").write("x")
    print("writable")
except OSError as e:
    print("not written", e.errno)
"""


class S3(NamedTuple):
    url: str
    key_id: str
    secret: str
    log: Path

    def client(self, secret: str | None = None):
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=self.key_id,
            aws_secret_access_key=secret or self.secret,
        )

    def requests(self, since: int = 0) -> list[str]:
        """The request lines the server logged after byte `since` of its log."""
        with self.log.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return re.findall(r'"((?:GET|HEAD|PUT|POST) [^"]*) HTTP/1\.1', text)

    def mark(self) -> int:
        return self.log.stat().st_size


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """moto's S3 server on a loopback port of its choosing, checking signatures against an
    IAM user it makes first (its first 3 requests go unchecked: the user, its key, its
    policy); the bucket holds OBJECTS. Stopped at the module's end."""
    log = tmp_path_factory.mktemp("moto") / "requests.log"
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        url = _served_at(log, server)
        anyone = {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1", **anyone)
        iam.create_user(UserName="trainer")
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        allow = {"Effect": "Allow", "Action": "*", "Resource": "*"}
        policy = {"Version": "2012-10-17", "Statement": [allow]}
        iam.put_user_policy(UserName="trainer", PolicyName="all", PolicyDocument=json.dumps(policy))
        found = S3(url, key["AccessKeyId"], key["SecretAccessKey"], log)
        client = found.client()
        client.create_bucket(Bucket=BUCKET)
        for name, data in OBJECTS.items():
            if len(data) > MULTIPART.multipart_threshold:
                client.upload_fileobj(io.BytesIO(data), BUCKET, name, Config=MULTIPART)
                assert client.head_object(Bucket=BUCKET, Key=name)["ETag"].endswith('-4"')
            else:
                client.put_object(Bucket=BUCKET, Key=name, Body=data)
        iam.close()
        client.close()
        yield found
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _served_at(log: Path, server: subprocess.Popen[bytes]) -> str:
    def address() -> str | None:
        assert server.poll() is None, log.read_text()
        found = re.search(r"Running on (http://127\.0\.0\.1:\d+)", log.read_text())
        return found.group(1) if found else None

    return str(wait_until(address, timeout=30))


@pytest.fixture
def signed_in(shared_agent: Agent, s3: S3) -> Iterator[Agent]:
    """The shared agent's user with the S3 server's credentials as their secrets."""
    client = shared_agent.client()
    values = {
        "AWS_ACCESS_KEY_ID": s3.key_id,
        "AWS_SECRET_ACCESS_KEY": s3.secret,
        "AWS_ENDPOINT_URL": s3.url,
        "AWS_REGION": "us-east-1",
    }
    for name, value in values.items():
        client.set_secret(name, value)
    yield shared_agent
    for name in values:
        client.remove_secret(name)
    client.close()


def _expected_lines(prefix: str = "train/") -> list[str]:
    lines = []
    for key, data in OBJECTS.items():
        if key.startswith(prefix) and not key.endswith("/"):
            lines.append(
                f"file {key[len(prefix) :]} {len(data)} {hashlib.sha256(data).hexdigest()}"
            )
    return sorted(lines)


_TIMES = ("created_at", "started_at")


def _object_requests(lines: list[str]) -> list[str]:
    """The requests for objects' bytes (GET or HEAD of a key, not a listing)."""
    return [r for r in lines if re.match(rf"(GET|HEAD) /{BUCKET}/", r) and "list-type" not in r]


def test_a_job_reads_a_prefix_fetched_on_the_host_and_the_next_costs_one_listing(
    signed_in: Agent, s3: S3, project
):
    root = project({"job.py": JOB})
    first = signed_in.cli("run", "--data", f"s3://{BUCKET}/train", "job.py", cwd=root)
    assert first.returncode == 0, first.stdout + first.stderr
    seen = sorted(line for line in first.stdout.splitlines() if line.startswith("file "))
    assert seen == _expected_lines()  # the prefix only, key with spaces and non-ASCII too
    assert "read-only mount True" in first.stdout and "not written" in first.stdout
    job_id = json.loads(signed_in.cli("ps", "--json").stdout)[0]["id"]
    shown = json.loads(signed_in.cli("show", job_id, "--json").stdout)
    assert shown["data"] == [f"s3://{BUCKET}/train/:train"]
    assert shown["end_class"] == "succeeded"

    mark = s3.mark()
    second = signed_in.cli("run", "--data", f"s3://{BUCKET}/train:train", "job.py", cwd=root)
    assert second.returncode == 0, second.stdout + second.stderr
    assert sorted(ln for ln in second.stdout.splitlines() if ln.startswith("file ")) == seen
    asked = s3.requests(mark)
    assert _object_requests(asked) == []  # no byte fetched again
    assert len([r for r in asked if "list-type=2" in r]) == 1  # one listing

    OBJECTS["train/a.txt"] = b"alpha, changed\n"
    s3.client().put_object(Bucket=BUCKET, Key="train/a.txt", Body=OBJECTS["train/a.txt"])
    mark = s3.mark()
    third = signed_in.cli("run", "--data", f"s3://{BUCKET}/train", "job.py", cwd=root)
    assert third.returncode == 0, third.stdout + third.stderr
    assert sorted(ln for ln in third.stdout.splitlines() if ln.startswith("file ")) == (
        _expected_lines()
    )
    assert _object_requests(s3.requests(mark)) == [f"GET /{BUCKET}/train/a.txt"]
    # Whole objects only in the cache: nothing partial left behind.
    assert [p for p in signed_in.home.glob("objects/*/tmp/*")] == []

    # What each job was given, as `show` and `diff` tell it: the same listing twice, all of
    # it cached the second time; then one object changed, fetched alone, another listing.
    ids = [j["id"] for j in json.loads(signed_in.cli("ps", "--json", "--limit", "3").stdout)][::-1]
    records = []
    for job in ids:
        shown = signed_in.cli("show", job, "--json")
        assert shown.returncode == 0, shown.stderr
        [record] = json.loads(shown.stdout)["provenance"]["data"]
        records.append(record)
        assert record["objects"] == len(seen) and record["url"] == f"s3://{BUCKET}/train/"
        info = json.loads(shown.stdout)
        created, started = (datetime.fromisoformat(info[k]).timestamp() for k in _TIMES)
        assert created <= record["ready_at"] <= started
    total = sum(len(v) for k, v in OBJECTS.items() if k.startswith("train/") and k[-1] != "/")
    grew = len(OBJECTS["train/a.txt"]) - len(b"alpha\n")
    assert [r["bytes"] for r in records] == [total - grew, total - grew, total]
    assert records[0]["listing"] == records[1]["listing"] != records[2]["listing"]
    assert (records[1]["fetched"], records[2]["fetched"]) == (0, 1)
    assert records[2]["fetched_bytes"] == len(OBJECTS["train/a.txt"])
    text = signed_in.cli("show", ids[1]).stdout
    assert "all cached" in text and f"listing {records[1]['listing'][:12]}" in text, text
    text = signed_in.cli("show", ids[2]).stdout
    assert "1 fetched (15 B), the rest cached" in " ".join(text.split()), text
    changed = json.loads(signed_in.cli("diff", ids[1], ids[2], "--json").stdout)["ran_on"]
    assert changed == [
        {
            "what": "data train",
            "a": f"s3://{BUCKET}/train/ listing {records[1]['listing'][:12]}",
            "b": f"s3://{BUCKET}/train/ listing {records[2]['listing'][:12]}",
        }
    ]


def test_an_endpoint_with_a_trailing_slash_is_the_same_endpoint_for_the_cache(
    signed_in: Agent, s3: S3, project
):
    """AWS_ENDPOINT_URL set as `http://host:port/` names the server `http://host:port` does:
    its cached objects are found, not fetched again, and `data ls` lists the prefix once."""
    root = project({"job.py": JOB})
    first = signed_in.cli("run", "--data", f"s3://{BUCKET}/train", "job.py", cwd=root)
    assert first.returncode == 0, first.stdout + first.stderr
    with signed_in.client() as client:
        client.set_secret("AWS_ENDPOINT_URL", s3.url + "/")
    try:
        mark = s3.mark()
        again = signed_in.cli("run", "--data", f"s3://{BUCKET}/train", "job.py", cwd=root)
        assert again.returncode == 0, again.stdout + again.stderr
        assert _object_requests(s3.requests(mark)) == []  # no byte fetched again
        listed = signed_in.cli("data", "ls", "--cached", "--json")
        assert listed.returncode == 0, listed.stderr
        train = [p for p in json.loads(listed.stdout) if p["url"] == f"s3://{BUCKET}/train/"]
        assert [p["endpoint"] for p in train] == [s3.url], listed.stdout
    finally:
        with signed_in.client() as client:
            client.set_secret("AWS_ENDPOINT_URL", s3.url)


def test_a_wrong_secret_or_bucket_ends_the_job_as_data_error_in_the_buckets_words(
    signed_in: Agent, s3: S3, project
):
    root = project({"job.py": "print('never runs')"})
    client = signed_in.client()
    wrong = "wrong-" + secrets.token_hex(12)
    client.set_secret("AWS_SECRET_ACCESS_KEY", wrong)
    run = signed_in.cli("run", "--data", f"s3://{BUCKET}/train", "job.py", cwd=root)
    assert run.returncode != 0
    assert "SignatureDoesNotMatch" in run.stdout + run.stderr, run.stdout + run.stderr
    assert "never runs" not in run.stdout
    job_id = json.loads(signed_in.cli("ps", "--json").stdout)[0]["id"]
    info = json.loads(signed_in.cli("show", job_id, "--json").stdout)
    assert (info["state"], info["end_class"]) == ("failed", "data-error")
    assert info["reason"].startswith(f"could not fetch its data: s3://{BUCKET}/train/:")
    assert wrong not in json.dumps(info) + run.stdout + run.stderr

    client.set_secret("AWS_ACCESS_KEY_ID", "AKIANOSUCHKEY0000000")
    unknown = client.submit("job.py", workdir=root, data=[f"s3://{BUCKET}/train"]).wait()
    assert unknown.end_class == "data-error" and "InvalidAccessKeyId" in (unknown.reason or "")

    client.set_secret("AWS_ACCESS_KEY_ID", s3.key_id)
    client.set_secret("AWS_SECRET_ACCESS_KEY", s3.secret)
    gone = client.submit("job.py", workdir=root, data_sources=["s3://no-such-bucket/x"]).wait()
    assert gone.end_class == "data-error"
    assert "NoSuchBucket: The specified bucket does not exist" in (gone.reason or "")
    # A prefix with no object (a typo, most often) is no data: the job does not run on none.
    typo = client.submit("job.py", workdir=root, data_sources=[f"s3://{BUCKET}/Train"]).wait()
    assert typo.end_class == "data-error"
    assert typo.reason == (
        f"could not fetch its data: s3://{BUCKET}/Train/: no object there (keys are"
        " case-sensitive; is the prefix right?)"
    )
    client.close()


def test_bad_bucket_sources_are_refused_before_anything_is_sent(shared_agent: Agent, project):
    root = project({"job.py": "print('never runs')"})
    for given, words in (
        ("s3://Bad_Bucket/x", "'Bad_Bucket' is not a bucket name"),
        ("s3://bucket-one/a/../b", "the prefix has an empty, '.' or '..' part"),
        ("s3://bucket-one/x:bad name", "'bad name' cannot name the data"),
    ):
        refused = shared_agent.cli("run", "--data", given, "job.py", cwd=root)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
    twice = shared_agent.cli(
        "run", "--data", "s3://bucket-one/a/x", "--data", "s3://bucket-two/x", "job.py", cwd=root
    )
    assert twice.returncode == 2
    assert "--data names two buckets' data x; give one :NAME" in twice.stderr


WAITS = re.compile(
    r"fetching data: \d/4 objects, [\d.]+ [KMG]iB of 17 MiB, [\d.]+ [KMG]iB/s, ETA \d+:\d\d"
)


def test_a_sweeps_runs_each_read_the_prefix_and_its_objects_come_once(
    signed_in: Agent, s3: S3, project
):
    """`gpuhop sweep --array 3 --data s3://...`: the runs fetch at once, each sees the whole
    prefix, each object is read from the bucket once, and the runs' records say which run's
    fetch read it."""
    root = project({"job.py": JOB})
    prefix = f"swept-{secrets.token_hex(4)}"  # new to the cache, whatever ran before
    bodies = {f"{prefix}/{i}.txt": f"{i}\n".encode() for i in range(3)}
    client = s3.client()
    for key, body in bodies.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
    mark = s3.mark()
    swept = signed_in.cli(
        "sweep", "-n", "bucket-sweep", "--array", "3", "--data", f"s3://{BUCKET}/{prefix}:train",
        "job.py", cwd=root, timeout=110,
    )  # fmt: skip
    assert swept.returncode == 0, swept.stdout + swept.stderr
    gets = sorted(r for r in s3.requests(mark) if r.startswith(f"GET /{BUCKET}/{prefix}/"))
    assert gets == [f"GET /{BUCKET}/{key}" for key in sorted(bodies)]
    runs = json.loads(signed_in.cli("sweep", "show", "bucket-sweep", "--json").stdout)
    fetched = []
    for job in [run["id"] for run in runs]:
        logs = signed_in.cli("logs", job).stdout
        assert sorted(ln for ln in logs.splitlines() if ln.startswith("file ")) == [
            f"file {key.rpartition('/')[2]} 2 {hashlib.sha256(body).hexdigest()}"
            for key, body in sorted(bodies.items())
        ]
        shown = json.loads(signed_in.cli("show", job, "--json").stdout)
        fetched += [d["fetched"] for d in shown["provenance"]["data"]]
    assert len(fetched) == 3 and sum(fetched) == 3, fetched
    for key in bodies:
        client.delete_object(Bucket=BUCKET, Key=key)
    client.close()


def test_a_fetchs_progress_shows_in_ps_show_the_dashboard_and_runs_status_line(
    signed_in: Agent, s3: S3, project
):
    """The prefix comes through a link slowed to 128 KiB/s a connection (a 17 MiB object
    then takes over a minute), so every surface is read while the fetch runs; then the link
    is let go at full speed and the job runs."""
    root = project({"job.py": JOB})
    host, port = s3.url.removeprefix("http://").split(":")
    with Link((host, int(port)), rate=128 << 10) as link, signed_in.client() as client:
        # Another endpoint to the cache: nothing of an earlier test's fetch is reused.
        client.set_secret("AWS_ENDPOINT_URL", link.url)
        try:
            job = client.submit(["job.py"], workdir=root, data=[f"s3://{BUCKET}/train"])
            # Some bytes are here (the small objects), not all: objects, bytes, rate, ETA.
            waiting = wait_until(lambda: WAITS.search(job.refresh().waiting or ""), 60)
            assert waiting and job.info.state.value == "queued"
            listed = json.loads(signed_in.cli("ps", "--json").stdout)
            assert WAITS.search(next(j for j in listed if j["id"] == job.id)["waiting"])
            shown = signed_in.cli("show", job.id)
            assert WAITS.search(shown.stdout.replace("\n", " ")), shown.stdout
            page = _dashboard_job(signed_in, job.id)
            assert WAITS.search(page["waiting"]) and page["state"] == "queued"
            status = JobStatus(job)
            status.poll()
            assert WAITS.search(status.line().plain), status.line().plain
        finally:
            link.rate = 1 << 40  # let the rest through now
            client.set_secret("AWS_ENDPOINT_URL", s3.url)
        info = job.wait(60)
        assert info.end_class == "succeeded", info.reason
        assert (
            sorted(
                ln for ln in b"".join(job.logs()).decode().splitlines() if ln.startswith("file ")
            )
            == _expected_lines()
        )


def _dashboard_job(agent: Agent, job_id: str) -> dict:
    """The dashboard's JSON of one job (what its page draws), as the owner."""
    transport = httpx.HTTPTransport(uds=str(agent.paths.socket))
    with httpx.Client(transport=transport, base_url="http://gpuhop", timeout=30) as http:
        cookie = login(http, code_for(http))
        answer = http.get(f"/ui/api/jobs/{job_id}", headers=with_cookie(cookie))
    assert answer.status_code == 200, answer.text
    return answer.json()["job"]


def test_doctor_says_which_credentials_a_fetch_would_use(signed_in: Agent, s3: S3):
    """A single-user agent: the user's secrets by name; without the keys, their usual AWS
    configuration (whatever this machine has of it, or none) for the rest."""
    keys = {"AWS_ACCESS_KEY_ID": s3.key_id, "AWS_SECRET_ACCESS_KEY": s3.secret}
    with signed_in.client() as client:
        own = _bucket_check(client)
        assert own.status == "passed"
        assert own.detail.startswith(
            "a bucket's fetch signs with your secrets AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,"
            " AWS_ENDPOINT_URL, AWS_REGION"
        )
        for name in keys:
            client.remove_secret(name)
        try:
            rest = _bucket_check(client)
        finally:
            for name, value in keys.items():
                client.set_secret(name, value)
    # "...your usual AWS configuration: ..." or "...no usual AWS configuration here"
    assert "usual AWS configuration" in rest.detail and "AWS_REGION" in rest.detail
    assert "never the agent's own" not in rest.detail
    assert s3.secret not in own.detail + rest.detail and s3.key_id not in own.detail


def _bucket_check(client):
    checks = {c.name: c for c in client.doctor(probe=False)}
    return checks["bucket credentials"]


# Reads one file of its data whole: its size and sha256.
DIGEST = """\
import hashlib, os, sys
path = os.path.join(os.environ["GPUHOP_DATA"], sys.argv[1])
with open(path, "rb") as f:
    print("digest", os.fstat(f.fileno()).st_size, hashlib.file_digest(f, "sha256").hexdigest())
"""
MiB = 1 << 20


def _varied(size: int) -> bytes:
    """`size` random bytes in which no MiB repeats another: one random MiB, rotated and
    numbered anew for each (os.urandom of it all would cost the test seconds)."""
    base = os.urandom(MiB)
    blocks = []
    for i in range(-(-size // MiB)):
        turn = i * 7919 % MiB
        blocks.append(i.to_bytes(8, "big") + (base[turn:] + base[:turn])[8:])
    return b"".join(blocks)[:size]


def test_a_multipart_object_over_100_mb_comes_in_ranged_parts_byte_for_byte(
    signed_in: Agent, s3: S3, project
):
    """101 MiB uploaded in 7 parts (a multipart ETag), read by the fetch in ranged parts of
    PART bytes through a link that shows each request: the job's sha256 is the test's."""
    from gpuhop.agent.storage.objectdownloads import PART

    data = _varied(101 * MiB + 12345)
    client = s3.client()
    config = TransferConfig(multipart_threshold=16 * MiB, multipart_chunksize=16 * MiB)
    client.upload_fileobj(io.BytesIO(data), BUCKET, "huge/huge.bin", Config=config)
    assert client.head_object(Bucket=BUCKET, Key="huge/huge.bin")["ETag"].endswith('-7"')
    client.close()
    root = project({"digest.py": DIGEST})
    host, port = s3.url.removeprefix("http://").split(":")
    with Link((host, int(port)), rate=1 << 40) as link, signed_in.client() as user:
        user.set_secret("AWS_ENDPOINT_URL", link.url)  # another endpoint: nothing cached
        try:
            job = user.submit(
                ["digest.py", "huge/huge.bin"], workdir=root, data=[f"s3://{BUCKET}/huge:huge"]
            )
            info = job.wait(120)
        finally:
            user.set_secret("AWS_ENDPOINT_URL", s3.url)
        assert info.end_class == "succeeded", info.reason
        out = b"".join(job.logs()).decode()
        assert f"digest {len(data)} {hashlib.sha256(data).hexdigest()}" in out, out
        ranges = re.findall(r"(?i)\nrange: bytes=(\d+)-(\d+)\r\n", link.sent())
        parts = -(-len(data) // PART)
        assert sorted((int(a), int(b)) for a, b in ranges) == [
            (i * PART, min(len(data), (i + 1) * PART) - 1) for i in range(parts)
        ]
