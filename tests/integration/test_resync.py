"""Re-syncs on real agents: the client asks the agent only about the files its scan hashed,
so an edit is sent and nothing else, and an agent that lacks files the hash cache already
knew (a second agent, the same project) still gets every one of them."""

from __future__ import annotations

import os
import time

from gpuhop import Client
from gpuhop.api import JobState
from gpuhop.client.sync import RACY_WINDOW_NS
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
