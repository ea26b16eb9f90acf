"""A job owns nothing but its own, for Python environments: on a real team agent (TLS on
loopback, users alice and bob by token) each user's jobs get environments of their own. This
failed on the code before: alice's job imported what bob's build had installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.api import JobState
from tests.conftest import Agent
from tests.integration import test_envs, test_tls
from tests.integration.test_envs import SCRIPT, pip_env
from tests.team import team_agent, team_tokens

# remote(token) -> a Client of this module's agent with that token (test_tls's fixture).
remote = test_tls.remote
# wheels -> a directory holding tinypkg-1.0 (test_envs's fixture).
wheels = test_envs.wheels


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
    ran = {}
    for user in ("bob", "alice"):  # the same files and variables, bob first
        with remote(tokens[user]) as client:
            job = client.submit(["job.py"], workdir=root, env=pip_env(wheels))
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
