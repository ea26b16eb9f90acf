"""A job in a container image (`--image`): from the POST that submits it to the first byte
of its log, as agent_start.py measures a venv job's, on a local agent through Podman.

The image is the test suite's minimal one (tests/images.py: this machine's Python 3.11 and
its standard library, `podman import`ed here and removed at the end); the job is
`print("hi")` in a one-file work dir already on the agent. Beside it, the same job without
an image (a venv job, the agent's Python) on the same agent, and `podman run` of the same
image and command by hand (`--rm --init`, the work dir bound, the same OCI runtime and
open-file and process limits the agent uses), from its start to its first line: what a user
would type instead.

All three twice, on two agents (their state beside the user's, as an agent's is, not in
/tmp): one as the agent runs by default, where an image job runs in a container started
ahead of it after the last job like it (gpuhop.backends.local.ready), and one with
`ready_containers = false`, where each image job gets a `podman run` of its own, as the
first job of each kind does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent_start import HELLO, MIN_SAMPLES, first_byte
from harness import REPO, BenchError, Row, Settings, private_agent

from gpuhop.api import SubmitRequest
from gpuhop.backends.local.podman import PodmanSettings, runtime, ulimits
from gpuhop.client.jobs import scan_workdir
from gpuhop.home import default_home

sys.path.insert(0, str(REPO))
from tests import images  # the test suite's minimal image

NAME = "containers"


def podman_run(argv: list[str]) -> float:
    """Seconds from starting `argv` (a `podman run`) to its first line of output."""
    start = time.perf_counter()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        seen = time.perf_counter() - start
        proc.stdout.read()
    if proc.returncode != 0 or line != b"hi\n":
        raise BenchError(f"{' '.join(argv)} failed ({proc.returncode}): {line!r}")
    return seen


def run(settings: Settings) -> list[Row]:
    repeats = max(settings.repeats(default=10, quick=5), MIN_SAMPLES)
    problem = images.podman_problem()
    if problem is not None:
        return [Row(NAME, "image job: submit → first log byte", "s", [], "a venv job", None,
                    f"skipped: {problem}")]  # fmt: skip
    ref = f"localhost/gpuhop-bench/minimal:{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        images.build(ref, root / "image")
        try:
            work = root / "work"
            work.mkdir()
            (work / "hello.py").write_text(HELLO)
            oci = runtime(PodmanSettings())
            by_hand = ["podman", *(["--runtime", oci] if oci else []), "run", "--rm"]
            by_hand += ["--pull", "never", "--init", "-v", f"{work}:{work}", "-w", str(work)]
            for limit in ulimits():  # as the agent does: Podman's own exceed this process's
                by_hand += ["--ulimit", limit]
            by_hand += [ref, "python3", "hello.py"]
            ready = _samples(work, ref, by_hand, repeats, "")
            cold = _samples(work, ref, by_hand, repeats, "ready_containers = false\n")
        finally:
            images.remove(ref)
    return [
        Row(NAME, 'image job (--image): submit (POST) → first log byte, print("hi")', "s",
            ready["image"], "the same job in a venv, same agent", ready["venv"],
            "agent side only, tree already on the agent, in a container started ahead (the"
            " agent's default); target ≤ 1.5x"),
        Row(NAME, "the same image job", "s", ready["image"],
            "`podman run --rm --init` of the same image and command", ready["podman"],
            "from podman's start to its first line; target ≤ 1.1x"),
        Row(NAME, "an image job in a container of its own (ready_containers = false; the"
            " first job of a kind)", "s", cold["image"],
            "`podman run --rm --init` of the same image and command", cold["podman"],
            "the same submit → first log byte"),
    ]  # fmt: skip


def _samples(work: Path, ref: str, by_hand: list[str], repeats: int, config: str) -> dict:
    """First-byte times of the image job, the venv job and `podman run` by hand, on an
    agent with `config` as its agent.toml, interleaved."""
    samples: dict[str, list[float]] = {"image": [], "venv": [], "podman": []}
    # Where an agent's state is (beside the user's own, ~/.local/share), not in /tmp: a
    # state dir under /tmp costs an image job's start more (backends/local/ready.py).
    state = default_home().parent
    state.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-", dir=state) as home:
        (Path(home) / "agent" / "home").mkdir(parents=True)
        (Path(home) / "agent" / "home" / "agent.toml").write_text(config)
        with private_agent(Path(home) / "agent") as agent, agent.client() as client:
            for _ in client.submit(["hello.py"], workdir=work).logs(follow=True):
                pass  # the first submit uploads the tree
            tree = scan_workdir(client.session, work).tree
            bodies = {
                name: SubmitRequest(command=["hello.py"], tree=tree, image=image).model_dump(
                    mode="json", exclude_none=True
                )
                for name, image in (("image", ref), ("venv", None))
            }
            for _ in range(2):  # warm up: the checkout, the page cache, Podman's store
                for body in bodies.values():
                    first_byte(agent, client.session, body)
                podman_run(by_hand)
            for _ in range(repeats):  # interleaved: what the machine does hits all alike
                for name, body in bodies.items():
                    samples[name].append(first_byte(agent, client.session, body))
                samples["podman"].append(podman_run(by_hand))
    return samples
