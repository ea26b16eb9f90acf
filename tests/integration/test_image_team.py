"""On a team agent, an image on the host is not everyone's: a user's job runs in a
registry's image only once that user's own pull of it has been let through by the registry
(issue 40's rule, `agent/jobs/imagepulls.py`). A real team agent (TLS on loopback, users
alice and bob by token) and a real private registry (tests/registry.py): alice pulls a
private image with her login; bob's jobs naming it, with no login or a wrong one, end as
image-error in the registry's words and never run, though the image is on the host; with
his own right login, his job pulls it (a second pull, a manifest's cost) and runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.api import JobState
from tests.conftest import Agent
from tests.images import MARKER
from tests.integration import test_tls
from tests.registry import PASSWORD, USER, Registry, on_host, registry_problem, require_tools
from tests.team import team_agent, team_tokens

if (why := registry_problem()) is not None:
    pytest.skip(why, allow_module_level=True)
require_tools()

pytestmark = pytest.mark.timeout(300)

# remote(token) -> a Client of this module's agent with that token (test_tls's fixture).
remote = test_tls.remote
INSIDE = 'print("in", open("/etc/os-release").read().split()[0], flush=True)\n'


@pytest.fixture(scope="module")
def tls_agent(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[Agent]:
    root = Path(tmp_path_factory.mktemp("team-images"))
    config = f'insecure_registries = ["{registry.address}"]\n'
    with team_agent(root, 0, config=config) as agent:
        yield agent


def pulls_of(agent: Agent, reference: str) -> int:
    """How many pulls of `reference` the agent started (its log's word for each)."""
    return agent.paths.logfile.read_text().count(f"pulling image {reference} for ")


def test_a_users_job_runs_in_a_private_image_only_after_their_own_pull(
    remote, tls_agent: Agent, registry: Registry, minimal_image: str, project
) -> None:
    ref = registry.push_local(minimal_image, "team")
    tokens = team_tokens(tls_agent)
    root = project({"inside.py": INSIDE})
    alice, bob = remote(tokens["alice"]), remote(tokens["bob"])
    alice.set_secret("REGISTRY", f"{USER}:{PASSWORD}")
    assert ref in alice.pull_image(ref, secret="REGISTRY").references
    assert on_host(ref) and pulls_of(tls_agent, ref) == 1

    # bob: no login, then a wrong one. The image is on the host; his pulls are refused.
    bob.set_secret("WRONG", f"{USER}:not-the-password")
    for secret in (None, "WRONG"):
        job = bob.submit(["inside.py"], workdir=root, image=ref, image_secret=secret)
        info = job.wait(60)
        assert (info.state, info.end_class) == (JobState.failed, "image-error"), info.reason
        assert "unauthorized" in (info.reason or ""), info.reason
        assert info.started_at is None and b"".join(job.logs()) == b""
    assert pulls_of(tls_agent, ref) == 3

    # alice's job runs in it with no pull of its own.
    mine = alice.submit(["inside.py"], workdir=root, image=ref)
    assert mine.wait(60).state == JobState.succeeded, mine.info.reason
    assert f"in NAME={MARKER}" in b"".join(mine.logs()).decode().replace('"', "")
    assert pulls_of(tls_agent, ref) == 3

    # bob with his own right login: pulled for him, and his job runs.
    bob.set_secret("REGISTRY", f"{USER}:{PASSWORD}")
    his = bob.submit(["inside.py"], workdir=root, image=ref, image_secret="REGISTRY")
    assert his.wait(60).state == JobState.succeeded, his.info.reason
    assert f"in NAME={MARKER}" in b"".join(his.logs()).decode().replace('"', "")
    assert pulls_of(tls_agent, ref) == 4
    assert PASSWORD not in tls_agent.paths.logfile.read_text()
