"""A real agent on a socket, driven through the SDK and raw HTTP."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpuhop.api import JobState
from gpuhop.api.framing import FRAME_HEADER
from gpuhop.client import GpuhopError

ENV_DUMP = """
import json, os
keys = ["GPUHOP_JOB_ID", "GPUHOP_ATTEMPT", "GPUHOP_ARTIFACTS_DIR", "GPUHOP_CHECKPOINT_DIR",
        "GPUHOP_METRICS_FILE", "GPUHOP_TENSORBOARD_DIR", "CUDA_VISIBLE_DEVICES", "TF_CONFIG",
        "MY_VAR", "TF_FORCE_GPU_ALLOW_GROWTH"]
print(json.dumps({k: os.environ.get(k) for k in keys}))
print("cwd-has-script", os.path.exists("job.py"))
"""


def raw(agent) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(agent.paths.socket)), base_url="http://gpuhop"
    )


def oversized(limit: int) -> Iterator[bytes]:
    """A JSON body one byte over `limit`, in pieces of 1 MiB as a streaming client sends
    it (httpx's own send of one bytes object this size costs seconds of CPU: its socket
    write copies what is left after each send)."""
    yield b"["
    left = limit + 1
    while left:
        piece = min(left, 1 << 20)
        left -= piece
        yield b" " * piece


def test_job_gets_the_environment_contract(shared_agent, project):
    root = project({"job.py": ENV_DUMP})
    with shared_agent.client() as client:
        job = client.submit(["job.py"], workdir=root, env={"MY_VAR": "hello"})
        info = job.wait(timeout=60)
        out = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, out
    env = json.loads(out.splitlines()[0])
    jobdir = shared_agent.home / "jobs" / job.id
    assert env == {
        "GPUHOP_JOB_ID": job.id,
        "GPUHOP_ATTEMPT": "1",
        "GPUHOP_ARTIFACTS_DIR": str(jobdir / "artifacts"),
        "GPUHOP_CHECKPOINT_DIR": str(jobdir / "checkpoints"),
        "GPUHOP_METRICS_FILE": str(jobdir / "metrics.jsonl"),
        "GPUHOP_TENSORBOARD_DIR": str(jobdir / "artifacts" / "tensorboard"),
        "CUDA_VISIBLE_DEVICES": "",
        "TF_CONFIG": None,
        "MY_VAR": "hello",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    assert "cwd-has-script True" in out


def test_job_cannot_alter_stored_blobs(shared_agent, project):
    root = project({"job.py": "open('job.py', 'a').write('# changed by the job\\n')\n"})
    digest = hashlib.sha256((root / "job.py").read_bytes()).hexdigest()
    with shared_agent.client() as client:
        assert client.submit(["job.py"], workdir=root).wait(60).state == JobState.succeeded
    blob = shared_agent.home / "blobs" / digest[:2] / digest
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest
    assert stat.S_IMODE(blob.stat().st_mode) == 0o444


def test_exit_code_and_signal_are_recorded(shared_agent, project):
    root = project(
        {
            "seven.py": "import sys; print('bye'); sys.exit(7)\n",
            "killed.py": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n",
        }
    )
    with shared_agent.client() as client:
        seven = client.submit(["seven.py"], workdir=root).wait(60)
        killed = client.submit(["killed.py"], workdir=root).wait(60)
    assert (seven.state, seven.exit_code, seven.signal) == (JobState.failed, 7, None)
    assert seven.reason.startswith("exited with code 7")
    assert (killed.state, killed.exit_code, killed.signal) == (JobState.failed, None, 9)
    assert "killed by signal 9 (SIGKILL" in killed.reason


def test_logs_resume_from_any_offset(shared_agent, project):
    root = project({"job.py": "for i in range(2000):\n    print(f'line {i}')\n"})
    with shared_agent.client() as client:
        job = client.submit(["job.py"], workdir=root)
        followed = b"".join(job.logs(follow=True))
        assert job.wait(30).state == JobState.succeeded
        on_disk = (shared_agent.home / "jobs" / job.id / "output.log").read_bytes()
        assert followed == on_disk
        assert followed.decode().splitlines()[-1] == "line 1999"
        assert b"".join(job.logs(offset=1234)) == on_disk[1234:]


def test_metrics_are_read_by_line(shared_agent, project):
    root = project(
        {
            "job.py": "from gpuhop.runtime import log_metrics\n"
            "for e in range(1, 4):\n"
            "    log_metrics(epoch=e, step=e * 10, loss=1.0 / e)\n"
        }
    )
    with shared_agent.client() as client:
        job = client.submit(["job.py"], workdir=root)
        info = job.wait(60)
        records, offset = job.metrics()
        again, _ = job.metrics(offset)
    assert info.state == JobState.succeeded
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert again == []
    assert info.latest_metrics["epoch"] == 3
    assert info.latest_metrics["loss"] == pytest.approx(1 / 3)


def test_a_diverged_loss_shows_as_nan(shared_agent, project):
    # NaN and infinity were written as null: `show` said "loss=None", as if no loss came.
    root = project(
        {
            "job.py": "from gpuhop.runtime import log_metrics\n"
            "log_metrics(epoch=1, loss=float('nan'), grad=float('inf'), low=float('-inf'))\n"
        }
    )
    with shared_agent.client() as client:
        info = client.submit(["job.py"], workdir=root).wait(60)
    assert info.state == JobState.succeeded
    metrics = info.latest_metrics
    assert (metrics["loss"], metrics["grad"], metrics["low"]) == ("nan", "inf", "-inf")
    show = shared_agent.cli("show", info.id)
    assert "loss=nan grad=inf low=-inf" in show.stdout, show.stdout


def test_a_tensor_scalar_is_read_through_item_without_a_warning(shared_agent, project):
    # log_metrics(loss=loss) with the loss that backward() used: float() of a PyTorch tensor
    # that requires grad warns, in the job's log (and fails a job run with -W error). The
    # stand-in warns in __float__ as such a tensor does; item() is what PyTorch, numpy and
    # JAX scalars all have, and it does not warn.
    root = project(
        {
            "job.py": "import warnings\n"
            "warnings.simplefilter('error')\n"
            "from gpuhop.runtime import log_metrics\n"
            "class Loss:\n"
            "    def item(self):\n"
            "        return 1.5\n"
            "    def __float__(self):\n"
            "        warnings.warn('Converting a tensor with requires_grad=True to a scalar')\n"
            "        return 1.5\n"
            "class Many:\n"
            "    def item(self):\n"
            "        raise RuntimeError('a Tensor with 3 elements cannot be converted to Scalar')\n"
            "    def __repr__(self):\n"
            "        return 'tensor([0.5000, 0.5000, 0.5000])'\n"
            "log_metrics(step=7, epoch=1, loss=Loss(), grads=Many())\n"
        }
    )
    with shared_agent.client() as client:
        job = client.submit(["job.py"], workdir=root)
        info = job.wait(120)
        out = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, out
    assert out == ""
    metrics = info.latest_metrics
    assert (metrics["step"], metrics["loss"]) == (7, 1.5)
    assert metrics["grads"] == "tensor([0.5000, 0.5000, 0.5000])"  # not a scalar: as printed


def test_artifacts_are_listed_and_pulled(shared_agent, project, tmp_path):
    root = project(
        {
            "job.py": "import os\n"
            "d = os.environ['GPUHOP_ARTIFACTS_DIR']\n"
            "os.makedirs(os.path.join(d, 'sub'))\n"
            "open(os.path.join(d, 'sub', 'model.bin'), 'wb').write(b'x' * 100000)\n"
            "open(os.path.join(d, 'notes.txt'), 'w').write('ok')\n"
            "os.symlink('/etc/passwd', os.path.join(d, 'leak'))\n"
        }
    )
    with shared_agent.client() as client:
        job = client.submit(["job.py"], workdir=root)
        assert job.wait(60).state == JobState.succeeded
        assert [a.path for a in job.artifacts()] == ["notes.txt", "sub/model.bin"]
        files = job.pull(tmp_path / "out")
        assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in files) == [
            "notes.txt",
            "sub/model.bin",
        ]
        assert (tmp_path / "out" / "sub" / "model.bin").read_bytes() == b"x" * 100000
        with raw(shared_agent) as http:
            leak = http.get(f"/v1/jobs/{job.id}/artifacts/leak")
            up = http.get(f"/v1/jobs/{job.id}/artifacts/..%2F..%2Fjobs.db")
    assert leak.status_code == 400 and "leads out" in leak.json()["message"]
    assert up.status_code in (400, 404)


def test_unchanged_tree_uploads_nothing_the_second_time(shared_agent, project):
    root = project({"job.py": "print('x')\n", "data/a.txt": "a" * 5000, "data/b.txt": "b"})
    with shared_agent.client() as client:
        client.submit(["job.py"], workdir=root).wait(60)
        first = client.last_sync
        client.submit(["job.py"], workdir=root).wait(60)
        second = client.last_sync
    assert first.files == second.files == 3
    assert second.files_sent == 0 and second.bytes_sent == 0


class TestBadInput:
    def test_unknown_job(self, shared_agent):
        with shared_agent.client() as client, pytest.raises(GpuhopError) as e:
            client.job("zzzz-no-such-job")
        assert e.value.status == 404 and "no job matches 'zzzz-no-such-job'" in e.value.message

    def test_ambiguous_prefix(self, shared_agent, project):
        root = project({"job.py": "pass\n"})
        with shared_agent.client() as client:
            ids: list[str] = []
            while len({i[0] for i in ids}) == len(ids):
                ids.append(client.submit(["job.py"], workdir=root).id)
            prefix = ids[-1][0]
            with pytest.raises(GpuhopError) as e:
                client.job(prefix)
        assert e.value.status == 409 and e.value.code == "ambiguous"
        assert "give more of the id" in e.value.message

    def test_missing_command_on_host(self, shared_agent, project):
        root = project({"job.py": "pass\n"})
        with shared_agent.client() as client, pytest.raises(GpuhopError) as e:
            client.submit(["no-such-program-xyz", "--flag"], workdir=root)
        assert e.value.status == 400
        assert "'no-such-program-xyz' was not found on the GPU host" in e.value.message

    def test_missing_script(self, shared_agent, project):
        root = project({"job.py": "pass\n"})
        with shared_agent.client() as client, pytest.raises(GpuhopError) as e:
            client.submit(["nope.py"], workdir=root)
        assert "no such script: nope.py" in e.value.message

    def test_ignored_script(self, shared_agent, project):
        root = project({"job.py": "pass\n", ".gpuhopignore": "job.py\n"})
        with shared_agent.client() as client, pytest.raises(GpuhopError) as e:
            client.submit(["job.py"], workdir=root)
        assert "excluded from the sync" in e.value.message

    def test_more_gpus_than_the_host_has(self, shared_agent, project):
        root = project({"job.py": "pass\n"})
        with shared_agent.client() as client, pytest.raises(GpuhopError) as e:
            client.submit(["job.py"], workdir=root, gpus=1)
        assert e.value.status == 400 and "asks for 1 GPU; this host has 0" in e.value.message

    def test_cancel_a_finished_job(self, shared_agent, project):
        root = project({"job.py": "pass\n"})
        with shared_agent.client() as client:
            job = client.submit(["job.py"], workdir=root)
            job.wait(60)
            with pytest.raises(GpuhopError) as e:
                job.cancel()
        assert e.value.status == 409 and "has already ended: succeeded" in e.value.message

    @pytest.mark.parametrize(
        ("path", "words"),
        [
            ("../escape.py", "'..'"),
            ("/etc/passwd", "absolute"),
            ("a//b.py", "empty components"),
            ("a\\b.py", "backslash"),
        ],
    )
    def test_hostile_tree_paths(self, shared_agent, path, words):
        entry = {"path": path, "digest": "0" * 64, "size": 1}
        before = sorted((shared_agent.home / "trees").iterdir())
        with raw(shared_agent) as http:
            r = http.post("/v1/trees", json={"entries": [entry]})
        assert r.status_code == 422
        body = r.json()
        assert body["code"] == "bad_request" and words in body["message"]
        assert "entries.0.path" in body["message"]
        assert sorted((shared_agent.home / "trees").iterdir()) == before

    def test_duplicate_and_conflicting_paths(self, shared_agent):
        d = "0" * 64
        with raw(shared_agent) as http:
            dup = http.post(
                "/v1/trees", json={"entries": [{"path": "a", "digest": d, "size": 1}] * 2}
            )
            conflict = http.post(
                "/v1/trees",
                json={
                    "entries": [
                        {"path": "a", "digest": d, "size": 1},
                        {"path": "a/b", "digest": d, "size": 1},
                    ],
                },
            )
        assert dup.status_code == 400 and "lists a twice" in dup.json()["message"]
        assert conflict.status_code == 400
        assert "both a file and a directory" in conflict.json()["message"]

    def test_tree_naming_blobs_never_uploaded(self, shared_agent):
        entry = {"path": "x.py", "digest": "ab" * 32, "size": 3}
        with raw(shared_agent) as http:
            r = http.post("/v1/trees", json={"entries": [entry]})
        assert r.status_code == 409
        assert r.json()["code"] == "missing_blobs"
        assert r.json()["detail"] == {"missing": ["ab" * 32]}

    def test_job_naming_an_unknown_tree(self, shared_agent):
        with raw(shared_agent) as http:
            r = http.post("/v1/jobs", json={"command": ["x.py"], "tree": "cd" * 32})
        assert r.status_code == 409 and r.json()["code"] == "missing_tree"

    def test_oversized_tree(self, shared_agent):
        from gpuhop.agent.server.routers.trees import MAX_TREE_BYTES

        tmp = shared_agent.home / "tmp"
        with raw(shared_agent) as http:
            r = http.post(
                "/v1/trees",
                content=oversized(MAX_TREE_BYTES),
                headers={
                    "content-type": "application/json",
                    "content-length": str(MAX_TREE_BYTES + 2),
                },
            )
            assert r.status_code == 413 and r.json()["code"] == "too_large"
            message = r.json()["message"]
            assert f"over {MAX_TREE_BYTES >> 20} MiB" in message and ".gpuhopignore" in message
            # The agent goes on answering, trees included, and kept nothing of that one.
            assert http.get("/v1/jobs").status_code == 200
            entry = {"path": "x.py", "digest": "ab" * 32, "size": 3}
            assert http.post("/v1/trees", json={"entries": [entry]}).status_code == 409
        assert not any(p.name.startswith("tree-") for p in tmp.iterdir())

    def test_oversized_dataset_manifest(self, shared_agent):
        from gpuhop.agent.server.routers.trees import MAX_TREE_BYTES

        with raw(shared_agent) as http:
            r = http.post(
                "/v1/datasets/huge",
                content=oversized(MAX_TREE_BYTES),
                headers={
                    "content-type": "application/json",
                    "content-length": str(MAX_TREE_BYTES + 2),
                },
            )
            assert r.status_code == 413 and r.json()["code"] == "too_large"
            assert "manifest (the list of its files) is over 64 MiB" in r.json()["message"]
            assert http.get("/v1/datasets/huge").status_code == 404

    def test_a_tree_sent_slowly_holds_up_no_other_tree(self, shared_agent):
        # One client sends half a tree and stops; another's tree is checked meanwhile.
        stalled = socket.socket(socket.AF_UNIX)
        try:
            stalled.connect(str(shared_agent.paths.socket))
            stalled.sendall(
                b"POST /v1/trees HTTP/1.1\r\nHost: gpuhop\r\ncontent-type: application/json\r\n"
                b"content-length: 100000\r\n\r\n" + b'{"entries": [' + b" " * 70_000
            )
            entry = {"path": "x.py", "digest": "ab" * 32, "size": 3}
            with raw(shared_agent) as http:
                r = http.post("/v1/trees", json={"entries": [entry]}, timeout=30)
            assert r.status_code == 409 and r.json()["code"] == "missing_blobs"
        finally:
            stalled.close()

    @pytest.mark.parametrize(
        ("body", "words"),
        [
            (b'{"entries": [], "extra": 1}', "extra: a tree has no such field"),
            (b'{"entries": [], "entries": []}', "entries: given twice"),
            (b"{}", "entries: Field required"),
            (b'{"entries": {}}', "expected the list of entries"),
            (b'{"entries": [{"path": "a"', "entries.0 is not valid JSON"),
            (b'{"entries": []} []', "more follows its end"),
            (b'{"entries": ["\xe9"]}', "not valid UTF-8"),
            (
                b'{"entries": [{"path": "\\ud800", "digest": "' + b"0" * 64 + b'", "size": 1}]}',
                "entries.0.path: path is not valid text: it holds a lone surrogate",
            ),
            (
                b'{"entries": [{"path": "a", "digest": "' + b"0" * 64 + b'", "size": -1}]}',
                "entries.0.size",
            ),
        ],
    )
    def test_trees_that_are_not_trees(self, shared_agent, body, words):
        with raw(shared_agent) as http:
            r = http.post("/v1/trees", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "bad_request" and words in r.json()["message"], r.text

    def test_unknown_fields_and_malformed_json(self, shared_agent):
        with raw(shared_agent) as http:
            extra = http.post("/v1/jobs", json={"command": ["true"], "surprise": 1})
            broken = http.post(
                "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
            )
            env = http.post("/v1/jobs", json={"command": ["true"], "env": {"TF_CONFIG": "{}"}})
        assert extra.status_code == 422 and "surprise" in extra.json()["message"]
        assert broken.status_code == 422
        assert env.status_code == 422 and "set by gpuhop" in env.json()["message"]

    def test_blob_whose_content_does_not_match_its_hash(self, shared_agent):
        good = b"good blob content"
        good_digest = hashlib.sha256(good).hexdigest()
        liar_digest = hashlib.sha256(b"what it claims").hexdigest()
        body = (
            FRAME_HEADER.pack(bytes.fromhex(good_digest), len(good))
            + good
            + FRAME_HEADER.pack(bytes.fromhex(liar_digest), 5)
            + b"other"
        )
        blobs = shared_agent.home / "blobs"
        with raw(shared_agent) as http:
            r = http.post("/v1/blobs/upload", content=body)
            missing = http.post("/v1/blobs/missing", json={"digests": [good_digest, liar_digest]})
        assert r.status_code == 400 and r.json()["code"] == "bad_blob"
        assert liar_digest in r.json()["message"]
        # The blob before the bad one was kept; the bad one left nothing behind.
        assert missing.json()["missing"] == [liar_digest]
        assert not (blobs / liar_digest[:2] / liar_digest).exists()
        assert list((shared_agent.home / "tmp").iterdir()) == []


def test_a_body_in_many_uneven_pieces_is_stored_exactly(shared_agent):
    # The agent keeps a body as the pieces that arrived (protocol.BodyHttpProtocol): pieces
    # of 1 byte to 100 KiB, frame headers split across them, must come out in order.
    blobs = [os.urandom(n) for n in (1, 70_000, 300_000, 5, 1_000_000)]
    body = b"".join(FRAME_HEADER.pack(hashlib.sha256(b).digest(), len(b)) + b for b in blobs)
    sizes = [1, 3, 39, 7_000, 100_000, 2, 65_537, 13]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(shared_agent.paths.socket))
        sock.sendall(
            b"POST /v1/blobs/upload HTTP/1.1\r\nhost: gpuhop\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        )
        pos, i = 0, 0
        while pos < len(body):
            sock.sendall(body[pos : pos + sizes[i % len(sizes)]])
            pos += sizes[i % len(sizes)]
            i += 1
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["stored"] == len(blobs)
    for b in blobs:
        digest = hashlib.sha256(b).hexdigest()
        assert (shared_agent.home / "blobs" / digest[:2] / digest).read_bytes() == b


def test_socket_is_private_and_no_tcp_port_is_open(shared_agent):
    sock = shared_agent.paths.socket
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(shared_agent.home.stat().st_mode) == 0o700
    inodes = set()
    for fd in Path(f"/proc/{shared_agent.pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue  # closed since the listing (a kept connection timing out, say)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    assert inodes, "the agent should hold at least its Unix socket"
    # The agent may hold connections it made (the serving proxy keeps some to model
    # servers for a few seconds); what it must not have is a TCP socket that listens
    # (state 0A) or any UDP socket.
    for table in ("/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp", "/proc/net/udp6"):
        rows = [line.split() for line in Path(table).read_text().splitlines()[1:]]
        tcp = "tcp" in table
        listening = {row[9] for row in rows if not tcp or row[3] == "0A"}
        assert not inodes & listening, f"the agent has an inet socket in {table}"
