"""Runs on the user's machine: training outputs in a work dir about to be synced.

A script that ran here first leaves its checkpoints, SavedModels, `.keras`/`.h5` files and
TensorBoard event files beside it; synced with the job they cost upload time and can break
the script (`FileExistsError: 'training_2'`). `run` warns once per set of such files, with
the `.gpuhopignore` lines that skip them: the set seen is remembered in the client's cache,
so the same files are not named again on every run.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from pathlib import Path

from gpuhop.client.sync.workdir import FileEntry

# Under this in all, outputs are not worth a word.
LARGE_BYTES = 1 << 20
SAVED_MODEL_PB = "saved_model.pb"
# (pattern on a file's name, the .gpuhopignore line that skips it)
OUTPUT_NAMES = (
    ("*.keras", "*.keras"),
    ("*.h5", "*.h5"),
    ("*.hdf5", "*.hdf5"),
    ("*.ckpt*", "*.ckpt*"),
    ("ckpt-*.index", "ckpt-*"),
    ("ckpt-*.data-*", "ckpt-*"),
    ("checkpoint", "checkpoint"),
    ("events.out.tfevents.*", "events.out.tfevents.*"),
)
SHOWN = 8
# Any of the names above, in one regex: a name it does not match (most) costs one match.
_ANY_OUTPUT = re.compile("|".join(fnmatch.translate(pattern) for pattern, _ in OUTPUT_NAMES))


# What a path holds wherever one of the names above (or a SavedModel's) ends it, in a list
# of paths each between NULs (no name holds one): a tree without any, the rule, is told by
# a few searches in C rather than a match per file.
_MARKS = (
    ".keras\0",
    ".h5\0",
    ".hdf5\0",
    ".ckpt",
    *(
        sep + name
        for name in ("ckpt-", "checkpoint\0", "events.out.tfevents.", f"{SAVED_MODEL_PB}\0")
        for sep in "/\0"
    ),
)


def training_outputs(files: list[FileEntry]) -> tuple[list[tuple[str, int]], list[str]]:
    """The synced files that look like training outputs, as (path, bytes) with a SavedModel
    dir as one item, and the `.gpuhopignore` lines that skip them."""
    listing = "\0" + "\0".join([f.path for f in files]) + "\0"
    if not any(mark in listing for mark in _MARKS):
        return [], []
    # A SavedModel at the top would be the whole work dir: only those below it count.
    marker = "/" + SAVED_MODEL_PB
    saved_dirs = sorted({f.path[: -len(marker)] for f in files if f.path.endswith(marker)})
    items: dict[str, int] = {}
    lines: set[str] = set()
    for f in files:
        if saved_dirs:
            owner = next((d for d in saved_dirs if f.path.startswith(d + "/")), None)
            if owner is not None:
                items[f"{owner}/"] = items.get(f"{owner}/", 0) + f.size
                lines.add(f"/{owner}/")
                continue
        name = f.path.rpartition("/")[2]
        if _ANY_OUTPUT.match(name) is None:
            continue
        for pattern, line in OUTPUT_NAMES:
            if fnmatch.fnmatchcase(name, pattern):
                items[f.path] = f.size
                lines.add(line)
                break
    return sorted(items.items()), sorted(lines)


def outputs_warning(files: list[FileEntry], root: Path, cache_dir: Path | None) -> str | None:
    """The warning for `run` when the synced tree holds large training outputs, or None
    (also when these same files were named before for this work dir)."""
    items, lines = training_outputs(files)
    total = sum(size for _, size in items)
    if total < LARGE_BYTES:
        return None
    seen = hashlib.sha256("\n".join(p for p, _ in items).encode()).hexdigest()
    if cache_dir is not None:
        key = hashlib.sha256(os.fsencode(root.resolve())).hexdigest()[:24]
        memo = cache_dir / "outputs-warned" / key
        try:
            if memo.read_text() == seen:
                return None
        except OSError:
            pass
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            memo.write_text(seen)
        except OSError:
            pass  # a cache we cannot write only means the warning may come again
    shown = ", ".join(p for p, _ in items[:SHOWN]) + (
        f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    )
    return (
        f"the synced tree holds {total / (1 << 20):.1f} MiB of what look like training outputs"
        f" (from a run here?), sent with the job: {shown}. To skip them, add to"
        f" {root / '.gpuhopignore'}:\n  " + "\n  ".join(lines)
    )
