"""Runs on the user's machine: which files of a work dir a scan leaves out.

`.gitignore` and `.gpuhopignore` at every level, with git's rules (the deepest file that
has an opinion wins; an ignored directory is not entered), over `DEFAULT_IGNORES`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhop.client.errors import SyncError

if TYPE_CHECKING:
    import pathspec

IGNORE_FILES = (".gitignore", ".gpuhopignore")
# Never worth sending; a `!pattern` in .gpuhopignore brings any of them back.
DEFAULT_IGNORES = (
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    "*.py[cod]",
    ".ipynb_checkpoints/",
    ".venv/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    "gpuhop-artifacts/",
)


class IgnoreLayer:
    """One ignore file's patterns, for paths relative to its directory.

    pathspec tries each pattern's regex in turn; on a large tree that dominates the scan.
    Here the ignoring patterns and the negations are each joined into one regex. A path
    matched by only one of them is decided at once; one matched by both (rare) goes to
    pathspec, which knows which pattern came last.

    The patterns are compiled (and pathspec imported) on the first path checked: a scan
    whose directories are all unchanged since the last one reuses their cached listings and
    checks no path, so a re-run of `gpuhop run` never loads pathspec.
    """

    def __init__(self, prefix: str, lines: list[str] | tuple[str, ...]):
        self.prefix = prefix
        self.lines = lines
        self.spec: pathspec.GitIgnoreSpec | None = None
        self.ignore: re.Pattern[str] | None = None
        self.keep: re.Pattern[str] | None = None

    def _compile(self) -> pathspec.GitIgnoreSpec:
        import pathspec  # only where a path is checked: see above

        spec = pathspec.GitIgnoreSpec.from_lines(self.lines)
        self.ignore = _joined(p for p in spec.patterns if p.include is True)
        self.keep = _joined(p for p in spec.patterns if p.include is False)
        self.spec = spec
        return spec

    def check(self, path: str) -> bool | None:
        spec = self.spec if self.spec is not None else self._compile()
        ignored = self.ignore is not None and self.ignore.match(path) is not None
        kept = self.keep is not None and self.keep.match(path) is not None
        if ignored and kept:
            return bool(spec.check_file(path).include)
        if ignored:
            return True
        return False if kept else None


class DefaultsLayer:
    """The root's layer where the root has no ignore file: `DEFAULT_IGNORES` alone, matched
    without pathspec (which loads `dataclasses` and `inspect` with it), as pathspec matches
    them: a name ending in .pyc, .pyo or .pyd anywhere in the path, or one of the ignored
    directories' names as a directory anywhere in it. None of them is a negation, so a path
    is ignored (True) or left to the next layer (None). tests/unit/test_sync.py checks it
    against pathspec's answers."""

    prefix = ""
    DIRECTORIES = frozenset(p.rstrip("/") for p in DEFAULT_IGNORES if p.endswith("/"))
    SUFFIXES = (".pyc", ".pyo", ".pyd")  # *.py[cod]

    def check(self, path: str) -> bool | None:
        parts = path.split("/")
        # A path ending in "/" names a directory: every part is a directory's name (the
        # last one empty); otherwise the last part is the file's.
        if any(part in self.DIRECTORIES for part in parts[:-1]):
            return True
        return True if any(part.endswith(self.SUFFIXES) for part in parts) else None


def _joined(patterns: Iterator[pathspec.Pattern]) -> re.Pattern[str] | None:
    parts = [
        "(?:" + p.regex.pattern.replace("(?P<ps_d>", "(?:") + ")"  # type: ignore[attr-defined]
        for p in patterns
        if getattr(p, "regex", None) is not None
    ]
    return re.compile("|".join(parts)) if parts else None


def _rules_key(parent: str, prefix: str, lines: list[str]) -> str:
    text = "\n".join([parent, prefix, *lines])
    return hashlib.sha256(text.encode(errors="surrogateescape")).hexdigest()[:32]


def _read_ignore_files(directory: Path) -> list[str]:
    lines: list[str] = []
    for name in IGNORE_FILES:
        try:
            # A plain open (not pathlib's): tried twice in every directory of every scan.
            with open(f"{directory}/{name}", errors="replace") as f:
                lines += f.read().splitlines()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            raise SyncError(f"cannot read {directory / name}: {e.strerror}") from None
    return lines


class IgnoreRules:
    """The ignore layers in force in one directory, outermost first."""

    def __init__(self, layers: tuple[IgnoreLayer | DefaultsLayer, ...], key: str):
        self.layers = layers
        # Names the rules in force: a cached listing is valid only under the same key.
        self.key = key

    @classmethod
    def root(cls, root: Path) -> IgnoreRules:
        # The defaults and the root's own files form one layer: they share the root as
        # their base, and the root's lines come later, so they win as git would have it.
        own = _read_ignore_files(root)
        lines = [*DEFAULT_IGNORES, *own]
        layer = IgnoreLayer("", lines) if own else DefaultsLayer()
        return cls((layer,), _rules_key("", "", lines))

    def enter(self, directory: Path, prefix: str) -> IgnoreRules:
        lines = _read_ignore_files(directory)
        if not lines:
            return self
        return IgnoreRules(
            (*self.layers, IgnoreLayer(prefix, lines)), _rules_key(self.key, prefix, lines)
        )

    def ignored(self, rel: str, is_dir: bool) -> bool:
        for layer in reversed(self.layers):
            result = layer.check(rel[len(layer.prefix) :] + ("/" if is_dir else ""))
            if result is not None:
                return result
        return False
