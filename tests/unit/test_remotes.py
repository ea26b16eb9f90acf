"""The remotes file: names and URLs checked, choosing a remote, and what is stored how."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

import pytest

import gpuhop
from gpuhop.client import GpuhopError
from gpuhop.client.transport import remotes
from gpuhop.client.wheel import build_wheel


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUHOP_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("GPUHOP_REMOTE", raising=False)
    return tmp_path / "config"


@pytest.mark.parametrize(
    "url",
    ["ssh://gpu-box", "ssh://me@gpu-box", "ssh://me@gpu-box:2222", "https://team.lab:8443",
     "ssh://me@10.0.0.5", "https://[::1]:8443/"],
)  # fmt: skip
def test_good_urls(url: str) -> None:
    assert remotes.check_url(url) == url.rstrip("/")


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("gpu-box", "use ssh://"),
        ("ftp://gpu-box", "use ssh://"),
        ("https://team.lab", "give the agent's port"),
        ("ssh://gpu-box:99999", "bad port"),
        ("ssh://me:secret@gpu-box", "no passwords"),
        ("https://me@team.lab:8443", "takes a token"),
        ("ssh://gpu-box/some/path", "nothing more"),
        ("ssh://", "expected ssh://[user@]host[:port]"),
        # ssh would take these for options (ProxyCommand runs a command on this machine).
        ("ssh://-oProxyCommand=evil", "cannot start with '-'"),
        ("ssh://-oProxyCommand=evil@gpu-box", "cannot start with '-'"),
        ("ssh://me@-oProxyCommand=evil", "cannot start with '-'"),
    ],
)
def test_bad_urls_say_why(url: str, words: str) -> None:
    with pytest.raises(GpuhopError) as err:
        remotes.check_url(url)
    assert words in err.value.message


@pytest.mark.parametrize("name", ["local", "", "-x", "a b", "x/y", "a" * 64])
def test_bad_names(name: str) -> None:
    with pytest.raises(GpuhopError):
        remotes.check_name(name)


def test_selection_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert remotes.selected(None) is None  # nothing configured: the local agent
    config = remotes.RemotesFile(
        default="a",
        remotes={n: remotes.Remote(name=n, url=f"ssh://{n}-host") for n in ("a", "b")},
    )
    remotes.save(config)

    assert remotes.selected(None).name == "a"  # the default
    monkeypatch.setenv("GPUHOP_REMOTE", "b")
    assert remotes.selected(None).name == "b"  # the environment beats the default
    assert remotes.selected("a").name == "a"  # --on beats both
    assert remotes.selected("local") is None
    with pytest.raises(GpuhopError) as err:
        remotes.selected("c")
    assert "no remote named 'c' (configured: a, b)" in err.value.message


def test_the_file_is_private_and_written_whole(config_dir: Path) -> None:
    remote = remotes.Remote(name="t", url="https://t:1", token="secret-token")
    remotes.save(remotes.RemotesFile(remotes={"t": remote}))

    path = remotes.config_path()
    assert path.stat().st_mode & 0o777 == 0o600
    assert config_dir.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in config_dir.iterdir()] == ["remotes.json"]  # no temp file left
    assert remotes.load().remotes["t"].token == "secret-token"


def test_a_damaged_file_is_named_not_overwritten(config_dir: Path) -> None:
    config_dir.mkdir()
    remotes.config_path().write_text("{not json")
    with pytest.raises(GpuhopError) as err:
        remotes.selected(None)
    assert str(remotes.config_path()) in err.value.message
    assert remotes.config_path().read_text() == "{not json"


def test_the_wheel_is_reproducible_and_complete() -> None:
    name, first = build_wheel()
    _, second = build_wheel()

    assert name == f"gpuhop-{gpuhop.__version__}-py3-none-any.whl"
    assert first == second  # the same code gives the same bytes: the install stamp
    with zipfile.ZipFile(io.BytesIO(first)) as zf:
        names = set(zf.namelist())
        dist_info = f"gpuhop-{gpuhop.__version__}.dist-info"
        assert {
            "gpuhop/cli/main.py",
            "gpuhop/backends/local/leader.py",
            f"{dist_info}/METADATA",
        } <= names
        assert "gpuhop = gpuhop.cli.main:main" in zf.read(f"{dist_info}/entry_points.txt").decode()
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        # A py3-none-any wheel carries no library built for this machine (the chunker's).
        assert "gpuhop/client/sync/_cdc.c" in names and not [n for n in names if n.endswith(".so")]
        for line in zf.read(f"{dist_info}/RECORD").decode().splitlines():
            path, digest, size = line.split(",")
            if not digest:
                continue
            data = zf.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == f"sha256={expected.decode()}"
            assert int(size) == len(data)
