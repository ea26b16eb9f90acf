"""Runs on the user's machine: the cipher order asked of the ssh master connection.

OpenSSH prefers chacha20-poly1305 by default. On a CPU with AES instructions AES-GCM is
about twice as fast (`ssh -c`: 2x on the bench machine, whose `openssl speed` gives 4.6
GB/s for AES-256-GCM), and a bulk upload through the tunnel is bound by it. So where the
user's ssh config leaves the ciphers at OpenSSH's defaults, the master is started with the
same ciphers, the AES-GCM ones first. A user who chose ciphers (`Ciphers` in ssh_config,
or `-c` in $GPUHOP_SSH_COMMAND) keeps exactly their choice; so does a machine without AES
instructions, where chacha20 is the faster.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

AES_GCM = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def has_aes_instructions(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has AES instructions (x86 `aes` flag, Arm `aes` feature). Every Mac
    since 2010 has them, Intel and Apple silicon alike."""
    if sys.platform == "darwin":
        return True
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return "aes" in value.split()
    return False


def preferred(effective: Sequence[str], defaults: Sequence[str]) -> list[str] | None:
    """The cipher list to ask for: `effective` (the user's, as `ssh -G` resolves it) with the
    AES-GCM ciphers first, if it is OpenSSH's `defaults`; None to leave it as it is."""
    if list(effective) != list(defaults):
        return None  # the user chose: theirs stands
    first = [c for c in AES_GCM if c in effective]
    order = first + [c for c in effective if c not in first]
    return order if order != list(effective) else None


def ciphers_of(ssh_g_output: str) -> list[str]:
    """The `ciphers` line of `ssh -G`'s output, as a list ([] if it has none)."""
    for line in ssh_g_output.splitlines():
        key, _, value = line.partition(" ")
        if key == "ciphers":
            return value.strip().split(",")
    return []


def cipher_options(ssh: list[str], destination: str) -> list[str]:
    """`-o Ciphers=...` for the master connection's ssh command line `ssh` (options, no
    destination), or [] where the user's choice or the CPU says to leave the order alone.
    Two `ssh -G` runs (a few ms; nothing is contacted), once per master connection."""
    if not has_aes_instructions():
        return []
    try:
        effective = _resolved([*ssh, "-G", destination])
        # A later -F wins: OpenSSH's own defaults, for the same host.
        defaults = _resolved([*ssh, "-F", "/dev/null", "-G", destination])
    except (OSError, subprocess.SubprocessError):
        return []
    order = preferred(effective, defaults)
    return ["-o", "Ciphers=" + ",".join(order)] if order else []


def _resolved(argv: list[str]) -> list[str]:
    result = subprocess.run(argv, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    return ciphers_of(result.stdout.decode(errors="replace")) if result.returncode == 0 else []
