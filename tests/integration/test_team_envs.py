"""A job owns nothing but its own, for Python environments: on a real team agent (TLS on
loopback, users alice and bob by token) each user's jobs get environments of their own, and
requirements name packages and versions only. Both failed on the code before: alice's job
imported what bob's build had installed, and a requirements line could point pip anywhere.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.api import JobState
from tests.conftest import Agent
from tests.integration import test_envs, test_tls
from tests.integration.test_envs import SCRIPT, pip_env
from tests.integration.test_tls import raw_http
from tests.team import team_agent, team_tokens

# remote(token) -> a Client of this module's agent with that token (test_tls's fixture).
remote = test_tls.remote
# wheels -> a directory holding tinypkg-1.0 (test_envs's fixture).
wheels = test_envs.wheels
PRINT = [sys.executable, "-c", "print('ran')"]


@pytest.fixture(scope="module")
def tls_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    root = Path(tmp_path_factory.mktemp("team-envs"))
    with team_agent(root, 0, "--gc-every-hours", "0") as agent:
        yield agent


@pytest.fixture(scope="module")
def tokens(tls_agent: Agent) -> dict[str, str]:
    return team_tokens(tls_agent)


def test_each_user_builds_their_own_environment(remote, tokens, tls_agent, project, wheels):
    root = project({"job.py": SCRIPT, "requirements.txt": "tinypkg==1.0\n"})
    # In the tree: a team job's build sees nothing of the host's /var/tmp but its own.
    shutil.copytree(wheels, root / "wheels")
    ran = {}
    for user in ("bob", "alice"):  # the same files and variables, bob first
        with remote(tokens[user]) as client:
            job = client.submit(["job.py"], workdir=root, env=pip_env(Path("wheels")))
            info = job.wait(timeout=180)
            out = b"".join(job.logs()).decode()
        assert info.state == JobState.succeeded, out
        assert "building environment" in out and "reused" not in out, out
        assert info.python_env is not None
        assert f"prefix {tls_agent.home / 'envs' / info.python_env}" in out
        ran[user] = info.python_env
    assert ran["alice"] != ran["bob"]
    envs = tls_agent.home / "envs"
    assert (envs / ran["alice"]).is_dir() and (envs / ran["bob"]).is_dir()
    # Each lists only their own (its requirements are theirs); an admin lists both.
    for user, own in (("alice", ran["alice"]), ("bob", ran["bob"])):
        with raw_http(tls_agent, tokens[user]) as client:
            listed = [e["id"] for e in client.get("/v1/envs").json()]
        assert listed == [own], (user, listed)
    with raw_http(tls_agent, tokens["carol"]) as admin:
        listed = [e["id"] for e in admin.get("/v1/envs").json()]
    assert set(listed) >= {ran["alice"], ran["bob"]}


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("-r other.txt", "it passes pip an option"),
        ("-c constraints.txt", "it passes pip an option"),
        ("-e .", "it passes pip an option"),
        ("--find-links /home/bob/wheels", "it passes pip an option"),
        ("-f /home/bob/wheels", "it passes pip an option"),
        ("--index-url https://pypi.example/simple", "it passes pip an option"),
        ("-i https://pypi.example/simple", "it passes pip an option"),
        ("--extra-index-url https://pypi.example/simple", "it passes pip an option"),
        ("--trusted-host pypi.example", "it passes pip an option"),
        ("--pre", "it passes pip an option"),
        ("numpy==1.26.4 --hash=sha256:00", "it passes pip an option"),
        # pip splits a line on spaces before it parses a marker: this is `-i` too.
        ("numpy; python_version == ' -i https://pypi.example'", "it passes pip an option"),
        ("alicepkg @ https://example.com/alicepkg-1.0.whl", "it names a URL"),
        ("git+https://example.com/alicepkg.git", "it names a URL"),
        ("file:///home/bob/alicepkg", "it names a URL"),
        ("./alicepkg", "it names a path"),
        ("/home/bob/alicepkg-1.0-py3-none-any.whl", "it names a path"),
        ("file:alicepkg", "it names a path"),
        ("alicepkg-1.0-py3-none-any.whl", "pip would take it for the path of an archive file"),
        ("numpy==${NUMPY_VERSION}", "pip would put an environment variable's value there"),
    ],
)
def test_a_team_agent_takes_package_names_and_versions_only(tls_agent, tokens, line, why):
    text = f"# ours\nnumpy>=1.26\n{line}  # a comment\n"
    with raw_http(tls_agent, tokens["alice"]) as alice:
        r = alice.post("/v1/jobs", json={"command": PRINT, "requirements": text})
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert f"requirements line 3 ({line!r}): {why}" in message, message
    assert "would make the agent read or fetch what a user names" in message


def test_a_team_agent_refuses_an_encoding_that_hides_a_line(tls_agent, tokens):
    # UTF-7 for "--index-url https://pypi.example": pip honours a coding line.
    text = "# -*- coding: utf-7 -*-\n+AC0ALQ-index-url https://pypi.example\nnumpy\n"
    with raw_http(tls_agent, tokens["alice"]) as alice:
        r = alice.post("/v1/jobs", json={"command": PRINT, "requirements": text})
    assert r.status_code == 400, r.text
    assert "requirements line 1" in r.json()["message"]
    assert "pip would read the file in the encoding it names" in r.json()["message"]


def test_a_team_agent_takes_extras_versions_and_markers(tls_agent, tokens):
    text = (
        "# the team's set\n"
        "numpy>=1.26; python_version>'3.9'\n"
        "tensorflow[and-cuda]==2.21.0  # pinned\n"
        "zope.interface \\\n"
        "    ~=7.0\n"
    )
    # No index: the job's build fails at once, without the network; the submit is the test.
    with raw_http(tls_agent, tokens["alice"]) as alice:
        r = alice.post(
            "/v1/jobs",
            json={"command": PRINT, "requirements": text, "env": {"PIP_NO_INDEX": "1"}},
        )
        assert r.status_code == 201, r.text
        alice.post(f"/v1/jobs/{r.json()['id']}/cancel", params={"grace": 0})
