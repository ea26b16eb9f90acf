"""The GPU host's container images on a real agent, with real Podman and a real private
registry: `gpuhop images pull` with a registry secret, `gpuhop images`, and gc.

The registry (Debian's docker-registry, htpasswd auth, plain HTTP) runs in a network
namespace this module makes, on an address it assigns there (tests/slurm_backend/netns.py),
and the agent lists that address in agent.toml's `insecure_registries`. The images are built
here (`podman import` of a tiny tree), pushed, and removed locally before the agent pulls
them. Everything is removed at the end: the registry's process group, the namespace, and
every image name this module made.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Agent, missing, wait_until
from tests.slurm_backend import netns

if sys.platform != "linux":
    pytest.skip("Podman and network namespaces are Linux's", allow_module_level=True)
for tool, package in (("podman", "podman"), ("docker-registry", "docker-registry")):
    if shutil.which(tool) is None:
        missing(f"{tool} is not installed (apt-get install {package}; scripts/setup-system)")
if shutil.which("htpasswd") is None:
    missing("htpasswd is not installed (apt-get install apache2-utils; scripts/setup-system)")
if (why := netns.unavailable()) is not None:
    pytest.skip(why, allow_module_level=True)

USER = "trainer"
PASSWORD = "s3cret-" + secrets.token_hex(8)
TAG = secrets.token_hex(4)


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=120, check=check
    )


def on_host(reference: str) -> bool:
    return podman("image", "exists", reference, check=False).returncode == 0


class Registry:
    """A registry in a namespace of its own: `address` is HOST:PORT."""

    def __init__(self, root: Path):
        self.root = root
        self.net = netns.Network.make(1)
        self.address = f"{self.net.addresses[0]}:5000"
        self.proc: subprocess.Popen[bytes] | None = None
        self.made: list[str] = []  # every image name this module made, for the end

    def start(self) -> None:
        (self.root / "data").mkdir(parents=True)
        subprocess.run(
            ["htpasswd", "-B", "-i", "-c", str(self.root / "htpasswd"), USER],
            input=PASSWORD,
            text=True,
            check=True,
            capture_output=True,
        )
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'data'}\n"
            f"http:\n  addr: {self.address}\n  secret: {secrets.token_hex(16)}\n"
            f"auth:\n  htpasswd:\n    realm: gpuhop-test\n    path: {self.root / 'htpasswd'}\n"
        )
        with (self.root / "registry.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [*self.net.enter(0), "docker-registry", "serve", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self.answers, timeout=30, interval=0.1)

    def answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"the registry ended: {(self.root / 'registry.log').read_text()}")
        host, port = self.address.split(":")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
            return True
        return False

    def push(self, name: str) -> str:
        """Build a tiny image, push it here as `name`, remove it from the host; its
        reference in this registry."""
        tree = self.root / f"tree-{name.replace('/', '-')}"
        (tree / "etc").mkdir(parents=True)
        (tree / "etc" / "os-release").write_text(f"ID=gpuhop-test\nNAME={name}\n")
        (tree / "payload.bin").write_bytes(os.urandom(64 * 1024))
        local = f"localhost/gpuhop-test/{name}:{TAG}"
        remote = f"{self.address}/gpuhop-test/{name}:{TAG}"
        self.made += [local, remote]
        archive = subprocess.run(
            ["tar", "-C", str(tree), "-cf", "-", "."], capture_output=True, check=True
        ).stdout
        subprocess.run(
            ["podman", "import", "-", local], input=archive, capture_output=True, check=True
        )
        podman("push", "--tls-verify=false", "--creds", f"{USER}:{PASSWORD}", local, remote)
        podman("rmi", "--force", local)
        assert not on_host(remote)
        return remote

    def stop(self) -> None:
        with contextlib.ExitStack() as stack:
            stack.callback(self.net.remove)
            for name in self.made:
                stack.callback(podman, "rmi", "--force", name, check=False)
            if self.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = Registry(tmp_path_factory.mktemp("registry"))
    try:
        reg.start()
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Agent]:
    """An agent that pulls from the test registry over plain HTTP, and whose gc removes
    every image it knows that nothing needs (no grace, no keep days)."""
    root = tmp_path_factory.mktemp("images-agent")
    (root / "home").mkdir()
    (root / "home" / "agent.toml").write_text(
        f'insecure_registries = ["{registry.address}"]\n'
        "gc_every_hours = 0\ngc_grace_minutes = 0\nimage_keep_days = 0\n"
    )
    agent = Agent(root / "home", root / "cache", None).start()
    try:
        with agent.client() as client:
            client.set_secret("REGISTRY", f"{USER}:{PASSWORD}")
            client.set_secret("WRONG", f"{USER}:not-the-password")
        yield agent
    finally:
        agent.shutdown()


def listed(agent: Agent) -> list[dict]:
    done = agent.cli("images", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_pull_with_the_right_secret_lists_the_image(agent: Agent, registry: Registry) -> None:
    ref = registry.push("right")
    done = agent.cli("images", "pull", ref, "--secret", "REGISTRY")
    assert done.returncode == 0, done.stderr
    assert f"pulled {ref}" in done.stderr
    assert on_host(ref)
    mine = [i for i in listed(agent) if ref in i["references"]]
    assert len(mine) == 1
    assert mine[0]["last_used"] is not None and mine[0]["size"] > 0
    table = agent.cli("images")
    assert table.returncode == 0, table.stderr
    line = next(line for line in table.stdout.splitlines() if ref in line)
    assert "never" not in line
    # The password went to Podman in a file that is gone, never in the agent's log.
    assert PASSWORD not in agent.paths.logfile.read_text()


def test_a_wrong_or_no_secret_is_refused_in_the_registrys_words(
    agent: Agent, registry: Registry
) -> None:
    ref = registry.push("wrong")
    for extra in (["--secret", "WRONG"], []):
        done = agent.cli("images", "pull", ref, *extra)
        assert done.returncode != 0
        assert "unauthorized" in done.stderr, done.stderr
        assert not on_host(ref)
    assert not [i for i in listed(agent) if ref in i["references"]]


def test_a_reference_the_registry_lacks_says_so(agent: Agent, registry: Registry) -> None:
    ref = f"{registry.address}/gpuhop-test/absent:{TAG}"
    done = agent.cli("images", "pull", ref, "--secret", "REGISTRY")
    assert done.returncode != 0
    assert "manifest unknown" in done.stderr, done.stderr


def test_a_secret_the_user_has_not_set_is_named(agent: Agent, registry: Registry) -> None:
    done = agent.cli("images", "pull", f"{registry.address}/x:1", "--secret", "NOSUCH")
    assert done.returncode != 0
    assert "you have no secret named NOSUCH" in done.stderr


def test_gc_removes_an_unused_image_and_never_one_put_there_by_hand(
    agent: Agent, registry: Registry
) -> None:
    ref = registry.push("collected")
    assert agent.cli("images", "pull", ref, "--secret", "REGISTRY").returncode == 0
    by_hand = f"localhost/gpuhop-test/by-hand:{TAG}"
    registry.made.append(by_hand)
    tree = registry.root / "by-hand"
    tree.mkdir()
    (tree / "hello").write_text("not gpuhop's\n")
    archive = subprocess.run(
        ["tar", "-C", str(tree), "-cf", "-", "."], capture_output=True, check=True
    ).stdout
    subprocess.run(
        ["podman", "import", "-", by_hand], input=archive, capture_output=True, check=True
    )
    with agent.client() as client:
        dry = client.gc(dry_run=True)
        assert dry.freed["images"].count >= 1
        assert on_host(ref)
        report = client.gc()
    assert report.freed["images"].count >= 1
    assert not on_host(ref)
    assert on_host(by_hand)
    assert not [i for i in listed(agent) if ref in i["references"]]


def test_a_host_without_podman_says_what_to_install(
    make_agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = tmp_path / "bin"  # a PATH with no Podman on it
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    agent = make_agent()
    done = agent.cli("images")
    assert done.returncode != 0
    assert "this host has no Podman" in done.stderr
    assert "apt-get install podman" in done.stderr
    with agent.client() as client:
        assert client.gc().freed["images"].count == 0
