"""The client's walk and hash cache, on real temp trees: ignore rules, links, modes, caching."""

from __future__ import annotations

import hashlib
import marshal
import os
import time
import types
from pathlib import Path

import pytest

from gpuhop.client.sync import ignores
from gpuhop.client.sync import workdir as sync
from gpuhop.client.sync.workdir import HashCache, ScanResult, SyncError, cache_path_for, scan

LONG_AGO = time.time() - 3600


def make_tree(root: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def paths(result: ScanResult) -> list[str]:
    return [f.path for f in result.files]


def by_path(result: ScanResult) -> dict[str, sync.FileEntry]:
    return {f.path: f for f in result.files}


def sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def age_all(root: Path, when: float = LONG_AGO) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            os.utime(Path(dirpath) / name, (when, when))


@pytest.fixture
def settled_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the scanner's clock run an hour ahead.

    The cache refuses files whose mtime *or ctime* is within RACY_WINDOW_NS of the scan, and
    a test cannot move a ctime into the past (os.utime sets it to now). Moving the clock the
    scanner reads is the only way to test caching without sleeping.
    """
    ahead = 3600 * 1_000_000_000
    clock = types.SimpleNamespace(
        time_ns=lambda: time.time_ns() + ahead, perf_counter=time.perf_counter
    )
    monkeypatch.setattr(sync, "time", clock)


# -- what gets sent ---------------------------------------------------------------------------


def test_scan_lists_every_file_with_its_size_and_digest(tmp_path: Path):
    # More than 8 files, so the thread-pool path hashes them.
    files = {f"d{i % 3}/f{i}.txt": f"content {i}" * i for i in range(20)}
    files["empty"] = ""
    make_tree(tmp_path, files)

    result = scan(tmp_path)

    assert paths(result) == sorted(files)
    for rel, entry in by_path(result).items():
        assert entry.digest == sha256(files[rel])
        assert entry.size == len(files[rel].encode())
        assert Path(entry.abspath).read_text() == files[rel]
    assert result.hashed == len(files)
    assert result.total_bytes == sum(len(c) for c in files.values())


def test_scan_of_a_file_is_refused(tmp_path: Path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SyncError, match="not a directory"):
        scan(tmp_path / "f")


def test_root_gitignore_is_honoured(tmp_path: Path):
    make_tree(
        tmp_path,
        {
            ".gitignore": "*.log\nbuild/\n/top-only.txt\n",
            "main.py": "",
            "a.log": "",
            "src/b.log": "",
            "build/out.bin": "",
            "src/build/out.bin": "",
            "top-only.txt": "",
            "src/top-only.txt": "",
        },
    )

    assert paths(scan(tmp_path)) == [".gitignore", "main.py", "src/top-only.txt"]


def test_nested_negation_re_includes_a_file_ignored_higher_up(tmp_path: Path):
    make_tree(
        tmp_path,
        {
            ".gitignore": "*.log\n",
            "a.log": "",
            "sub/.gitignore": "!keep.log\n",
            "sub/keep.log": "kept",
            "sub/other.log": "",
            "sub/deeper/keep.log": "kept too",
            "other/keep.log": "",
        },
    )

    assert paths(scan(tmp_path)) == [
        ".gitignore",
        "sub/.gitignore",
        "sub/deeper/keep.log",
        "sub/keep.log",
    ]


def test_nested_gitignore_patterns_are_relative_to_their_directory(tmp_path: Path):
    make_tree(
        tmp_path,
        {
            "sub/.gitignore": "/data.csv\n",
            "sub/data.csv": "",
            "sub/inner/data.csv": "",
            "data.csv": "",
        },
    )

    assert paths(scan(tmp_path)) == ["data.csv", "sub/.gitignore", "sub/inner/data.csv"]


def test_gpuhopignore_is_honoured_and_overrides_gitignore(tmp_path: Path):
    make_tree(
        tmp_path,
        {
            ".gitignore": "*.csv\n",
            ".gpuhopignore": "datasets/\n!small.csv\n",
            "small.csv": "",
            "big.csv": "",
            "datasets/train.npz": "",
            "train.py": "",
        },
    )

    assert paths(scan(tmp_path)) == [".gitignore", ".gpuhopignore", "small.csv", "train.py"]


def test_an_ignored_directory_is_not_entered(tmp_path: Path):
    make_tree(
        tmp_path,
        {".gitignore": "data/\n!data/keep.txt\n", "data/keep.txt": "", "data/x.bin": ""},
    )
    # A trap: entering data/ means reading its .gitignore, which here cannot be read.
    (tmp_path / "data" / ".gitignore").mkdir()

    # git's rule: a file cannot be re-included when its directory is excluded.
    assert paths(scan(tmp_path)) == [".gitignore"]

    # The trap is real: once data/ is not ignored, the scan walks into it and fails.
    (tmp_path / ".gitignore").unlink()
    with pytest.raises(SyncError, match=r"data/\.gitignore"):
        scan(tmp_path)


def test_default_ignores(tmp_path: Path):
    make_tree(
        tmp_path,
        {
            ".git/config": "",
            "__pycache__/m.cpython-311.pyc": "",
            "pkg/__pycache__/n.cpython-311.pyc": "",
            "pkg/stale.pyc": "",
            "gpuhop-artifacts/model.keras": "",
            ".venv/bin/python": "",
            ".ipynb_checkpoints/nb.ipynb": "",
            "pkg/mod.py": "",
            "train.py": "",
        },
    )

    assert paths(scan(tmp_path)) == ["pkg/mod.py", "train.py"]


DEFAULT_CASES = [
    *(f"{d}/" for d in (".git", ".venv", "__pycache__", "gpuhop-artifacts", ".ruff_cache")),
    *(f"a/b/{d}/" for d in (".git", ".hg", ".svn", ".ipynb_checkpoints", ".mypy_cache")),
    ".git/config", "a/.git/HEAD", ".pytest_cache/v/x", "a/__pycache__/m.cpython-311.pyc",
    ".git", "a/.venv", "gpuhop-artifacts",  # files, not directories: kept
    ".gitx/", "x.git/", "a/git/", "venv/", "__pycache__x/", "pycache/",
    "m.pyc", "m.pyo", "m.pyd", "a/b/m.pyc", ".pyc", "m.pyc/", "m.pyd/inner.txt",
    "m.py", "m.pyx", "m.pycx", "pyc", "a.pyc.txt", "a/b/c.py", "README", "x/y/z/",
    "M.PYC", ".GIT/",  # pathspec matches case-sensitively
]  # fmt: skip


@pytest.mark.parametrize("path", DEFAULT_CASES)
def test_the_default_ignores_match_without_pathspec_as_pathspec_does(path: str):
    assert ignores.DefaultsLayer().check(path) == ignores.IgnoreLayer(
        "", ignores.DEFAULT_IGNORES
    ).check(path)


def test_a_root_without_ignore_files_loads_no_pathspec(tmp_path: Path):
    make_tree(tmp_path, {"a.py": "", "m.pyc": "", "__pycache__/x.pyc": "", "sub/b.py": ""})
    rules = ignores.IgnoreRules.root(tmp_path)
    assert isinstance(rules.layers[0], ignores.DefaultsLayer)
    assert paths(scan(tmp_path)) == ["a.py", "sub/b.py"]
    (tmp_path / ".gitignore").write_text("sub/\n")
    assert isinstance(ignores.IgnoreRules.root(tmp_path).layers[0], ignores.IgnoreLayer)
    assert paths(scan(tmp_path)) == [".gitignore", "a.py"]


def test_a_rescan_of_unchanged_dirs_compiles_no_ignore_patterns(
    tmp_path: Path, settled_clock, monkeypatch
):
    """Unchanged directories' listings are reused: no path is checked, so an ignore file's
    patterns are never compiled (and pathspec never imported) on a re-run."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {".gitignore": "*.log\n", "a.py": "", "x.log": "", "sub/b.py": ""})
    age_all(work)
    compiled: list[tuple[str, ...]] = []
    compile_patterns = ignores.IgnoreLayer._compile

    def counted(layer: ignores.IgnoreLayer):
        compiled.append(tuple(layer.lines))
        return compile_patterns(layer)

    monkeypatch.setattr(ignores.IgnoreLayer, "_compile", counted)
    assert paths(scan(work, cache)) == [".gitignore", "a.py", "sub/b.py"]
    assert len(compiled) == 1
    assert paths(scan(work, cache)) == [".gitignore", "a.py", "sub/b.py"]
    assert len(compiled) == 1  # the second scan checked no path
    (work / "sub" / "c.log").write_text("")
    assert paths(scan(work, cache)) == [".gitignore", "a.py", "sub/b.py"]
    assert len(compiled) == 2  # sub changed: listed and matched again


def test_gpuhopignore_negation_brings_back_a_default_ignore(tmp_path: Path):
    make_tree(tmp_path, {".gpuhopignore": "!*.pyc\n", "lib.pyc": "", "x.py": ""})

    assert paths(scan(tmp_path)) == [".gpuhopignore", "lib.pyc", "x.py"]


# -- links --------------------------------------------------------------------------------------


def test_link_to_a_file_inside_the_tree_is_sent_as_its_content(tmp_path: Path):
    make_tree(tmp_path, {"real/data.txt": "payload"})
    os.symlink("real/data.txt", tmp_path / "link.txt")

    entries = by_path(scan(tmp_path))

    assert sorted(entries) == ["link.txt", "real/data.txt"]
    assert entries["link.txt"].digest == sha256("payload")
    assert entries["link.txt"].size == len("payload")


def test_link_out_of_the_tree_is_an_error_naming_the_link(tmp_path: Path, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_text("x")
    make_tree(tmp_path, {"sub/ok.txt": ""})
    os.symlink(outside / "secret.txt", tmp_path / "sub" / "escape")

    with pytest.raises(SyncError, match=r"sub/escape is a link to .*outside the work dir"):
        scan(tmp_path)


def test_ignored_link_out_of_the_tree_is_fine(tmp_path: Path, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    make_tree(tmp_path, {".gpuhopignore": "escape\n", "ok.txt": ""})
    os.symlink(outside, tmp_path / "escape")

    assert paths(scan(tmp_path)) == [".gpuhopignore", "ok.txt"]


@pytest.mark.timeout(10)
def test_directory_link_loop_does_not_hang(tmp_path: Path):
    make_tree(tmp_path, {"a.txt": "", "sub/b.txt": ""})
    os.symlink("..", tmp_path / "sub" / "up")
    os.symlink(".", tmp_path / "sub" / "self")

    assert paths(scan(tmp_path)) == ["a.txt", "sub/b.txt"]


def test_broken_link_is_skipped_with_a_warning(tmp_path: Path):
    make_tree(tmp_path, {"ok.txt": ""})
    os.symlink("nowhere", tmp_path / "dangling")

    result = scan(tmp_path)

    assert paths(result) == ["ok.txt"]
    assert any("dangling" in w for w in result.warnings)


@pytest.mark.timeout(10)
def test_file_link_loop_is_reported_not_crashed_on(tmp_path: Path):
    make_tree(tmp_path, {"ok.txt": ""})
    os.symlink("loop", tmp_path / "loop")

    try:
        result = scan(tmp_path)
    except SyncError as e:
        assert "loop" in str(e)
    else:
        assert paths(result) == ["ok.txt"]
        assert any("loop" in w for w in result.warnings)


def test_directory_reached_through_a_link_is_still_sent_at_its_real_path(tmp_path: Path):
    make_tree(tmp_path, {"datasets/v2/train.csv": "x"})
    os.symlink("datasets/v2", tmp_path / "data")  # "data" sorts before "datasets"

    assert "datasets/v2/train.csv" in paths(scan(tmp_path))


def test_executable_bit_is_recorded(tmp_path: Path):
    make_tree(tmp_path, {"run.sh": "#!/bin/sh\n", "data.txt": ""})
    os.chmod(tmp_path / "run.sh", 0o755)
    os.chmod(tmp_path / "data.txt", 0o644)

    entries = by_path(scan(tmp_path))

    assert entries["run.sh"].executable is True
    assert entries["data.txt"].executable is False


# -- the hash cache -----------------------------------------------------------------------------


def test_unchanged_tree_is_not_hashed_again(tmp_path: Path, settled_clock):
    work, cache = tmp_path / "work", tmp_path / "cache"
    files = {f"f{i}.txt": str(i) for i in range(12)}
    make_tree(work, files)
    age_all(work)

    first = scan(work, cache)
    second = scan(work, cache)

    assert first.hashed == len(files)
    assert second.hashed == 0
    assert [(f.path, f.digest, f.size) for f in second.files] == [
        (f.path, f.digest, f.size) for f in first.files
    ]


def test_changed_file_is_the_only_one_hashed_again(tmp_path: Path, settled_clock):
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {"a.txt": "aaa", "b.txt": "bbb", "c.txt": "ccc"})
    age_all(work)
    scan(work, cache)

    # Same size, and an mtime that is old but different: only the stat key can tell.
    (work / "b.txt").write_text("BBB")
    os.utime(work / "b.txt", (LONG_AGO - 60, LONG_AGO - 60))
    result = scan(work, cache)

    assert result.hashed == 1
    assert {f.path: f.digest for f in result.files} == {
        "a.txt": sha256("aaa"),
        "b.txt": sha256("BBB"),
        "c.txt": sha256("ccc"),
    }


def test_recently_modified_files_are_not_cached(tmp_path: Path):
    # Real clock: the files were just written, so they are inside the racy window.
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {"a.txt": "a", "b.txt": "b"})

    scan(work, cache)

    assert scan(work, cache).hashed == 2


def test_an_edit_in_the_same_tick_as_the_scan_before_is_seen(tmp_path: Path):
    """git's racily clean file: written, scanned, and rewritten at the same size with the
    very same mtime (as a coarse clock would give it). The first scan must not have cached
    it, so the second hashes it again."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {"a.txt": "aaa"})
    before = os.stat(work / "a.txt")
    assert by_path(scan(work, cache))["a.txt"].digest == sha256("aaa")
    (work / "a.txt").write_text("AAA")
    os.utime(work / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert by_path(scan(work, cache))["a.txt"].digest == sha256("AAA")


@pytest.mark.parametrize("how", ["in place", "replaced"])
def test_an_old_file_edited_keeping_its_size_and_mtime_is_hashed_again(
    tmp_path: Path, settled_clock, how: str
):
    """The cached size and mtime match; the ctime (and, replaced by a rename, the inode)
    does not."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {"a.txt": "aaa", "b.txt": "bbb"})
    age_all(work)
    scan(work, cache)
    if how == "in place":
        (work / "b.txt").write_text("BBB")
    else:
        (work / "new").write_text("BBB")
        os.replace(work / "new", work / "b.txt")
    os.utime(work / "b.txt", (LONG_AGO, LONG_AGO))
    result = scan(work, cache)
    assert result.hashed == 1
    assert by_path(result)["b.txt"].digest == sha256("BBB")


def test_a_mode_change_alone_is_seen(tmp_path: Path, settled_clock):
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {"run.sh": "echo hi"})
    age_all(work)
    assert not by_path(scan(work, cache))["run.sh"].executable
    (work / "run.sh").chmod(0o755)
    assert by_path(scan(work, cache))["run.sh"].executable


def test_deleted_file_leaves_the_manifest_and_the_cache(tmp_path: Path, settled_clock):
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {"keep.txt": "k", "gone.txt": "g"})
    age_all(work)
    scan(work, cache)

    (work / "gone.txt").unlink()
    result = scan(work, cache)

    assert paths(result) == ["keep.txt"]
    assert result.hashed == 0
    assert set(HashCache(cache_path_for(cache, work)).entries) == {"keep.txt"}


def test_cache_is_per_work_dir(tmp_path: Path, settled_clock):
    cache = tmp_path / "cache"
    for name in ("one", "two"):
        make_tree(tmp_path / name, {"same.txt": name})
    age_all(tmp_path)

    scan(tmp_path / "one", cache)
    result = scan(tmp_path / "two", cache)

    assert result.hashed == 1
    assert result.files[0].digest == sha256("two")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x00garbage\xff",
        marshal.dumps({"version": sync.CACHE_VERSION, "entries": {"a": (1, 2, 3, 4, "d")}})[:-5],
        marshal.dumps({"version": sync.CACHE_VERSION + 1, "entries": {}}),
        marshal.dumps({"version": sync.CACHE_VERSION}),
        marshal.dumps([1, 2, 3]),
    ],
    ids=["empty", "garbage", "truncated", "other-version", "no-entries", "not-a-dict"],
)
def test_corrupt_cache_file_starts_empty(tmp_path: Path, content: bytes):
    path = tmp_path / "cache.marshal"
    path.write_bytes(content)

    assert HashCache(path).entries == {}


def test_scan_with_a_corrupt_cache_rehashes_and_repairs_it(tmp_path: Path, settled_clock):
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {"a.txt": "a"})
    age_all(work)
    cache_file = cache_path_for(cache, work)
    cache_file.parent.mkdir(parents=True)
    cache_file.write_bytes(b"\x00not marshal")

    first = scan(work, cache)
    second = scan(work, cache)

    assert (first.hashed, second.hashed) == (1, 0)
    assert first.files[0].digest == sha256("a")


# -- the directory listing cache ---------------------------------------------------------------


def test_unchanged_directories_are_not_listed_again(tmp_path: Path, settled_clock, monkeypatch):
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {"a/x.txt": "x", "a/b/y.txt": "y", ".gitignore": "*.log\n"})
    age_all(work)
    first = scan(work, cache)
    listed: list[Path] = []
    real_list_dir = sync._list_dir

    def counting(directory, *args):
        listed.append(directory)
        return real_list_dir(directory, *args)

    monkeypatch.setattr(sync, "_list_dir", counting)
    second = scan(work, cache)
    assert listed == []
    assert paths(second) == paths(first) == [".gitignore", "a/b/y.txt", "a/x.txt"]


def test_added_and_removed_files_are_seen_through_the_listing_cache(tmp_path, settled_clock):
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {"a/x.txt": "x", "a/b/y.txt": "y"})
    age_all(work)
    scan(work, cache)
    (work / "a" / "b" / "new.txt").write_text("new")
    (work / "a" / "x.txt").unlink()
    assert paths(scan(work, cache)) == ["a/b/new.txt", "a/b/y.txt"]


def test_editing_a_parent_ignore_file_relists_the_directories_below(tmp_path, settled_clock):
    work, cache = tmp_path / "work", tmp_path / "cache"
    make_tree(work, {"a/b/keep.txt": "k", "a/b/drop.bin": "d", "a/.gitignore": ""})
    age_all(work)
    assert paths(scan(work, cache)) == ["a/.gitignore", "a/b/drop.bin", "a/b/keep.txt"]
    # Rewriting a file leaves its directory's mtime alone: only the rules key can tell.
    (work / "a" / ".gitignore").write_text("*.bin\n")
    age_all(work)
    assert paths(scan(work, cache)) == ["a/.gitignore", "a/b/keep.txt"]


def test_scans_of_one_work_dir_from_threads_of_one_process_all_save_the_cache(tmp_path: Path):
    # Two `Client.submit`s of one work dir at once, from one process: each saves the hash
    # cache through a temp file of its own (one named by the pid alone was renamed away
    # under the other: FileNotFoundError).
    import threading

    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    for i in range(20):
        (work / f"f{i}.txt").write_text(str(i))
    errors: list[BaseException] = []
    digests: list[str] = []

    def one(n: int) -> None:
        try:
            for _ in range(5):
                (work / f"t{n}.txt").write_text(str(time.time_ns()))  # each save has work
                digests.append(scan(work, cache).digest)
        except BaseException as e:  # the test reads them below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(digests) == 20
    assert not [p.name for p in cache_path_for(cache, work).parent.iterdir() if ".tmp" in p.name]


def test_a_sync_of_a_gigabyte_names_its_largest_files_and_what_to_do(tmp_path: Path):
    # A 2 GB data file not ignored went with the job with no word but "synced 8 files".
    from gpuhop.cli.jobs import BIG_SYNC, big_sync_hint
    from gpuhop.client.submitted import SyncStats

    (tmp_path / "train.py").write_text("pass\n")
    (tmp_path / "data").mkdir()
    for name, size in (("data/big.bin", 300 << 20), ("data/mid.bin", 120 << 20)):
        with open(tmp_path / name, "wb") as f:
            f.truncate(size)  # sparse: hashed as zeros, nothing written
    stats = SyncStats(scan(tmp_path), files_sent=3, bytes_sent=BIG_SYNC)
    assert stats.largest() == [("data/big.bin", 300 << 20), ("data/mid.bin", 120 << 20)]
    hint = big_sync_hint(stats)
    assert hint.startswith("1.0 GiB of this work dir went with the job (largest: data/big.bin")
    assert "gpuhop data push DIR --name NAME" in hint and ".gpuhopignore" in hint
