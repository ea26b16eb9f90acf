"""The host's image listing while images come and go (real Podman): Podman lists, then reads
each image, and one removed in between failed the whole listing ("image not known"), so a
`gpuhop images pull` or `gpuhop images` beside another user's `images rm` or a `gc` failed."""

from __future__ import annotations

import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from gpuhop.agent.host.images import list_images
from gpuhop.backends.podman import PodmanSettings
from tests.conftest import missing
from tests.images import podman_problem, remove

pytestmark = pytest.mark.timeout(300)

CHURN = 20  # images made and removed beside the listings


def churn(tmp: Path, stop: threading.Event, made: list[str]) -> None:
    """Import a one-file image and remove it, CHURN times (each a new image id)."""
    try:
        for i in range(CHURN):
            (tmp / "f").write_text(str(i))
            with tarfile.open(tmp / "t.tar", "w") as tar:
                tar.add(tmp / "f", arcname="f")
            ref = f"localhost/gpuhop-test/churn:{i}"
            made.append(ref)
            subprocess.run(
                ["podman", "import", "-q", str(tmp / "t.tar"), ref], check=True, capture_output=True
            )
            remove(ref)
    finally:
        stop.set()


def test_a_listing_beside_images_removed_meanwhile_lists_what_is_there(tmp_path):
    problem = podman_problem()
    if problem is not None:
        if "root" in problem:
            pytest.skip(problem)
        missing(problem)
    stop, made = threading.Event(), []
    thread = threading.Thread(target=churn, args=(tmp_path, stop, made))
    thread.start()
    listings = 0
    try:
        while not stop.is_set():
            images = list_images(PodmanSettings())
            assert all(image.id for image in images)
            listings += 1
    finally:
        stop.set()
        thread.join()
        for ref in made:
            remove(ref)
    assert len(made) == CHURN and listings > 0
