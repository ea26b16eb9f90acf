"""Re-syncs on real agents: the client asks the agent only about the files its scan hashed,
so an edit is sent and nothing else, and an agent that lacks files the hash cache already
knew (a second agent, the same project) still gets every one of them."""

from __future__ import annotations

import base64
import hashlib
import os
import time
from typing import NamedTuple

import pytest

from gpuhop import Client
from gpuhop.api import JobState
from gpuhop.api.trees import tree_bytes
from gpuhop.client import GpuhopError
from gpuhop.client.submitted import tree_of
from gpuhop.client.sync.trees import LastTree
from gpuhop.client.sync.workdir import RACY_WINDOW_NS, scan
from tests.conftest import wait_until

FILES = {"show.py": "import sys\nprint(open(sys.argv[1]).read())\n", "a.txt": "first"}
FILES |= {f"more/{i}.txt": f"file {i}" for i in range(20)}


def _settled(root) -> None:
    """Wait until every file is older than the hash cache's racy window (a file changed
    within it is hashed again by every scan), so that the next scan caches them all."""
    newest = max(os.stat(os.path.join(d, n)).st_ctime for d, _, ns in os.walk(root) for n in ns)
    wait_until(lambda: time.time() > newest + RACY_WINDOW_NS / 1e9 + 0.1, timeout=10)


def _shows(client: Client, root, path: str) -> str:
    job = client.submit(["show.py", path], workdir=root)
    assert job.wait(60).state == JobState.succeeded, job.info.reason
    return b"".join(job.logs()).decode().strip()


def test_a_re_sync_after_an_edit_sends_the_edit_and_nothing_else(make_agent, project):
    agent = make_agent()
    root = project(FILES)
    _settled(root)
    with agent.client() as client:
        assert _shows(client, root, "a.txt") == "first"
        assert client.last_sync is not None and client.last_sync.files_sent == len(FILES)
        (root / "a.txt").write_text("FIRST")  # the same size: the hash cache must notice
        assert _shows(client, root, "a.txt") == "FIRST"
        assert client.last_sync.hashed == 1 and client.last_sync.files_sent == 1
        assert _shows(client, root, "more/3.txt") == "file 3"
        assert client.last_sync.files_sent == 0


def test_an_agent_that_lacks_files_the_hash_cache_knew_gets_them_all(make_agent, project):
    first, second = make_agent(), make_agent()
    root = project(FILES)
    _settled(root)
    with first.client() as client:
        assert _shows(client, root, "a.txt") == "first"
    # The same hash cache (one user's machine), another agent: the scan hashes nothing.
    with Client(second.home, autostart=False, cache_dir=first.cache) as client:
        assert _shows(client, root, "more/7.txt") == "file 7"
        assert client.last_sync is not None
        assert client.last_sync.hashed == 0 and client.last_sync.files_sent == len(FILES)


# Prints each file under src/ as the job sees it: path, executable or not, content digest.
LISTER = """import hashlib, os
for top, _, names in os.walk("src"):
    for name in names:
        path = os.path.join(top, name)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
        print(path, os.access(path, os.X_OK), digest)
"""
TREE = {
    "list.py": LISTER,
    ".gpuhopignore": "src/*.tmp\n",
    "src/a.txt": "alpha",
    "src/b.txt": "bravo",
    "src/sub/c.txt": "charlie",
}


def _expected(root) -> list[str]:
    """What LISTER should print for the work dir as it is here (links followed, .tmp
    files left out as .gpuhopignore says)."""
    lines = []
    for top, _, names in os.walk(root / "src"):
        for name in names:
            path = os.path.join(top, name)
            if name.endswith(".tmp") and top == str(root / "src"):
                continue
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()[:12]
            lines.append(f"{os.path.relpath(path, root)} {os.access(path, os.X_OK)} {digest}")
    return sorted(lines)


def _listed(client: Client, root) -> list[str]:
    job = client.submit(["list.py"], workdir=root)
    assert job.wait(60).state == JobState.succeeded, job.info.reason
    return sorted(b"".join(job.logs()).decode().splitlines())


def test_edits_renames_removals_modes_and_links_go_as_deltas(make_agent, project):
    agent = make_agent()
    root = project(TREE)
    with agent.client() as client:
        assert _listed(client, root) == _expected(root)
        assert client.last_sync is not None and client.last_sync.tree_sent == "whole"
        steps = [
            lambda: (root / "src/a.txt").write_text("ALPHA"),  # same size, same second
            lambda: (root / "src/b.txt").rename(root / "src/sub/b2.txt"),
            lambda: (root / "src/sub/c.txt").unlink(),
            lambda: (root / "src/a.txt").chmod(0o755),
            lambda: (root / "src/link.txt").symlink_to("sub/b2.txt"),
            lambda: (root / "src/d").mkdir() or (root / "src/d/new.txt").write_text("delta"),
        ]
        for step in steps:
            step()
            (root / "src/scratch.tmp").write_text(f"ignored {time.time()}")
            assert _listed(client, root) == _expected(root)
            assert client.last_sync.tree_sent == "delta"
        # Nothing changed: the agent has the tree, nothing is sent.
        assert _listed(client, root) == _expected(root)
        assert client.last_sync.tree_sent == "" and client.last_sync.files_sent == 0


def test_a_delta_an_agent_cannot_take_goes_whole(make_agent, project):
    """Another agent (the same user's hash cache and record of the last tree), and a
    record of the last tree that is no longer readable: the tree goes whole, and the job
    sees the edit."""
    first, second = make_agent(), make_agent()
    root = project(TREE)
    with first.client() as client:
        assert _listed(client, root) == _expected(root)
    (root / "src/a.txt").write_text("edited")
    with Client(second.home, autostart=False, cache_dir=first.cache) as client:
        assert _listed(client, root) == _expected(root)
        assert client.last_sync is not None and client.last_sync.tree_sent == "whole"
    with first.client() as client:
        (root / "src/b.txt").write_text("edited too")
        for record in (first.cache / "trees").iterdir():
            record.write_bytes(b"gpuhop-tree-1\n" + b"0" * 10)
        assert _listed(client, root) == _expected(root)
        assert client.last_sync is not None and client.last_sync.tree_sent == "whole"
        (root / "src/sub/c.txt").write_text("and again")
        assert _listed(client, root) == _expected(root)
        assert client.last_sync.tree_sent == "delta"


class _Last(NamedTuple):
    digest: str
    entries: list[tuple[str, str, int, bool]]


def _last(agent, root) -> _Last:
    """The tree the work dir sent last: its digest as the client recorded it, and its
    entries as a scan (with no hash cache) finds them."""
    digest = LastTree.digest_of(agent.cache, root)
    assert digest is not None
    files = scan(root).files
    assert tree_of(files)[1] == digest
    return _Last(digest, [(f.path, f.digest, f.size, f.executable) for f in files])


def test_a_delta_whose_inline_content_is_wrong_is_refused(make_agent, project):
    agent = make_agent()
    root = project(TREE)
    with agent.client() as client:
        assert _listed(client, root) == _expected(root)
        last = _last(agent, root)
        data = b"the new file"
        digest = hashlib.sha256(data).hexdigest()
        entries = sorted([*last.entries, ("src/new.txt", digest, len(data), False)])
        body = {
            "parent": last.digest,
            "digest": hashlib.sha256(tree_bytes(entries)).hexdigest(),
            "changed": [{"path": "src/new.txt", "digest": digest, "size": len(data)}],
        }
        for blob, code, words in [
            (base64.b64encode(b"something else").decode(), "bad_blob", "its content hashes"),
            ("not base64!", "bad_request", f"blobs.{digest}: not base64"),
            (None, "missing_blobs", "1 file(s) of the tree have not been uploaded"),
        ]:
            sent = {**body, "blobs": {digest: blob}} if blob else body
            with pytest.raises(GpuhopError) as refused:
                client.session.request("POST", "/v1/trees/delta", json=sent)
            assert (refused.value.code, words in refused.value.message) == (code, True)
        sent = {**body, "blobs": {digest: base64.b64encode(data).decode()}}
        stored = client.session.request("POST", "/v1/trees/delta", json=sent).json()
        assert (stored["digest"], stored["files"]) == (body["digest"], len(entries))


def test_an_edit_goes_inside_the_job_request(make_agent, project, monkeypatch):
    """A re-sync after an edit is one request: the job's, with the tree's delta inside."""
    agent = make_agent()
    root = project(TREE)
    with agent.client() as client:
        assert _listed(client, root) == _expected(root)
        sent: list[str] = []
        send = client.session.send

        def spy(method: str, url: str, **kwargs):
            sent.append(f"{method} {url}")
            return send(method, url, **kwargs)

        monkeypatch.setattr(client.session, "send", spy)
        (root / "src/a.txt").write_text("edited in one request")
        job = client.submit(["list.py"], workdir=root)
        assert sent == ["POST /v1/jobs"]
        assert client.last_sync is not None and client.last_sync.tree_sent == "delta"
        assert client.last_sync.files_sent == 1
        assert job.wait(60).state == JobState.succeeded, job.info.reason
        assert sorted(b"".join(job.logs()).decode().splitlines()) == _expected(root)


def test_a_job_request_with_a_bad_delta_is_refused_and_stores_nothing(make_agent, project):
    agent = make_agent()
    root = project(TREE)
    with agent.client() as client:
        assert _listed(client, root) == _expected(root)
        last = _last(agent, root)
        data = b"a file new to the agent"
        blob = hashlib.sha256(data).hexdigest()
        entries = sorted([*last.entries, ("src/new.txt", blob, len(data), False)])
        tree = hashlib.sha256(tree_bytes(entries)).hexdigest()
        delta = {
            "parent": last.digest,
            "digest": tree,
            "changed": [{"path": "src/new.txt", "digest": blob, "size": len(data)}],
            "blobs": {blob: base64.b64encode(data).decode()},
        }

        def submit(tree: str = tree, **changes) -> dict:
            body = {"command": ["list.py"], "tree": tree, "tree_delta": {**delta, **changes}}
            return client.session.request("POST", "/v1/jobs", json=body).json()

        unknown, wrong = "0" * 64, "1" * 64
        jobs = len(client.jobs())
        for bad, status, code, words in [
            ({"parent": unknown}, 409, "missing_tree", f"tree {unknown} is not on the agent"),
            ({"digest": wrong, "tree": wrong}, 422, "bad_request", f"makes tree {tree}, not"),
            ({"blobs": {}}, 409, "missing_blobs", "have not been uploaded"),
            ({"blobs": {blob: base64.b64encode(b"else").decode()}}, 400, "bad_blob", "hashes"),
            ({"removed": ["src/gone.txt"]}, 400, "bad_path", "src/gone.txt, which its parent"),
            ({"tree": last.digest}, 422, "bad_request", "tree must be its digest"),
        ]:
            with pytest.raises(GpuhopError) as refused:
                submit(**bad)
            assert (refused.value.status, refused.value.code) == (status, code), bad
            assert words in refused.value.message, refused.value.message
        # Nothing was stored: no job, no tree, not the file.
        assert len(client.jobs()) == jobs
        missing = client.session.request("POST", "/v1/blobs/missing", json={"digests": [blob]})
        assert missing.json()["missing"] == [blob]
        with pytest.raises(GpuhopError) as absent:
            client.session.request("POST", "/v1/jobs", json={"command": ["list.py"], "tree": tree})
        assert absent.value.code == "missing_tree"
        # The right one: the tree and the file are stored, and the job sees them.
        job = client.job(submit()["id"])
        assert job.wait(60).state == JobState.succeeded, job.info.reason
        lines = b"".join(job.logs()).decode().splitlines()
        assert f"src/new.txt False {blob[:12]}" in lines


# Prints the sha256 of every .bin file the job sees.
DIGESTS = """import glob, hashlib
for path in sorted(glob.glob("*.bin")):
    print(path, hashlib.sha256(open(path, "rb").read()).hexdigest())
"""


def test_a_first_upload_is_sent_while_it_is_hashed(shared_agent, project, monkeypatch):
    # Batches of 500 kB instead of 64 MiB: this 2.4 MB tree goes while it is hashed
    # (upload.EarlySender); the job sees every byte of every file.
    from gpuhop.client.sync import upload

    monkeypatch.setattr(upload, "UPLOAD_BATCH_BYTES", 500_000)
    root = project({})
    blobs = {f"{i}.bin": os.urandom(300_000) for i in range(8)}
    for name, data in blobs.items():
        (root / name).write_bytes(data)
    digests = [hashlib.sha256(data).hexdigest() for data in blobs.values()]
    # Eight files are hashed one after another (more go to a pool of threads). A batch
    # goes every two; the third waits until the first is sent (EarlySender.AHEAD), so the
    # agent holds files of this tree before the scan has hashed its seventh.
    held: list[int] = []
    with shared_agent.client() as client, shared_agent.client() as watcher:

        def on_hash(size: int) -> None:
            missing = watcher.session.request(
                "POST", "/v1/blobs/missing", json={"digests": digests}
            ).json()["missing"]
            held.append(len(digests) - len(missing))

        job = client.submit(["python", "-c", DIGESTS], workdir=root, on_hash=on_hash)
        assert job.wait(60).state == JobState.succeeded, job.info.reason
        seen = b"".join(job.logs()).decode().split()
        sync = client.last_sync
    assert seen == [x for n in sorted(blobs) for x in (n, hashlib.sha256(blobs[n]).hexdigest())]
    assert len(held) == len(blobs) and held[0] == 0
    assert max(held[:-1]) >= 2, f"files the agent held after each was hashed: {held}"
    assert sync is not None and sync.files_sent == 8 and sync.bytes_sent == 8 * 300_000


def test_an_early_batch_the_agent_refuses_stops_the_rest(shared_agent, tmp_path):
    from gpuhop.client.sync.upload import EarlySender
    from gpuhop.client.sync.workdir import FileEntry

    def entry(name: str, data: bytes, digest: str | None = None) -> FileEntry:
        (tmp_path / name).write_bytes(data)
        real = hashlib.sha256(data).hexdigest()
        return FileEntry(name, str(tmp_path / name), len(data), digest or real, False)

    liar = entry("liar.bin", os.urandom(1000), digest=hashlib.sha256(b"other").hexdigest())
    later = entry("later.bin", os.urandom(1000))
    with shared_agent.client() as client:
        early = EarlySender(client.session, batch_bytes=1)
        early.hashed(liar)  # as if it changed after it was hashed: refused (bad_blob)
        wait_until(lambda: early._failed, timeout=30)
        early.hashed(later)  # not sent: the scan's error comes first
        with pytest.raises(GpuhopError, match="changed while it was being sent"):
            early.finish()
        missing = client.session.request(
            "POST", "/v1/blobs/missing", json={"digests": [liar.digest, later.digest]}
        ).json()["missing"]
    assert missing == [liar.digest, later.digest]
