"""gpuhop.home's per-user dirs: on Linux read from the XDG variables without platformdirs,
and where platformdirs puts them, whatever the variables say."""

from __future__ import annotations

import sys
from pathlib import Path

import platformdirs
import pytest

from gpuhop.home import XDG_DIRS, default_home, user_dir

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG on Linux")


def platformdirs_says(kind: str) -> Path:
    return Path(getattr(platformdirs, f"user_{kind}_dir")("gpuhop"))


@linux_only
@pytest.mark.parametrize("kind", sorted(XDG_DIRS))
@pytest.mark.parametrize(
    "value", [None, "", "/custom/place", "/trailing/slash/", "relative/dir", "~/tilde"]
)
def test_each_dir_is_where_platformdirs_puts_it(monkeypatch, kind, value):
    variable = XDG_DIRS[kind][0]
    if value is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("HOME", "/home/someone")
    assert user_dir(kind) == platformdirs_says(kind)


@linux_only
@pytest.mark.parametrize("home", ["/", "/home/someone/", "relative", ""])
def test_an_odd_home_gives_the_same_dirs(monkeypatch, home):
    monkeypatch.setenv("HOME", home)
    for kind, (variable, _) in XDG_DIRS.items():
        monkeypatch.delenv(variable, raising=False)
        assert user_dir(kind) == platformdirs_says(kind)


def test_gpuhop_home_wins_over_the_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHOP_HOME", str(tmp_path / "home"))
    assert default_home() == tmp_path / "home"
    monkeypatch.delenv("GPUHOP_HOME")
    assert default_home() == user_dir("data").absolute()


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="no per-user dir of kind 'music'"):
        user_dir("music")
