"""A team agent over TLS, set up and used through the CLI as users do: the owner makes
tokens, each user adds the remote (pinning the certificate) and runs jobs on it."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from gpuhop.client.transport.tls import fetch_certificate
from tests.conftest import Agent


@pytest.fixture
def team(make_agent) -> Agent:
    return make_agent(args=("--listen", "127.0.0.1:0"))


def as_user(team: Agent, tmp_path: Path, user: str):
    """Run the CLI as `user`: their own config dir (remotes.json) and cache."""
    home = tmp_path / user

    def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        return team.cli(
            *args,
            cwd=cwd,
            env={
                **team.env,
                "GPUHOP_CONFIG_DIR": str(home / "config"),
                "GPUHOP_CACHE_DIR": str(home / "cache"),
                **env,
            },
        )

    return cli


def test_team_agent_end_to_end(team: Agent, tmp_path: Path, project) -> None:
    made = team.cli("agent", "token", "create", "alice")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    (tmp_path / "alice-token").write_text(token + "\n")
    url = team.listener.url
    _, fingerprint = fetch_certificate(url)
    alice = as_user(team, tmp_path, "alice")

    # A fingerprint that is not the agent's: refused, nothing stored.
    wrong = "SHA256:" + ":".join(["AB"] * 32)
    refused = alice("remote", "add", "team", url, "--fingerprint", wrong,
                    "--token-file", str(tmp_path / "alice-token"))  # fmt: skip
    assert refused.returncode != 0
    assert "not the one you gave" in refused.stderr and fingerprint in refused.stderr
    assert not (tmp_path / "alice" / "config" / "remotes.json").exists()

    # No fingerprint and no terminal to confirm on: refused, with the one to check.
    unconfirmed = alice("remote", "add", "team", url, "--token-file", str(tmp_path / "alice-token"))
    assert unconfirmed.returncode != 0
    assert fingerprint in unconfirmed.stderr and "--fingerprint" in unconfirmed.stderr

    # The command `token create` gives, pasted as it is (the token in $GPUHOP_TOKEN, where
    # it asks for it on a terminal), adds the agent: its address and fingerprint are real.
    hint = next(line for line in made.stderr.splitlines() if "gpuhop remote add" in line)
    argv = shlex.split(hint)
    assert argv[:3] == ["gpuhop", "remote", "add"] and argv[4:] == [
        url, "--fingerprint", fingerprint
    ]  # fmt: skip
    name = argv[3]
    added = alice(*argv[1:], GPUHOP_TOKEN=token)
    assert added.returncode == 0, added.stderr
    stored = json.loads((tmp_path / "alice" / "config" / "remotes.json").read_text())
    assert stored["remotes"][name]["fingerprint"] == fingerprint
    assert alice("remote", "rm", name).returncode == 0
    added = alice("remote", "add", "team", url, "--fingerprint", fingerprint.lower(),
                  "--token-file", str(tmp_path / "alice-token"))  # fmt: skip
    assert added.returncode == 0, added.stderr

    tested = alice("remote", "test", "team")
    assert tested.returncode == 0, tested.stderr
    assert "you are alice" in tested.stderr

    root = project({"hello.py": "print('hello from the team agent')"})
    ran = alice("run", "hello.py", cwd=root)
    assert ran.returncode == 0, ran.stderr
    assert "hello from the team agent" in ran.stdout
    listed = json.loads(alice("ps", "--json").stdout)
    assert [j["owner"] for j in listed] == ["alice"]

    # Bob, with his own token, sees none of it.
    bob_token = team.cli("agent", "token", "create", "bob").stdout.strip()
    bob = as_user(team, tmp_path, "bob")
    assert bob("remote", "add", "team", url, "--yes", GPUHOP_TOKEN=bob_token).returncode == 0
    assert json.loads(bob("ps", "--json").stdout) == []
    hidden = bob("show", listed[0]["id"])
    assert hidden.returncode != 0 and "no job" in hidden.stderr

    # Alice's dataset is hers until she shares it.
    data = project({"labels.csv": "a,b\n"})
    pushed = alice("data", "push", str(data), "--name", "labels", "-q")
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(bob("data", "ls", "--json").stdout) == []
    assert "no dataset named" in bob("data", "show", "labels").stderr
    shared = alice("data", "share", "labels", "bob")
    assert shared.returncode == 0 and "shared with: bob" in shared.stderr, shared.stderr
    seen = bob("data", "ls")
    assert seen.returncode == 0 and "labels" in seen.stdout and "alice" in seen.stdout
    assert alice("data", "unshare", "labels", "bob").returncode == 0
    assert json.loads(bob("data", "ls", "--json").stdout) == []
    assert alice("data", "push", str(data), "--name", "labels", "--shared", "-q").returncode == 0
    assert [d["shared_with"] for d in json.loads(bob("data", "ls", "--json").stdout)] == [["*"]]

    # A revoked token stops working at once, with words that say so.
    tokens = json.loads(team.cli("agent", "token", "ls", "--json").stdout)
    alice_id = next(t["id"] for t in tokens if t["user"] == "alice")
    assert team.cli("agent", "token", "revoke", alice_id).returncode == 0
    after = alice("ps")
    assert after.returncode != 0
    assert "refused the token" in after.stderr
