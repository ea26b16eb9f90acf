"""Property tests (hypothesis) for the paths that come from the network or from disk:
manifest paths, tree path checks, artifact path resolution, and the sync's ignore rules,
which must decide as pathspec (git's rules) does."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from types import SimpleNamespace

import pathspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuhop.agent.errors import ApiError
from gpuhop.agent.services.outputs import artifact_file
from gpuhop.agent.storage.trees import TreeError, check_paths
from gpuhop.api import ManifestEntry, validate_relpath
from gpuhop.client.sync.ignores import IgnoreLayer
from gpuhop.home import AgentPaths

# Components that make trouble, and a few ordinary ones.
PARTS = st.sampled_from(
    ["a", "b", "c.py", "..", ".", "", "...", "..a", "a..", " ", "%2e%2e", "\\", "\x00", "é", "~"]
)
NASTY = st.one_of(
    st.lists(PARTS, min_size=1, max_size=6).map("/".join),
    st.text(max_size=40),
)


@given(NASTY)
@example("../etc/passwd")
@example("/etc/passwd")
@example("a/../../b")
@example("a//b")
def test_an_accepted_path_stays_inside_any_root(path: str):
    try:
        validate_relpath(path)
    except ValueError:
        return
    assert not path.startswith("/")
    assert posixpath.normpath(path) == path  # no '.', '..' or '//' left to resolve
    assert ".." not in path.split("/")
    joined = posixpath.normpath(posixpath.join("/root/work", path))
    assert joined.startswith("/root/work/")


@given(NASTY)
def test_a_manifest_entry_takes_exactly_the_paths_validate_relpath_takes(path: str):
    try:
        validate_relpath(path)
        ok = True
    except ValueError:
        ok = False
    try:
        ManifestEntry(path=path, digest="0" * 64, size=0)
        taken = True
    except ValueError:
        taken = False
    assert taken == ok


SAFE_PATHS = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4).map("/".join)


@given(st.lists(SAFE_PATHS, max_size=8))
def test_check_paths_refuses_exactly_duplicates_and_file_dir_clashes(paths: list[str]):
    clash = len(set(paths)) != len(paths) or any(
        q.startswith(p + "/") for p in paths for q in paths
    )
    if clash:
        with pytest.raises(TreeError):
            check_paths(paths)
    else:
        check_paths(paths)
        # And then every file can be made under one root: no path needs a file as a dir.
        files = set(paths)
        for p in paths:
            parents = ["/".join(p.split("/")[:i]) for i in range(1, p.count("/") + 1)]
            assert not files.intersection(parents)


@pytest.fixture(scope="module")
def artifacts_job(tmp_path_factory) -> tuple[SimpleNamespace, Path, Path]:
    home = Path(tmp_path_factory.mktemp("props")) / "home"
    paths = AgentPaths(home)
    root = paths.job_dir("j1") / "artifacts"
    (root / "a").mkdir(parents=True)
    (root / "c.py").write_text("inside")
    (root / "a" / "b").write_text("inside")
    secret = home / "secret"
    secret.write_text("outside")
    (root / "b").symlink_to(secret)  # a link out, as a hostile job could make
    (root / "a" / "c.py").symlink_to(root / "c.py")  # a link that stays inside
    return SimpleNamespace(paths=paths), root, secret


@settings(
    suppress_health_check=[*settings().suppress_health_check, HealthCheck.function_scoped_fixture]
)
@given(path=st.one_of(NASTY.map(str.encode), st.binary(max_size=40)))
@example(path=b"b")
@example(path=b"a/../b")
@example(path=b"a/c.py")
@example(path=b"\xff/../b")
@example(path=b"a/\xe9/../../b")
def test_an_artifact_path_never_leads_out_of_the_artifacts_dir(artifacts_job, path: bytes):
    rt, root, secret = artifacts_job
    try:
        opened = artifact_file(rt, "j1", path)  # type: ignore[arg-type]
    except ApiError as e:
        assert 400 <= e.status < 500
        return
    try:
        # What is sent is the file opened: a regular file inside, never the one outside.
        st = os.fstat(opened.fd)
        inside = {(f.stat().st_dev, f.stat().st_ino) for f in (root / "c.py", root / "a" / "b")}
        assert (st.st_dev, st.st_ino) in inside
        assert os.pread(opened.fd, 64, 0) != secret.read_bytes()
    finally:
        os.close(opened.fd)


PATTERNS = st.sampled_from(
    [
        "a",
        "b/",
        "*.py",
        "!c.py",
        "!a",
        "/a",
        "a/**/b",
        "**/c.py",
        "a/*",
        "!a/b",
        "*",
        "!*.py",
        "b/**",
        "#a",
        "\\!x",
        "?.py",
        "[ab]",
        "a/b/",
    ]
)
NAMES = st.sampled_from(["a", "b", "c.py", "x", "!x", "d.py"])


@given(
    st.lists(PATTERNS, max_size=6),
    st.lists(NAMES, min_size=1, max_size=4).map("/".join),
    st.booleans(),
)
def test_an_ignore_layer_decides_as_pathspec(lines: list[str], path: str, is_dir: bool):
    layer = IgnoreLayer("", lines)
    rel = path + ("/" if is_dir else "")
    expected = pathspec.GitIgnoreSpec.from_lines(lines).check_file(rel).include
    assert layer.check(rel) == expected
