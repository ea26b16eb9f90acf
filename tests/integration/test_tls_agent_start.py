"""Starting an agent with a TCP listener: refusals, its own certificate, a given one."""

from __future__ import annotations

import stat

import pytest

from gpuhop.agent.server.listen import make_self_signed
from gpuhop.api import fingerprint_of
from gpuhop.client import Client
from gpuhop.client.embedded import start_background
from gpuhop.client.transport.remotes import Remote, RemotesFile, save
from gpuhop.client.transport.tls import fetch_certificate
from gpuhop.home import AgentError, AgentPaths, read_pid
from tests.conftest import Agent


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
    assert f"listening on {first.url} (TLS, certificate {first.fingerprint})" in status.stdout
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


def test_a_mismatched_certificate_and_key_are_refused(tmp_path):
    cert_pem, _ = make_self_signed(["localhost"])
    _, other_key = make_self_signed(["localhost"])
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_bytes(cert_pem)
    key.write_bytes(other_key)
    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    refused = agent.cli(
        "agent", "start", "--listen", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)
    )
    assert refused.returncode != 0
    assert "cannot use the certificate" in refused.stderr
    assert read_pid(agent.paths) is None
