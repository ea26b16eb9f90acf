"""Which synced files `run` calls training outputs, and the .gpuhopignore lines it offers."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhop.client.sync.leftovers import outputs_warning, training_outputs
from gpuhop.client.sync.workdir import FileEntry


def entry(path: str, size: int = 10) -> FileEntry:
    return FileEntry(path, "/x/" + path, size, "0" * 64, False)


def test_checkpoints_models_and_event_files_are_found_with_their_ignore_lines():
    files = [
        entry("train.py"),
        entry("training_1/cp.ckpt.index"),
        entry("training_1/cp.ckpt.data-00000-of-00001"),
        entry("training_1/checkpoint"),
        entry("ckpt/ckpt-1.index"),
        entry("ckpt/ckpt-1.data-00000-of-00001"),
        entry("weights.h5"),
        entry("saved_model/my_model/saved_model.pb", 100),
        entry("saved_model/my_model/variables/variables.index", 5),
        entry("saved_model.pb"),  # at the top: the work dir itself, not an output
        entry("data/train.csv"),
    ]
    items, lines = training_outputs(files)
    assert dict(items) == {
        "ckpt/ckpt-1.data-00000-of-00001": 10,
        "ckpt/ckpt-1.index": 10,
        "saved_model/my_model/": 105,
        "training_1/checkpoint": 10,
        "training_1/cp.ckpt.data-00000-of-00001": 10,
        "training_1/cp.ckpt.index": 10,
        "weights.h5": 10,
    }
    assert lines == ["*.ckpt*", "*.h5", "/saved_model/my_model/", "checkpoint", "ckpt-*"]


def test_small_outputs_are_not_worth_a_warning(tmp_path: Path):
    assert outputs_warning([entry("model.keras", 1000)], tmp_path, tmp_path / "cache") is None
    big = [entry("model.keras", 2 << 20)]
    assert "model.keras" in (outputs_warning(big, tmp_path, tmp_path / "cache") or "")
    assert outputs_warning(big, tmp_path, tmp_path / "cache") is None  # once
    assert outputs_warning(big, tmp_path, None) is not None  # no cache: every time


@pytest.mark.parametrize(
    "path",
    [
        "m.keras",
        "x/m.keras",
        "w.h5",
        "d/w.hdf5",
        "a.ckpt-1",
        "ckpt-3.index",
        "d/ckpt-3.data-00000-of-00001",
        "checkpoint",
        "d/checkpoint",
        "events.out.tfevents.1",
        "t/events.out.tfevents.1.host",
        "s/m/saved_model.pb",
    ],
)
def test_each_kind_of_output_is_found_alone_in_a_tree(path: str):
    files = [entry("a/train.py"), entry(path), entry("z/data.csv")]
    assert training_outputs(files)[0], path
    assert training_outputs([entry("a/train.py"), entry("z/checkpoints.txt")]) == ([], [])
