# ruff: noqa: F811 (the fixtures imported from test_tls are parameters here)
"""A job in a container image has its user's home as HOME, as a venv job on a team agent
has: what libraries cache under ~ (pip, Keras's datasets, Hugging Face) is there for the
user's next job, is none of the job's outputs (`pull` brings none of it back), and reaches
no other user's job. A single-user agent gives its image jobs a home of its making in the
state dir (the host's home holds the state dir itself); a team agent, each user's identity's.
Real agents, real Podman, the minimal image (tests/images.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.client import Client
from tests.conftest import Agent
from tests.integration.test_tls import remote  # noqa: F401 (a fixture)
from tests.team import team_agent, team_tokens

pytestmark = pytest.mark.timeout(300)

# Reads ~/.cache/marker, writes it with `write`, and says whether it can see `argv[2]` (a
# path on the host: another user's home).
CACHE = r"""
import json, os, sys
marker = os.path.join(os.path.expanduser("~"), ".cache", "marker")
found = open(marker).read() if os.path.exists(marker) else None
if sys.argv[1] == "write":
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    with open(marker, "w") as f:
        f.write(os.environ["GPUHOP_JOB_ID"])
other = sys.argv[2] if len(sys.argv) > 2 else None
report = {
    "home": os.environ["HOME"],
    "found": found,
    "other": None if other is None else os.path.exists(other),
}
print("REPORT " + json.dumps(report), flush=True)
"""


def report(client: Client, root: Path, image: str, *args: str) -> tuple[str, dict]:
    """Run CACHE in `image` with `args`: its job id and what it reported."""
    job = client.submit(["cache.py", *args], workdir=root, image=image)
    info = job.wait(120)
    text = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, f"{info.reason}\n{text}"
    line = next(x for x in text.splitlines() if x.startswith("REPORT "))
    return job.id, json.loads(line[len("REPORT ") :])


def test_an_image_jobs_home_is_kept_for_the_users_next_job_and_never_pulled(
    make_agent, minimal_image, project, tmp_path
):
    agent: Agent = make_agent()
    root = project({"cache.py": CACHE})
    with agent.client() as client:
        first, wrote = report(client, root, minimal_image, "write")
        _, read = report(client, root, minimal_image, "read")
        home = agent.paths.user_home(os.getuid())  # the agent's user's, as the test's
        # Not the work dir (Podman's default for a uid the image has no account for).
        assert wrote["home"] == read["home"] == str(home)
        assert wrote["found"] is None and read["found"] == first
        assert (home / ".cache" / "marker").read_text() == first
        # None of it is the job's output: not in its work dir, nor pulled back.
        jp = agent.paths.job_dir(first)
        assert not (jp / "work" / ".cache").exists()
        out, work = tmp_path / "out", tmp_path / "work"
        pulled = client.job(first).pull(out, workdir=work)
        assert pulled == [] and not list(out.rglob("marker")) and not list(work.rglob("marker"))


@pytest.fixture(scope="module")
def tls_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """A team agent (run as root, as the README offers): each user's jobs run as an
    identity of their own, with a home of their own."""
    with team_agent(Path(tmp_path_factory.mktemp("image-home-team")), 0) as agent:
        yield agent


def test_a_team_users_image_jobs_share_their_home_and_no_other_user_sees_it(
    tls_agent, remote, minimal_image, project
):
    tokens = team_tokens(tls_agent)
    root = project({"cache.py": CACHE})
    alice, bob = remote(tokens["alice"]), remote(tokens["bob"])
    first, wrote = report(alice, root, minimal_image, "write")
    _, read = report(alice, root, minimal_image, "read")
    uids = json.loads((tls_agent.paths.home / "identities.json").read_text())
    home = tls_agent.paths.user_home(uids["alice"])
    # Her identity's home, as her venv jobs have.
    assert wrote["home"] == read["home"] == str(home)
    assert wrote["found"] is None and read["found"] == first
    # bob's jobs have a home of their own, and alice's is not in their view.
    _, his = report(bob, root, minimal_image, "read", str(home))
    uids = json.loads((tls_agent.paths.home / "identities.json").read_text())
    assert his["home"] == str(tls_agent.paths.user_home(uids["bob"]))
    assert his["found"] is None and his["other"] is False
