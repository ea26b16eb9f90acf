"""Runs on the user's machine: what a submit sends besides the command and its `JobSpec`,
worked out from the work dir (the tree of files, the script's path, a requirements file's
text), and what the sync did."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath

from gpuhop.api.trees import tree_bytes
from gpuhop.client.errors import GpuhopError
from gpuhop.client.sync.workdir import FileEntry, ScanResult


class SyncStats:
    """What the last submit's sync did."""

    def __init__(
        self, scan_result: ScanResult, files_sent: int, bytes_sent: int, tree_sent: str = ""
    ):
        self._scan = scan_result
        self.files = len(scan_result.files)
        self.hashed = scan_result.hashed
        self.scan_seconds = scan_result.seconds
        self.warnings = scan_result.warnings
        # Sent while the scan hashed, and then.
        self.files_sent = scan_result.uploaded[0] + files_sent
        self.bytes_sent = scan_result.uploaded[1] + bytes_sent
        # How the tree went: "" (the agent had it), "delta" (the changes from the work
        # dir's last tree) or "whole".
        self.tree_sent = tree_sent

    @property
    def bytes(self) -> int:
        """The work dir's bytes (added up when asked: a sum over every file)."""
        return self._scan.total_bytes

    def largest(self, count: int = 3, least: int = 100 << 20) -> list[tuple[str, int]]:
        """The work dir's largest files of `least` bytes or more, (path, size), largest
        first."""
        big = [(f.path, f.size) for f in self._scan.files if f.size >= least]
        return sorted(big, key=lambda item: -item[1])[:count]


def requirements_text(value: str | os.PathLike[str] | bool | None, root: Path) -> str | None:
    """The requirements text to send: a given file's, else the work dir's requirements.txt."""
    if value is False:
        return None
    if value is None or value is True:
        default = root / "requirements.txt"
        if not default.is_file():
            if value is True:
                raise GpuhopError(f"there is no requirements.txt in {root}", code="bad_request")
            return None
        value = default
    try:
        return Path(value).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise GpuhopError(
            f"cannot read the requirements file {value}: {e}", "bad_request"
        ) from None


def script_in_workdir(head: str, root: Path) -> str:
    """Make a script path relative to the work dir; leave program names alone."""
    if head in (".", "..") or ("/" in head and (root / head).is_dir()):
        raise GpuhopError(
            f"{head} is a directory, not a script: name the script in it to run (e.g."
            f" {head.rstrip('/')}/train.py)",
            code="bad_request",
        )
    if not head.endswith(".py") and "/" not in head:
        return head
    path = Path(head)
    full = path if path.is_absolute() else root / path
    if head.endswith(".py") and not full.is_file():
        raise GpuhopError(
            f"no such script: {head} in the work dir {root}{_did_you_mean(head, full)}",
            code="bad_request",
        )
    if not full.exists():
        return head  # a path on the GPU host; the agent checks it
    try:
        rel = full.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise GpuhopError(
            f"{head} is outside the work dir {root}; run gpuhop from a directory that contains it",
            code="bad_request",
        ) from None
    # A program at the work dir's top (./run.sh) stays a path: a bare name is the host's
    # to find on its PATH.
    return rel if rel.endswith(".py") or "/" in rel else f"./{rel}"


def _did_you_mean(head: str, missing: Path) -> str:
    """ "; did you mean train.py?" where a script beside where `head` would be (`missing`)
    has a name close to its (a typo); else nothing."""
    import difflib

    try:
        near = [p.name for p in missing.parent.iterdir() if p.suffix == ".py" and p.is_file()]
    except OSError:
        return ""
    close = difflib.get_close_matches(missing.name, near, n=1, cutoff=0.75)
    return f"; did you mean {PurePosixPath(head).with_name(close[0])}?" if close else ""


def tree_of(files: list[FileEntry]) -> tuple[bytes, str]:
    """The tree (see `gpuhop.api.Tree`) of a scanned work dir: its bytes and its digest, as
    the agent writes a tree it makes from a delta (`gpuhop.api.trees`)."""
    raw = tree_bytes((f.path, f.digest, f.size, f.executable) for f in files)
    return raw, hashlib.sha256(raw).hexdigest()
