"""Starting an agent with a TCP listener: refusals, its own certificate, a given one."""

from __future__ import annotations

import datetime
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from gpuhop.agent.server.listen import make_self_signed
from gpuhop.api import fingerprint_of
from gpuhop.client import Client
from gpuhop.client.embedded import start_background
from gpuhop.client.transport.remotes import Remote, RemotesFile, save
from gpuhop.client.transport.tls import fetch_certificate
from gpuhop.home import AgentError, AgentPaths, read_pid
from tests.certs import DAY, certificate, expired_certificate
from tests.conftest import Agent, wait_until


def test_no_tls_on_a_non_loopback_address_is_refused(tmp_path):
    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    refused = agent.cli("agent", "start", "--listen", "0.0.0.0:0", "--no-tls")
    assert refused.returncode != 0
    assert "refusing to listen on 0.0.0.0 without TLS" in refused.stderr
    assert read_pid(agent.paths) is None
    # The agent itself refuses too, whoever starts it.
    with pytest.raises(AgentError, match="without TLS"):
        start_background(
            AgentPaths(tmp_path / "home2"), agent_args=["--listen", "0.0.0.0:0", "--no-tls"]
        )
    assert read_pid(AgentPaths(tmp_path / "home2")) is None


def test_no_tls_is_accepted_on_loopback(make_agent):
    agent = make_agent(args=("--listen", "127.0.0.1:0", "--no-tls"))
    listener = agent.listener
    assert (listener.tls, listener.fingerprint) == (False, None)
    assert listener.url.startswith("http://127.0.0.1:")


def test_the_agent_makes_its_certificate_once_and_keeps_it(make_agent):
    agent = make_agent(args=("--listen", "127.0.0.1:0"))
    first = agent.listener
    key = agent.paths.tls / "key.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(agent.paths.tls.stat().st_mode) == 0o700
    pem, fetched = fetch_certificate(first.url)
    assert (
        fetched == first.fingerprint == fingerprint_of((agent.paths.tls / "cert.pem").read_text())
    )
    from cryptography import x509

    sans = x509.load_pem_x509_certificate(pem.encode()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    names = {str(n.value) for n in sans.value}
    assert {"localhost", "127.0.0.1", "::1"} <= names

    status = agent.cli("agent", "status")
    expires = f"{first.expires:%Y-%m-%d %H:%M} UTC"
    assert (
        f"listening on {first.url} (TLS, certificate {first.fingerprint}, expires {expires})"
        in status.stdout
    )
    assert first.expires.year - datetime.datetime.now(datetime.UTC).year >= 9  # CERT_DAYS
    agent.shutdown()
    assert not agent.paths.listen_file.exists()
    agent.start()
    assert agent.listener.fingerprint == first.fingerprint


def test_agent_start_prints_address_and_fingerprint(tmp_path):
    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    try:
        started = agent.cli("agent", "start", "--listen", "127.0.0.1:0")
        assert started.returncode == 0, started.stderr
        listener = agent.listener
        assert f"listening on {listener.url}" in started.stdout
        assert f"certificate fingerprint {listener.fingerprint}" in started.stdout
    finally:
        agent.shutdown()


def test_a_given_certificate_and_key_are_served(make_agent, tmp_path, monkeypatch, project):
    cert_pem, key_pem = make_self_signed(["localhost", "127.0.0.1", "gpu.example"])
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    cert.write_bytes(cert_pem)
    key.write_bytes(key_pem)
    key.chmod(0o600)
    agent = make_agent(
        args=("--listen", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key))
    )
    assert agent.listener.fingerprint == fingerprint_of(cert_pem.decode())
    assert not agent.paths.tls.exists()
    pem, fingerprint = fetch_certificate(agent.listener.url)
    assert fingerprint == agent.listener.fingerprint

    with agent.client() as owner:
        token = owner.create_token("frank").token
    monkeypatch.setenv("GPUHOP_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("GPUHOP_TOKEN", token)  # overrides the token stored with the remote
    save(
        RemotesFile(
            remotes={
                "team": Remote(
                    name="team",
                    url=agent.listener.url,
                    certificate=pem,
                    fingerprint=fingerprint.replace(":", "").lower(),
                    token="gpuhop_stale",
                )
            }
        )
    )
    with Client(remote="team", cache_dir=agent.cache) as client:
        assert client.info().user == "frank"
        job = client.submit(["job.py"], workdir=project({"job.py": "print('ok')"}))
        assert job.wait(timeout=60).state.value == "succeeded"


def refused_to_start(tmp_path: Path, cert: Path, key: Path) -> str:
    """Start an agent with `cert` and `key`, as `gpuhop agent start` and as the agent itself
    (`python -m gpuhop.agent`, as a service runs it): both refuse, exit 2, nothing started.
    Returns the one line `gpuhop agent start` said, without its "gpuhop: error: "."""
    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    try:
        listen = ("--listen", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key))
        refused = agent.cli("agent", "start", *listen)
        assert refused.returncode == 2, refused.stderr
        assert refused.stdout == ""
        lines = refused.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuhop: error: "), refused.stderr
        assert read_pid(agent.paths) is None
        assert not agent.paths.logfile.exists()  # refused before an agent process was started

        itself = subprocess.run(
            [sys.executable, "-m", "gpuhop.agent", "--home", str(agent.home), *listen],
            env=agent.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert itself.returncode == 2, itself.stderr
        said = lines[0].removeprefix("gpuhop: error: ")
        # The same words, but for the time each said it was (a minute may turn between).
        now = re.compile(r"it is \d{4}-\d\d-\d\d \d\d:\d\d UTC here")
        heard = [now.sub("it is NOW here", line) for line in itself.stderr.splitlines()]
        assert f"gpuhop agent: {now.sub('it is NOW here', said)}" in heard, itself.stderr
        assert read_pid(agent.paths) is None
        assert not agent.paths.socket.exists() and not agent.paths.listen_file.exists()
    finally:
        if read_pid(agent.paths) is not None:  # not refused: stop what started
            agent.shutdown()
    return said


def test_a_mismatched_certificate_and_key_are_refused(tmp_path):
    cert, _ = certificate(tmp_path, -DAY, 90 * DAY, "one")
    _, other_key = certificate(tmp_path, -DAY, 90 * DAY, "other")
    said = refused_to_start(tmp_path, cert, other_key)
    assert said.startswith(f"the key {other_key} does not match the certificate {cert}:"), said


def test_an_expired_certificate_is_refused_saying_when_it_expired(tmp_path):
    cert, key = expired_certificate(tmp_path)
    said = refused_to_start(tmp_path, cert, key)
    end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    assert said.startswith(
        f"the certificate {cert} expired on {end:%Y-%m-%d %H:%M} UTC: clients refuse it; renew it"
    ), said


def test_a_certificate_not_valid_yet_is_refused_saying_from_when(tmp_path):
    cert, key = certificate(tmp_path, 2 * DAY, 90 * DAY)
    said = refused_to_start(tmp_path, cert, key)
    start = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_before_utc
    assert said.startswith(
        f"the certificate {cert} is not valid before {start:%Y-%m-%d %H:%M} UTC"
    ), said
    assert "this host's clock" in said


def test_a_key_that_is_not_a_key_is_named(tmp_path):
    cert, key = certificate(tmp_path, -DAY, 90 * DAY)
    said = refused_to_start(tmp_path, cert, cert)  # the certificate given twice
    assert said.startswith(f"{cert} is not a PEM private key"), said
    said = refused_to_start(tmp_path, key, key)
    assert said.startswith(f"{key} is not a PEM certificate"), said


@pytest.mark.agent_log(r"the listener's certificate \(SHA256:[0-9A-F:]+\) expires on ")
def test_a_certificate_that_expires_soon_is_served_with_a_warning(make_agent, tmp_path):
    """Served (clients still accept it), with a warning in the agent's log, in `agent
    start`'s and `agent status`'s words, and in `gpuhop doctor`: each with its date."""
    cert, key = certificate(tmp_path, -80 * DAY, 5 * DAY)
    end = x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc
    expires = f"expires {end:%Y-%m-%d %H:%M} UTC"
    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    try:
        started = agent.cli(
            "agent", "start", "--listen", "127.0.0.1:0",
            "--tls-cert", str(cert), "--tls-key", str(key),
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        agent.watched()
        listener = agent.listener
        assert listener.expires == end
        assert (
            f"certificate fingerprint {listener.fingerprint}, {expires} (in 4 day(s): renew it;"
            " see `gpuhop doctor`)" in started.stdout
        ), started.stdout
        status = agent.cli("agent", "status")
        assert f"TLS, certificate {listener.fingerprint}, {expires} (in 4 day(s)" in status.stdout

        warning = (
            f"the listener's certificate ({listener.fingerprint}) expires on"
            f" {end:%Y-%m-%d %H:%M} UTC, in 4 day(s): clients refuse it from then on"
        )
        wait_until(lambda: warning in agent.paths.logfile.read_text())
        logged = next(
            line for line in agent.paths.logfile.read_text().splitlines() if warning in line
        )
        assert "WARNING" in logged and "renew it and restart the agent with the new" in logged

        with agent.client() as owner:
            tls = next(c for c in owner.doctor(probe=False) if c.name == "TLS certificate")
        assert (tls.status, tls.detail) == ("warning", warning), tls
        assert tls.fix is not None and "--tls-cert/--tls-key" in tls.fix
    finally:
        agent.shutdown()


def test_the_agents_own_certificate_is_shown_by_doctor(make_agent):
    agent = make_agent(args=("--listen", "127.0.0.1:0"))
    listener = agent.listener
    with agent.client() as owner:
        tls = next(c for c in owner.doctor(probe=False) if c.name == "TLS certificate")
    assert tls.status == "passed", tls
    assert tls.detail.startswith(
        f"the listener's certificate ({listener.fingerprint}) expires on"
        f" {listener.expires:%Y-%m-%d %H:%M} UTC, in "
    ), tls


@pytest.mark.agent_log(r"the agent's own TLS certificate \S+ \(SHA256:[0-9A-F:]+\) expired on")
def test_the_agents_own_certificate_is_made_anew_once_expired(tmp_path):
    """No pin of an expired certificate works any more: the agent makes a new one (rather
    than refusing to start, or serving one every client refuses), logs the old one's
    fingerprint, and `agent start` prints the new one for clients to pin again."""
    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    agent.paths.ensure()
    agent.paths.tls.mkdir(mode=0o700)
    old_cert, old_key = expired_certificate(tmp_path)
    (agent.paths.tls / "cert.pem").write_bytes(old_cert.read_bytes())
    (agent.paths.tls / "key.pem").write_bytes(old_key.read_bytes())
    old = fingerprint_of(old_cert.read_text())
    try:
        started = agent.cli("agent", "start", "--listen", "127.0.0.1:0")
        assert started.returncode == 0, started.stderr
        agent.watched()
        new = agent.listener.fingerprint
        assert new != old and f"certificate fingerprint {new}, expires" in started.stdout
        assert fingerprint_of((agent.paths.tls / "cert.pem").read_text()) == new
        _, presented = fetch_certificate(agent.listener.url)
        assert presented == new
        log = agent.paths.logfile.read_text()
        assert f"the agent's own TLS certificate {agent.paths.tls / 'cert.pem'} ({old})" in log
        assert "--replace --fingerprint NEW" in log
    finally:
        agent.shutdown()


def test_the_agents_own_certificate_not_valid_yet_is_refused(tmp_path):
    """The clock went back before the certificate was made: refused, saying so, rather
    than replaced (which would break every pin of it once the clock is right again)."""
    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    agent.paths.ensure()
    agent.paths.tls.mkdir(mode=0o700)
    cert, key = certificate(tmp_path, DAY, 3650 * DAY)
    (agent.paths.tls / "cert.pem").write_bytes(cert.read_bytes())
    (agent.paths.tls / "key.pem").write_bytes(key.read_bytes())
    refused = agent.cli("agent", "start", "--listen", "127.0.0.1:0")
    if read_pid(agent.paths) is not None:  # not refused: stop what started
        agent.shutdown()
    assert refused.returncode == 2
    assert "is not valid before" in refused.stderr and "this host's clock" in refused.stderr
    assert f"or remove {agent.paths.tls / 'cert.pem'}" in refused.stderr
    assert read_pid(agent.paths) is None and not agent.paths.socket.exists()
    assert fingerprint_of((agent.paths.tls / "cert.pem").read_text()) == fingerprint_of(
        cert.read_text()
    )
