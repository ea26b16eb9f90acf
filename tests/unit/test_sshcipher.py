"""The ssh master's cipher order: AES-GCM first where the user left OpenSSH's defaults and
the CPU has AES instructions; the user's own choice untouched. `ssh -G` is the real ssh
client resolving a real config (it contacts nothing)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuhop.client.transport import sshcipher
from gpuhop.client.transport.sshcipher import ciphers_of, has_aes_instructions, preferred
from tests.conftest import missing

DEFAULTS = [
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
]


@pytest.fixture
def ssh_client() -> None:
    if shutil.which("ssh") is None:
        missing("no ssh client is installed (openssh-client)")


def test_defaults_get_aes_gcm_first_and_keep_every_cipher() -> None:
    order = preferred(DEFAULTS, DEFAULTS)
    assert order is not None
    assert order[:2] == ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]
    assert sorted(order) == sorted(DEFAULTS)


def test_a_users_own_choice_stands() -> None:
    mine = ["chacha20-poly1305@openssh.com", "aes256-gcm@openssh.com"]
    assert preferred(mine, DEFAULTS) is None
    assert preferred([], []) is None  # ssh -G failed: nothing asked
    gcm_first = ["aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com"]
    assert preferred(gcm_first, gcm_first) is None  # already first


def test_ciphers_line_of_ssh_g() -> None:
    out = "user me\nciphers a,b,c\nmacs x\n"
    assert ciphers_of(out) == ["a", "b", "c"]
    assert ciphers_of("user me\n") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("processor\t: 0\nflags\t\t: fpu sse2 aes avx2\n", True),
        ("processor\t: 0\nflags\t\t: fpu sse2 avx2\n", False),
        ("processor\t: 0\nFeatures\t: fp asimd aes pmull sha1\n", True),
        ("nothing here\n", False),
    ],
)
def test_aes_instructions_read_from_cpuinfo(tmp_path: Path, text: str, expected: bool) -> None:
    if sshcipher.sys.platform == "darwin":
        pytest.skip("every Mac has AES instructions: /proc/cpuinfo is not read")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    assert has_aes_instructions(cpuinfo) is expected
    assert has_aes_instructions(tmp_path / "absent") is False


@pytest.mark.usefixtures("ssh_client")
def test_options_for_a_config_with_and_without_ciphers(tmp_path: Path) -> None:
    if not has_aes_instructions():
        pytest.skip("this CPU has no AES instructions: the order is left alone")
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host plain\n  HostName 127.0.0.1\n"
        "Host chosen\n  HostName 127.0.0.1\n  Ciphers aes256-ctr,chacha20-poly1305@openssh.com\n"
    )
    ssh = ["ssh", "-F", str(config)]
    options = sshcipher.cipher_options(ssh, "plain")
    assert options[0] == "-o"
    asked = options[1].removeprefix("Ciphers=").split(",")
    assert asked[0].startswith("aes") and asked[0].endswith("-gcm@openssh.com")
    # What ssh would use with that option: exactly the asked order, which it accepts.
    assert sshcipher._resolved([*ssh, *options, "-G", "plain"]) == asked
    assert sshcipher.cipher_options(ssh, "chosen") == []
    assert sshcipher.cipher_options([*ssh, "-c", "aes256-ctr"], "plain") == []
