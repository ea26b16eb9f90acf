"""Container images the tests build locally (no registry is reachable from CI), and the
fixtures that give a test one: a minimal image with this machine's Python 3.11, and the same
with TensorFlow.

The minimal image holds the interpreter, the libraries `ldd` names for it and its extension
modules (and libgcc_s, which glibc opens itself), its standard library (no tests, no site
packages), `/bin/sh`, and an `/etc/os-release` whose marker (`MARKER`) tells a job that it
runs in the image, not on the host. It is imported with `podman import` in a few seconds,
named under localhost/gpuhop-test/, and removed when the session ends.

The TensorFlow image adds tensorflow-cpu and what gpuhop's model server needs beside it
(starlette and uvicorn), with their dependencies (`IMAGE_DISTRIBUTIONS`' closure), at the
image's /usr/lib/python3/dist-packages, taken from the project's own installation of
them, the venv the tests run in: each distribution's files as its RECORD lists them, with
the bytecode pip compiled when it installed them, and the C++ runtime that manylinux wheels
take from the system. That is what `pip install --target` of the same wheels makes, without
unpacking 1.4 GB and compiling its bytecode again (16 s and 7 s of a 2-core machine; without
the bytecode each job's `import tensorflow` takes 3 s more). TensorFlow's C++ headers (300 MB,
for building custom ops) are left out.

Its 1.8 GB do not go through `podman import` either, which costs 45 s of CPU and a disk-bound
minute for them (Podman digests the tar, writes it to a blob, digests that, unpacks it into
the layer and digests it again). Podman imports a layer that holds only a marker unique to
the build (`LAYER_MARKER`: no other image shares the layer), and the whole tree is made in
that layer's directory in Podman's overlay store (`podman image inspect`'s UpperDir), the
distributions' files hard-linked there from the venv (copied where it is on another file
system): a container of the image mounts that directory read-only below its own, so a job
sees the files as in any image (and can change none of the venv's). About 3 s of CPU in all;
`podman rmi` removes the links. The image's manifest describes the marker's layer only: it
runs, but is not for `podman save` or a push. Where Podman's storage driver is not overlay,
the tree goes through `podman import` as the minimal image's does.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import time
import uuid
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


def _libraries(*programs: Path) -> list[Path]:
    """The libraries `ldd` names for `programs` (the lines under each one's own name)."""
    listed = subprocess.run(["ldd", *map(str, programs)], capture_output=True, text=True)
    found = []
    for line in listed.stdout.splitlines():
        if not line[:1].isspace():  # "PROGRAM:", where ldd was given several
            continue
        for word in line.split():
            if word.startswith("/"):
                found.append(Path(word))
    return list(dict.fromkeys(found))


def _tree(root: Path, pip: bool = False) -> None:
    def put(source: Path, target: Path | None = None) -> None:
        dest = root / (target or source).relative_to("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)

    put(PYTHON)
    stdlib = Path("/usr/lib/python3.11")
    # The interpreter's and its extension modules' (ctypes needs libffi, ssl libssl...).
    dynload = sorted((stdlib / "lib-dynload").glob("*.so"))
    for library in _libraries(PYTHON, *dynload):
        put(library.resolve(), library)
    # glibc opens it itself (no `ldd` names it) to unwind a thread that ends or is cancelled:
    # without it such a process aborts ("libgcc_s.so.1 must be installed for pthread_exit").
    put((SYSTEM_LIBRARY_DIR / "libgcc_s.so.1").resolve(), SYSTEM_LIBRARY_DIR / "libgcc_s.so.1")
    for name in ("python3", "python"):
        (root / "usr/bin" / name).symlink_to("python3.11")
    put(Path("/bin/dash"), Path("/bin/sh"))
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


# The distributions whose closure the TensorFlow image holds: TensorFlow, and what
# gpuhop's model server imports beside it (`gpuhop.serving.needs`), so that one image
# serves a model too (`gpuhop serve --image`; a few MB more than TensorFlow's 1.8 GB).
TF_DISTRIBUTION = "tensorflow-cpu"
IMAGE_DISTRIBUTIONS = (TF_DISTRIBUTION, "starlette", "uvicorn")
# Each distribution's files go here in the image: on the image's `python3`'s path (Debian's
# site-packages dir), not the host venv's.
DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")
# What manylinux wheels may take from the system rather than bundle (PEP 600's allow-list,
# less the graphics libraries): the C++ runtime above all, which the minimal tree lacks.
SYSTEM_LIBRARIES = (
    "libstdc++.so.6",
    "libgcc_s.so.1",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libutil.so.1",
    "libresolv.so.2",
)
SYSTEM_LIBRARY_DIR = Path("/lib/x86_64-linux-gnu")
# Not needed to run TensorFlow: its C++ headers (for building custom ops).
LEFT_OUT = ("tensorflow/include/",)


def _closure(*names: str) -> list[importlib.metadata.Distribution]:
    """The installed distributions `names` and those they require, transitively (extras
    and markers that do not hold here left out)."""
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in found:
            continue
        dist = found[key] = importlib.metadata.distribution(key)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(found.values())


def tf_problem() -> str | None:
    """Why the TensorFlow image cannot be built here, or None."""
    for name in IMAGE_DISTRIBUTIONS:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return f"{name} is not installed in the tests' venv (pip install -e '.[dev]')"
    absent = [n for n in SYSTEM_LIBRARIES[:2] if not (SYSTEM_LIBRARY_DIR / n).exists()]
    return f"{', '.join(absent)} not in {SYSTEM_LIBRARY_DIR}" if absent else None


def _link(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
    except OSError:  # another file system: a copy, its mtime kept (the bytecode checks it)
        shutil.copy2(source, dest)


def _add_tensorflow(root: Path) -> None:
    for name in SYSTEM_LIBRARIES:
        library = SYSTEM_LIBRARY_DIR / name
        if library.exists() and not (root / library.relative_to("/")).exists():
            _link(library.resolve(), root / library.relative_to("/"))
    target = root / DIST_PACKAGES.relative_to("/")
    for dist in _closure(*IMAGE_DISTRIBUTIONS):
        for file in dist.files or []:
            rel = file.as_posix()
            if rel.startswith("../") or rel.startswith(LEFT_OUT):  # scripts in the venv's bin
                continue
            source = Path(str(dist.locate_file(file)))
            if source.is_file():
                _link(source, target / rel)


# The one file of the TensorFlow image's imported layer (its tree is made in that layer's
# directory afterwards): what it holds is unique to each build, so that Podman, which keeps one
# layer for each content, gives no other image the same layer.
LAYER_MARKER = Path("/etc/gpuhop-test-layer")


def _import(tree: Path, ref: str) -> None:
    tar = subprocess.Popen(["tar", "-C", str(tree), "-cf", "-", "."], stdout=subprocess.PIPE)
    try:
        subprocess.run(
            ["podman", "import", "-", ref], stdin=tar.stdout, capture_output=True, check=True
        )
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait()


def _podman_format(*args: str) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def build(ref: str, work: Path, tensorflow: bool = False, pip: bool = False) -> None:
    """Build the minimal image as `ref` (in Podman's store) from a tree under `work`; with
    `tensorflow`, the TensorFlow image (its tree made in its layer's directory where Podman's
    storage driver is overlay); with `pip`, with pip in it."""
    tree = work / "tree"
    if tensorflow and _podman_format("info", "--format", "{{.Store.GraphDriverName}}") == (
        "overlay"
    ):
        marker = tree / LAYER_MARKER.relative_to("/")
        marker.parent.mkdir(parents=True)
        marker.write_text(f"{ref} {uuid.uuid4()}\n")
        _import(tree, ref)
        try:
            layer = Path(
                _podman_format(
                    "image", "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", ref
                )
            )
            _tree(layer, pip)
            _add_tensorflow(layer)
        except BaseException:
            remove(ref)
            raise
    else:
        _tree(tree, pip)
        if tensorflow:
            _add_tensorflow(tree)
        # Unique to the build: `podman import` of the same bytes gives the same image, and
        # two sessions building in the same second (a tar's times are whole seconds) would
        # share one, each session's end removing the other's (and its jobs' containers).
        marker = tree / LAYER_MARKER.relative_to("/")
        marker.write_text(f"{ref} {uuid.uuid4()}\n")
        _import(tree, ref)
    shutil.rmtree(tree)


def remove(ref: str) -> None:
    subprocess.run(["podman", "rmi", "--force", "--ignore", ref], capture_output=True, check=False)


def remove_whole(ref: str) -> None:
    """Remove the image `ref` names, and every container of it, as the session ends: `podman
    rmi --force` of a name whose image a job's container still used (one starting as the
    session ended: seen in CI) took the name and left the image, untagged, on the machine.
    Its containers are removed, then its id, until it is gone (for thirty seconds at most)."""
    found = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", ref],
        capture_output=True,
        text=True,
        check=False,
    )
    image = found.stdout.strip()
    if not image:
        remove(ref)
        return
    for _ in range(60):
        listed = subprocess.run(
            ["podman", "ps", "--all", "--quiet", "--filter", f"ancestor={image}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if listed.stdout.split():
            subprocess.run(
                ["podman", "rm", "--force", "--time", "0", *listed.stdout.split()],
                capture_output=True,
                check=False,
            )
        remove(image)
        if subprocess.run(["podman", "image", "exists", image]).returncode != 0:
            return
        time.sleep(0.5)


# The images this session built, removed once it is over (`remove_built`).
_built: list[str] = []


def remove_built() -> None:
    """Remove the images this session built, with every container of them, once its
    fixtures are all torn down (tests/conftest.py's `pytest_sessionfinish`). Not in the
    image fixtures' own teardown: a session fixture set up after an agent's is torn down
    before it, and a job the agent still ran (one a last test started) made its container
    of the image then, which took the name and left the image untagged on the machine
    (seen in CI, twice)."""
    while _built:
        with contextlib.suppress(OSError):
            remove_whole(_built.pop())


def sweep_left_behind() -> list[str]:
    """Remove the tests' images that sessions left on the machine, untagged (a name of theirs
    under localhost/gpuhop-test/ ended with the pid of a session no longer running), with
    their containers; one line for each, saying what held it. Called once the whole run is
    over (tests/conftest.py), where every session's own end (`remove_built`) has run: a
    net for what a session that was killed could not remove."""
    if shutil.which("podman") is None:
        return []
    listed = subprocess.run(
        ["podman", "images", "--all", "--quiet", "--no-trunc", "--filter", "dangling=true"],
        capture_output=True,
        text=True,
        check=False,
    )
    said = []
    for image in listed.stdout.split():
        names = _podman_lines(
            "image", "inspect", "--format", "{{range .NamesHistory}}{{.}} {{end}}", image
        )
        ours = [n for n in " ".join(names).split() if n.startswith("localhost/gpuhop-test/")]
        pids = [n.rsplit(":", 1)[-1] for n in ours]
        if not ours or any(p != str(os.getpid()) and Path(f"/proc/{p}").exists() for p in pids):
            continue  # not the tests', or a session still running
        users = _podman_lines(
            "ps", "--all", "--filter", f"ancestor={image}", "--format", "{{.Names}} ({{.Status}})"
        )
        subprocess.run(
            ["podman", "rm", "--force", "--time", "0", *[u.split()[0] for u in users]],
            capture_output=True,
            check=False,
        )
        remove(image)
        held = f"containers: {', '.join(users)}" if users else "no container"
        said.append(f"{image[:12]} (was {', '.join(ours)}; {held}): removed")
    return said


def _podman_lines(*args: str) -> list[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, check=False)
    return [line for line in done.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="session")
def minimal_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The minimal image's reference (built once per session; removed at its end, after
    its agents: `remove_built`)."""
    problem = podman_problem()
    if problem is not None:
        if "root" in problem:
            pytest.skip(problem)
        missing(problem)
    ref = f"localhost/gpuhop-test/minimal:{os.getpid()}"
    build(ref, tmp_path_factory.mktemp("image"))
    _built.append(ref)
    return ref


@pytest.fixture(scope="session")
def tf_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The TensorFlow image's reference (built once per session; removed at its end, after
    its agents: `remove_built`)."""
    problem = podman_problem() or tf_problem()
    if problem is not None:
        if "root" in problem:
            pytest.skip(problem)
        missing(problem)
    ref = f"localhost/gpuhop-test/tensorflow:{os.getpid()}"
    build(ref, tmp_path_factory.mktemp("tf-image"), tensorflow=True)
    _built.append(ref)
    return ref


def containers_named(prefix: str) -> list[str]:
    """The containers (running or not) whose name starts with `prefix`."""
    listed = subprocess.run(
        ["podman", "ps", "--all", "--filter", f"name=^{prefix}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


# A job's helper (the tests' job programs put it in their text): True where it could write
# `path`, else the OS's words for why not.
CAN_WRITE = r"""
def can_write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
    except OSError as e:
        return e.strerror
    return True
"""


def job_containers(paths, job_id: str) -> list[str]:
    """The containers of a job (running or not): those named after it (`podman run`'s
    gpuhop-JOB-ATTEMPT) and those its leader recorded, such as a container started ahead of
    the job that it ran in (gpuhop.backends.local.ready)."""
    found = set(containers_named(f"gpuhop-{job_id}-"))
    try:
        record = json.loads((paths.job_dir(job_id) / "shim.pid").read_text())
    except (OSError, ValueError):
        record = {}
    for name in record.get("containers") or []:
        found.update(n for n in containers_named(name) if n == name)
    return sorted(found)


__all__ = ["CAN_WRITE", "MARKER", "containers_named", "job_containers", "minimal_image", "tf_image"]
