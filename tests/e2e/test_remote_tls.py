"""A team agent over TLS, set up and used through the CLI as users do: the owner makes
tokens, each user adds the remote (pinning the certificate) and runs jobs on it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhop.client.transport.tls import fetch_certificate
from tests.certs import expired_certificate, tls_server
from tests.conftest import Agent, wait_until
from tests.team import team_tokens


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
    (tmp_path / "alice-token").chmod(0o600)  # else refused, as ssh refuses such a key
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


def test_a_token_file_others_can_read_is_refused_as_ssh_refuses_such_a_key(
    team: Agent, tmp_path: Path
) -> None:
    token = team.cli("agent", "token", "create", "alice").stdout.strip()
    token_file = tmp_path / "alice-token"
    token_file.write_text(token + "\n")
    url = team.listener.url
    _, fingerprint = fetch_certificate(url)
    alice = as_user(team, tmp_path, "alice")
    add = ("remote", "add", "team", url, "--fingerprint", fingerprint, "--token-file")
    for mode in (0o644, 0o640, 0o604, 0o620):
        token_file.chmod(mode)
        refused = alice(*add, str(token_file))
        assert refused.returncode == 2, refused.stderr
        assert (
            f"the token file {token_file} is open to other users (mode {mode:04o}): a token is"
            f" a password. Run `chmod 600 {token_file}`"
        ) in refused.stderr
        assert not (tmp_path / "alice" / "config" / "remotes.json").exists()
    token_file.chmod(0o600)
    added = alice(*add, str(token_file))
    assert added.returncode == 0, added.stderr
    # From a pipe or stdin there is no file mode to check.
    piped = subprocess.run(
        [sys.executable, "-m", "gpuhop", *add, "-", "--replace"],
        input=token,
        env={**team.env, "GPUHOP_CONFIG_DIR": str(tmp_path / "alice" / "config")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 0, piped.stderr
    assert alice("ps").returncode == 0


def test_a_silent_listener_and_a_server_that_is_no_agent_are_named(shared_agent, tmp_path):
    import http.server
    import socket
    import ssl
    import threading

    from gpuhop.agent.server.listen import make_self_signed

    env = {**shared_agent.env, "GPUHOP_CONFIG_DIR": str(tmp_path / "config"), "GPUHOP_TOKEN": "t"}
    # A port that takes connections and never answers (the kernel's backlog accepts them).
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        added = shared_agent.cli("remote", "add", "quiet", url, "--yes", env=env)
        assert added.returncode == 2
        assert f"no answer from {url} within 5 s" in added.stderr

    # An HTTPS server that is not gpuhop's: it answers 404 in words of its own.
    cert, key = make_self_signed(["127.0.0.1"])
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}"
        added = shared_agent.cli("remote", "add", "other", url, "--yes", env=env)
        assert added.returncode == 0, added.stderr
        tested = shared_agent.cli("remote", "test", "other", env=env)
        assert tested.returncode == 2
        assert f"remote 'other' ({url}) is not a gpuhop agent (HTTP 404)" in tested.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_a_replaced_certificate_is_pinned_again_as_the_error_says_keeping_the_token(
    team: Agent, tmp_path: Path
) -> None:
    from gpuhop.agent.server.listen import make_self_signed
    from gpuhop.api import fingerprint_of

    token = team.cli("agent", "token", "create", "alice").stdout.strip()
    (tmp_path / "alice-token").write_text(token + "\n")
    (tmp_path / "alice-token").chmod(0o600)  # else refused, as ssh refuses such a key
    url = team.listener.url
    _, fingerprint = fetch_certificate(url)
    alice = as_user(team, tmp_path, "alice")
    added = alice("remote", "add", "team", url, "--fingerprint", fingerprint,
                  "--token-file", str(tmp_path / "alice-token"))  # fmt: skip
    assert added.returncode == 0, added.stderr
    (tmp_path / "alice-token").unlink()  # shown once, and stored with the remote now
    # The pin names another certificate than the agent's (as after the agent's was replaced).
    remotes_json = tmp_path / "alice" / "config" / "remotes.json"
    stored = json.loads(remotes_json.read_text())
    other = make_self_signed(["127.0.0.1"])[0].decode()
    stored["remotes"]["team"].update(certificate=other, fingerprint=fingerprint_of(other))
    remotes_json.write_text(json.dumps(stored))

    refused = alice("ps")
    assert refused.returncode != 0 and "does not match the pinned fingerprint" in refused.stderr
    hint = shlex.split(refused.stderr.split("run `", 1)[1].split("`", 1)[0])
    assert hint[:3] == ["gpuhop", "remote", "add"] and hint[-1] == "NEW"
    repinned = alice(*hint[1:-1], fingerprint)  # as it says, with no token at hand
    assert repinned.returncode == 0, repinned.stderr
    assert "kept the token stored with remote 'team'" in repinned.stderr
    listed = alice("ps", "--json")
    assert listed.returncode == 0, listed.stderr
    # The token goes to no other URL without being given again.
    other_url = url.replace("127.0.0.1", "localhost")
    elsewhere = alice("remote", "add", "team", other_url, "--replace", "--fingerprint", fingerprint)
    assert elsewhere.returncode != 0 and "needs a token" in elsewhere.stderr


def test_a_gpu_another_users_job_holds_is_shown_taken_not_free(make_agent, tmp_path, project):
    """Bob is not told which job of Alice's holds a GPU, but he is told that it is held:
    `gpus` once showed him the GPU as free (RESERVED and JOBS both `-`)."""
    team = make_agent(fake_gpus=2, args=("--listen", "127.0.0.1:0"))
    tokens = team_tokens(team)
    alice, bob = as_user(team, tmp_path, "alice"), as_user(team, tmp_path, "bob")
    for user, cli in (("alice", alice), ("bob", bob)):
        added = cli("remote", "add", "team", team.listener.url, "--yes", GPUHOP_TOKEN=tokens[user])
        assert added.returncode == 0, added.stderr
    root = project({"hold.py": "import time\ntime.sleep(120)\n"})
    ran = alice("run", "-d", "--gpus", "1", "hold.py", cwd=root)
    assert ran.returncode == 0, ran.stderr
    job_id = ran.stdout.strip()
    try:
        with team.client() as owner:
            wait_until(lambda: any(g.job_ids for g in owner.gpus()), timeout=60)
            held = next(g.index for g in owner.gpus() if g.job_ids)
        rows = {
            line.split()[0]: line
            for line in bob("gpus").stdout.splitlines()
            if line.split() and line.split()[0].isdigit()
        }
        assert rows[str(held)].split()[-3:] == ["other", "users'", "jobs"], rows
        assert " all " in rows[str(held)] and job_id not in rows[str(held)], rows
        assert rows[str(1 - held)].split()[-2:] == ["-", "-"], rows  # the free one
        mine = alice("gpus").stdout
        assert job_id in mine and "other users'" not in mine, mine
    finally:
        alice("cancel", job_id, "--grace", "0")


def test_an_expired_certificate_is_named_as_expired_not_as_another_one(tmp_path):
    """A server presenting a certificate past its end (an agent's that expired while it
    ran; an agent refuses to start with one): `remote add` refuses to pin it, and a remote
    pinned to it before it expired says so. Both once said nothing of it: the pin was
    stored, then every command said the certificate did not match the pinned fingerprint,
    the same one shown twice, and to pin it again."""
    from gpuhop.api import fingerprint_of

    cert, key = expired_certificate(tmp_path)
    user = Agent(tmp_path / "home", tmp_path / "cache", None)  # only its CLI: no agent runs
    config = tmp_path / "alice" / "config"
    env = {**user.env, "GPUHOP_CONFIG_DIR": str(config), "GPUHOP_TOKEN": "gpuhop_alice"}
    with tls_server(cert, key) as url:
        pem, fingerprint = fetch_certificate(url)
        assert fingerprint == fingerprint_of(cert.read_text())
        refused = user.cli("remote", "add", "team", url, "--fingerprint", fingerprint, env=env)
        assert refused.returncode != 0
        assert "no connection would accept" in refused.stderr and "expired on" in refused.stderr
        assert not (config / "remotes.json").exists()

        # Pinned while it was valid (written as `remote add` writes it), refused once expired.
        config.mkdir(parents=True)
        team_remote = {"name": "team", "url": url, "fingerprint": fingerprint, "certificate": pem,
                       "token": "gpuhop_alice"}  # fmt: skip
        (config / "remotes.json").write_text(
            json.dumps({"default": "team", "remotes": {"team": team_remote}})
        )
        failed = user.cli("ps", env=env)
        assert failed.returncode != 0
        assert "presents its pinned certificate" in failed.stderr, failed.stderr
        assert "expired on" in failed.stderr and "does not match" not in failed.stderr
