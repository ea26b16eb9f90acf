"""How Podman's pull output and errors are read, and which references are refused before
they reach an argv (gpuhop.agent.host.images)."""

from __future__ import annotations

import pytest

from gpuhop.agent.host.images import (
    PullProgress,
    _error_of,
    _read_line,
    registry_of,
)
from gpuhop.api.spec import check_image

# What `podman pull` 4.3 writes to a pipe (its stderr), seen with a local registry.
PULL_LINES = [
    "Trying to pull 10.1.2.3:5000/team/train:1...",
    "Getting image source signatures",
    "Copying blob sha256:553acb8affee62a195eba562c169dc036e0adddc1d8a765a8be94c5f0b5b9b2b",
    "Copying blob sha256:947d971e0059ca4f3bbb856a4b1dfa36ac1799a355d60365ac18700eb5189be6",
    "Copying blob sha256:aaaa skipped: already exists",
    "Copying config sha256:54e57256170d12dfe51d00e7b36eb67748d5bbc4e68d252639b78b4437ae2050",
    "Writing manifest to image destination",
    "Storing signatures",
]


def test_progress_counts_layers_as_podman_reports_them() -> None:
    state = PullProgress()
    notes = []
    for line in PULL_LINES:
        if _read_line(state, line):
            notes.append(state.note())
    assert notes[0] == "pulling image: asking the registry"
    assert "copying layers, 0/1 done" in notes[1]
    assert "copying layers, 1/3 done" in notes[3]  # the skipped one was there already
    assert state.layers_started == state.layers_done == 3
    assert state.phase == "storing"


def test_an_error_is_the_registrys_words() -> None:
    lines = [
        "Trying to pull r:5000/a/b:1...",
        "Error: initializing source docker://r:5000/a/b:1: reading manifest 1 in r:5000/a/b:"
        " unauthorized: authentication required",
    ]
    assert _error_of(lines, "r:5000/a/b:1") == (
        "cannot pull r:5000/a/b:1: reading manifest 1 in r:5000/a/b: unauthorized:"
        " authentication required"
    )


@pytest.mark.parametrize(
    ("reference", "registry"),
    [
        ("nvcr.io/nvidia/tensorflow:24.03-tf2-py3", "nvcr.io"),
        ("localhost/team/x:1", "localhost"),
        ("10.1.2.3:5000/team/x@sha256:" + "a" * 64, "10.1.2.3:5000"),
        ("tensorflow/tensorflow:2.16.1-gpu", "docker.io"),
        ("ubuntu", "docker.io"),
    ],
)
def test_the_registry_of_a_reference(reference: str, registry: str) -> None:
    assert check_image(reference) == reference
    assert registry_of(reference) == registry


@pytest.mark.parametrize("reference", ["--help", "a b", "x\n", "Upper/x", "a//b", ""])
def test_what_is_no_reference_is_refused(reference: str) -> None:
    with pytest.raises(ValueError, match="is not an image reference"):
        check_image(reference)
