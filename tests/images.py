"""Container images the tests build locally (no registry is reachable from CI), and the
fixture that gives a test module one: a minimal image with this machine's Python 3.11.

The image holds the interpreter, the libraries `ldd` names for it, its standard library (no
tests, no site packages), `/bin/sh`, and an `/etc/os-release` whose marker (`MARKER`) tells
a job that it runs in the image, not on the host. It is imported with `podman import` in a
few seconds, named under localhost/gpuhop-test/, and removed when the session ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import missing

MARKER = "gpuhop-test-minimal-image"
PYTHON = Path("/usr/bin/python3.11")


def podman_problem() -> str | None:
    """Why this machine cannot run the image tests, or None."""
    if shutil.which("podman") is None:
        return "Podman is not installed (scripts/setup-system installs it)"
    if not PYTHON.is_file():
        return f"{PYTHON} (the minimal image's interpreter) is not on this machine"
    if os.geteuid() != 0:
        return "the image tests run Podman as root (as the agent on a GPU host does)"
    return None


def _libraries(program: Path) -> list[Path]:
    listed = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True)
    found = []
    for line in listed.stdout.splitlines():
        for word in line.split():
            if word.startswith("/"):
                found.append(Path(word))
    return found


def _loaded_later() -> list[Path]:
    """The libraries glibc opens at run time rather than `ldd` naming them: libgcc_s, for
    a thread that ends as the interpreter exits (else "libgcc_s.so.1 must be installed for
    pthread_exit to work", and SIGABRT)."""
    listed = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True)
    for line in listed.stdout.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libgcc_s.so.1 ") and Path(path).is_file():
            return [Path(path)]  # ldconfig lists this machine's own architecture's first
    return []


def _tree(root: Path, pip: bool = False) -> None:
    def put(source: Path, target: Path | None = None) -> None:
        dest = root / (target or source).relative_to("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)

    put(PYTHON)
    for library in [*_libraries(PYTHON), *_loaded_later()]:
        put(library.resolve(), library)
    for name in ("python3", "python"):
        (root / "usr/bin" / name).symlink_to("python3.11")
    put(Path("/bin/dash"), Path("/bin/sh"))
    stdlib = Path("/usr/lib/python3.11")
    shutil.copytree(
        stdlib,
        root / stdlib.relative_to("/"),
        symlinks=True,
        ignore=shutil.ignore_patterns("test", "dist-packages", "__pycache__", "idlelib"),
    )
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/os-release").write_text(f'NAME="{MARKER}"\nID={MARKER}\n')
    if pip:  # this Python's pip (pure Python), where Debian's python3 finds its packages
        import pip as this_pip

        source = Path(this_pip.__file__).parent
        shutil.copytree(
            source,
            root / "usr/lib/python3/dist-packages/pip",
            ignore=shutil.ignore_patterns("__pycache__"),
        )


def build(ref: str, work: Path, pip: bool = False) -> None:
    """Build the minimal image as `ref` (in Podman's store) from a tree under `work`; with
    `pip`, with pip in it."""
    tree = work / "tree"
    _tree(tree, pip)
    tar = subprocess.Popen(["tar", "-C", str(tree), "-cf", "-", "."], stdout=subprocess.PIPE)
    try:
        subprocess.run(
            ["podman", "import", "-", ref], stdin=tar.stdout, capture_output=True, check=True
        )
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait()
    shutil.rmtree(tree)


def remove(ref: str) -> None:
    subprocess.run(["podman", "rmi", "--force", "--ignore", ref], capture_output=True, check=False)


@pytest.fixture(scope="session")
def minimal_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The minimal image's reference (built once per session; removed at its end)."""
    problem = podman_problem()
    if problem is not None:
        if "root" in problem:
            pytest.skip(problem)
        missing(problem)
    ref = f"localhost/gpuhop-test/minimal:{os.getpid()}"
    build(ref, tmp_path_factory.mktemp("image"))
    try:
        yield ref
    finally:
        with contextlib.suppress(OSError):
            remove(ref)


def containers_named(prefix: str) -> list[str]:
    """The containers (running or not) whose name starts with `prefix`."""
    listed = subprocess.run(
        ["podman", "ps", "--all", "--filter", f"name=^{prefix}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


__all__ = ["MARKER", "containers_named", "minimal_image"]
