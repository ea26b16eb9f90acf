"""The GPU host's container images on a real agent, with real Podman and a real private
registry (tests/registry.py): `gpuhop images pull` with a registry secret, `gpuhop images`,
and gc.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.agent.services.longcalls import PER_USER
from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from tests.conftest import Agent, wait_until
from tests.registry import (
    PASSWORD,
    TAG,
    Registry,
    on_host,
    pulling_agent,
    registry_problem,
    require_tools,
)

if (why := registry_problem()) is not None:
    pytest.skip(why, allow_module_level=True)
require_tools()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Agent]:
    with pulling_agent(tmp_path_factory.mktemp("images-agent"), registry) as agent:
        yield agent


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


def test_pulls_from_a_registry_that_never_answers_cannot_take_the_agents_threads(
    agent: Agent,
) -> None:
    # A "registry" that takes connections (the kernel completes them) and never says a word.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    address = f"127.0.0.1:{silent.getsockname()[1]}"
    refs = [f"{address}/stalled/n{i}:1" for i in range(PER_USER + 1)]
    errors: list[BaseException] = []

    def pull(ref: str) -> None:
        try:
            with agent.client() as client:
                client.pull_image(ref)
        except GpuhopError as e:
            errors.append(e)

    pulls = [threading.Thread(target=pull, args=(ref,)) for ref in refs[:PER_USER]]
    try:
        for thread in pulls:
            thread.start()
        # Each pull is counted before it starts Podman, which the agent logs.
        wait_until(
            lambda: all(f"pulling image {r} " in agent.paths.logfile.read_text() for r in refs[:-1])
        )
        with agent.client() as client:
            with pytest.raises(GpuhopError) as refused:
                client.pull_image(refs[-1])
            assert refused.value.status == 429
            assert f"has {PER_USER} long requests under way" in str(refused.value)
            assert f"takes {PER_USER} per user at once" in str(refused.value)
            assert client.secrets()  # quick calls are still answered meanwhile
    finally:
        silent.close()  # the pulls' connections are reset: each fails
        for thread in pulls:
            thread.join(120)
    assert len(errors) == PER_USER and all(e.status == 502 for e in errors), errors
    # Those ended, so the next pull is taken (and fails: nothing listens there now).
    with agent.client() as client, pytest.raises(GpuhopError) as failed:
        client.pull_image(refs[-1])
    assert failed.value.status == 502, failed.value


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
        # A job ran in it (its use noted; it has no program, so it fails): still the admin's.
        ran = client.submit(["true"], workdir=registry.root, image=by_hand, requirements=False)
        assert ran.wait(60).state == JobState.failed
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
