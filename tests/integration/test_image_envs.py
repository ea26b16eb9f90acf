"""`--requirements` on top of a container image, on a real agent with real Podman: the
image's own pip installs them, once per image and set, into an environment the job's
containers see read-only, found before the image's own packages; a tag moved to another
image gets an environment of its own.

The package installed is a wheel the test writes into the work dir (no index is asked:
`--no-index` in the requirements), into an image with pip that the test builds.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.api import JobState
from tests import images

pytestmark = pytest.mark.timeout(180)

WHEEL = "tinypkg-1.0-py3-none-any.whl"
REQUIREMENTS = f"--no-index\n./{WHEEL}\n"
SHOW = """
import json, tinypkg
print(json.dumps({"version": tinypkg.VERSION, "file": tinypkg.__file__}), flush=True)
"""


def _wheel(path: Path) -> None:
    """A pure-Python wheel of `tinypkg` 1.0, as a build backend would make it."""
    info = "tinypkg-1.0.dist-info"
    files = {
        "tinypkg/__init__.py": 'VERSION = "1.0"\n',
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpuhop-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)


@pytest.fixture(scope="module")
def pip_image(tmp_path_factory: pytest.TempPathFactory, minimal_image) -> Iterator[str]:
    """The minimal image with pip in it, under a reference of this module's."""
    ref = f"localhost/gpuhop-test/pip:{os.getpid()}"
    images.build(ref, tmp_path_factory.mktemp("pip-image"), pip=True)
    built = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", ref],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        yield ref
    finally:
        with contextlib.suppress(OSError):
            images.remove(ref)  # the name (which the test may have moved to another image)
            images.remove(built)  # and the image built


def _ran(job) -> tuple[JobState, str]:
    info = job.wait(120)
    return info.state, b"".join(job.logs()).decode(errors="replace")


def test_requirements_on_top_of_an_image_are_built_once_per_image(
    shared_agent, pip_image, minimal_image, project
):
    root = project({"show.py": SHOW, "requirements.txt": REQUIREMENTS})
    _wheel(root / WHEEL)
    with shared_agent.client() as client:
        first = client.submit(
            ["show.py"], workdir=root, image=pip_image, requirements=root / "requirements.txt"
        )
        state, log = _ran(first)
        assert state == JobState.succeeded, log
        assert "building environment" in log
        seen = json.loads(log.strip().splitlines()[-1])
        assert seen["version"] == "1.0"
        assert seen["file"].startswith("/opt/gpuhop/env/")  # not the image's, nor the host's
        shown = shared_agent.cli("show", first.id)
        assert shown.returncode == 0, shown.stderr
        rows = dict(
            line.strip().split(None, 1) for line in shown.stdout.splitlines() if line.strip()
        )
        assert rows["image"] == pip_image
        assert rows["python"].startswith("env ") and rows["python"].endswith(f"from {pip_image}")
        # The command line as a user types it: the same set on the same image is reused.
        again = shared_agent.cli(
            "run", "--no-progress", "--image", pip_image, "-r", "requirements.txt", "show.py",
            cwd=root,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert "is ready (reused, not built again)" in again.stdout + again.stderr
        assert '"version": "1.0"' in again.stdout
        # The tag moved to another image (one without pip): an environment of its own is
        # built for it, by that image's pip, which it lacks.
        subprocess.run(["podman", "tag", minimal_image, pip_image], check=True)
        moved = client.submit(
            ["show.py"], workdir=root, image=pip_image, requirements=root / "requirements.txt"
        )
        state, log = _ran(moved)
        assert state == JobState.failed
        assert "building environment" in log and "No module named pip" in log
        assert "could not build the job's Python environment" in (moved.refresh().reason or "")
        listed = shared_agent.cli("env", "ls", "--json")
        assert listed.returncode == 0, listed.stderr
        assert any(e["python"] == pip_image for e in json.loads(listed.stdout))
