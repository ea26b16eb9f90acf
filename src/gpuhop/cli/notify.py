"""Runs on the user's machine: `--notify desktop`, a desktop notification when a job that
`gpuhop run` waited for ends (notify-send where there is one, else a bell and a line)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys


def desktop_notify(title: str, body: str) -> None:
    """Show `title` and `body` on this machine's desktop; never fails the command."""
    exe = shutil.which("notify-send")
    if exe is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([exe, "--app-name=gpuhop", title, body], timeout=10, check=True)
            return
    sys.stderr.write(f"\a{title}\n")
    sys.stderr.flush()
