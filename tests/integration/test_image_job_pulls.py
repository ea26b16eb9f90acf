"""A job whose image the host lacks: a real agent pulls it at submit from a real private
registry (tests/registry.py) with the job's `--image-secret`, while the job waits in the
queue, and runs it in that image.

The pull's wait is made observable without timing luck by a registry stopped (SIGSTOP) while
the jobs are submitted: the pull waits at its first request, `ps` and `show` say so, and
two jobs naming the image wait on one pull; then the registry goes on. A wrong secret ends
the job as image-error in the registry's words, and nothing of it runs. gc keeps the image
a queued job names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from tests.conftest import Agent, wait_until
from tests.images import MARKER, job_containers
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

INSIDE = 'print("in", open("/etc/os-release").read().split()[0], flush=True)\n'
SLEEP = "import time\ntime.sleep(600)\n"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Agent]:
    with pulling_agent(tmp_path_factory.mktemp("image-pulls-agent"), registry) as agent:
        yield agent


def pulls_of(agent: Agent, reference: str) -> int:
    """How many pulls of `reference` the agent started (its log's word for each)."""
    return agent.paths.logfile.read_text().count(f"pulling image {reference} for ")


def test_jobs_wait_on_one_pull_shown_in_ps_and_show_then_run_in_the_image(
    agent: Agent, registry: Registry, minimal_image: str, project
) -> None:
    ref = registry.push_local(minimal_image, "runs")
    root = project({"inside.py": INSIDE})
    with agent.client() as client:
        with registry.frozen():
            first = client.submit(["inside.py"], workdir=root, image=ref, image_secret="REGISTRY")
            second = client.submit(["inside.py"], workdir=root, image=ref, image_secret="REGISTRY")
            for job in (first, second):
                wait_until(lambda job=job: (job.refresh().waiting or "").startswith("pulling"))
                assert job.info.state == JobState.queued
            listed = json.loads(agent.cli("ps", "--json").stdout)
            for job in (first, second):
                seen = next(j for j in listed if j["id"] == job.id)
                assert seen["state"] == "queued" and seen["waiting"].startswith("pulling image")
            shown = agent.cli("show", first.id)
            assert "pulling image" in shown.stdout, shown.stdout
        for job in (first, second):
            info = job.wait(60)
            assert info.state == JobState.succeeded, (info.reason, b"".join(job.logs()))
            assert f"in NAME={MARKER}" in b"".join(job.logs()).decode().replace('"', "")
    assert on_host(ref)
    assert pulls_of(agent, ref) == 1
    assert PASSWORD not in agent.paths.logfile.read_text()
    # The image now has two names (the one built here, the registry's): listed once.
    with agent.client() as client:
        named = [i for i in client.images() if ref in i.references]
    assert len(named) == 1 and minimal_image in named[0].references, named
    # Another job of this user's in the image now runs without a pull.
    with agent.client() as client:
        again = client.submit(["inside.py"], workdir=root, image=ref)
        assert again.wait(60).state == JobState.succeeded
    assert pulls_of(agent, ref) == 1


def test_a_wrong_secret_ends_the_job_in_the_registrys_words_and_nothing_runs(
    agent: Agent, registry: Registry, project
) -> None:
    ref = registry.push("denied")
    root = project({"inside.py": INSIDE})
    with agent.client() as client:
        job = client.submit(["inside.py"], workdir=root, image=ref, image_secret="WRONG")
        info = job.wait(60)
        assert (info.state, info.end_class) == (JobState.failed, "image-error")
        assert "unauthorized" in (info.reason or ""), info.reason
        assert info.started_at is None and b"".join(job.logs()) == b""
        with pytest.raises(GpuhopError) as refused:
            client.submit(["inside.py"], workdir=root, image=ref, image_secret="NOSUCH")
        assert refused.value.status == 400
        assert "you have no secret named NOSUCH" in refused.value.message
    assert not on_host(ref)
    assert job_containers(agent.paths, job.id) == []
    done = agent.cli("run", "--image", ref, "--image-secret", "WRONG", "inside.py", cwd=root)
    assert done.returncode != 0 and "unauthorized" in done.stderr + done.stdout


def test_gc_keeps_the_image_a_queued_job_needs(
    agent: Agent, registry: Registry, minimal_image: str, project
) -> None:
    ref = registry.push("kept")
    root = project({"inside.py": INSIDE, "sleep.py": SLEEP})
    with agent.client() as client:
        ahead = client.submit(["sleep.py"], workdir=root, requirements=False)
        try:
            queued = client.submit(
                ["inside.py"], workdir=root, image=ref, image_secret="REGISTRY", after=[ahead.id]
            )
            # Until its pull has ended, `images` lists it as never used: Podman holds it a
            # moment before the pull's end is noted, and until then gc leaves it alone as an
            # image gpuhop did not pull (a fast run's gc after the cancel came before it).
            wait_until(
                lambda: any(
                    i.last_used is not None and queued.id in i.jobs
                    for i in client.images()
                    if ref in i.references
                ),
                timeout=60,
            )
            assert pulls_of(agent, ref) == 1
            assert queued.refresh().state == JobState.queued
            client.gc()
            assert on_host(ref)
            assert any(queued.id in i.jobs for i in client.images() if ref in i.references)
        finally:
            ahead.cancel()
        assert queued.wait(60).state == JobState.cancelled
        client.gc()
    assert not on_host(ref)
    # The first test pulled the minimal image under a registry's name: gc took that name
    # off, and left the image with the name it was given here (once: Podman lists an image
    # once per name, and a second untag of the same name failed with "tag not known").
    assert on_host(minimal_image)
    assert not on_host(f"{registry.address}/gpuhop-test/runs:{TAG}")
    assert "not removed" not in agent.paths.logfile.read_text()
