"""Runs on the user's machine: `gpuhop remote bootstrap`, setting up a host that has only
Python and SSH.

Over the remote's SSH connection it installs this very version of gpuhop (the wheel travels
through the connection, so no package index is needed when the dependencies are already
there) into a venv in the remote user's gpuhop state dir, starts the agent, and reports what
the host has. Everything runs as the remote user; nothing needs root. Run again, it changes
nothing unless this gpuhop (or the chosen Python) differs from what the host has.

The venv sees the packages of the interpreter it was made from (system site packages, and
the packages of a venv or conda env given with --python), so the host's TensorFlow is used
as it is and never installed again; so is its pip (the venv gets a pip of its own, from
ensurepip, only where the interpreter has none).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuhop.client.errors import GpuhopError
from gpuhop.client.transport.remotes import Remote
from gpuhop.client.transport.remotes import update as update_remote
from gpuhop.client.transport.ssh import REMOTE_HOME, SshConnection, remote_home
from gpuhop.client.wheel import build_wheel

MIN_PYTHON = (3, 11)
VENV = "gpuhop-venv"

_PROBE = f"""
home="{REMOTE_HOME}"
echo "home=$home"
if command -v "$1" >/dev/null 2>&1; then
  "$1" -c 'import sys; print("python=" + sys.executable)
print("version=%d.%d.%d" % sys.version_info[:3])' || echo "python_broken=1"
else
  echo "python_missing=1"
fi
if [ -f "$home/{VENV}/gpuhop-stamp" ]; then echo "stamp=$(cat "$home/{VENV}/gpuhop-stamp")"; fi
"""

# $1 python, $2 wheel file name, $3 stamp, $4 "fresh" to make the venv again; wheel on stdin.
_INSTALL = f"""
set -eu
home="{REMOTE_HOME}"
venv="$home/{VENV}"
mkdir -p "$home"
chmod 700 "$home"
tmp=$(mktemp -d "$home/.bootstrap.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/$2"
if [ "$4" = fresh ]; then rm -rf "$venv"; fi
if [ ! -x "$venv/bin/python" ]; then
  "$1" -m venv --without-pip --system-site-packages "$venv"
  # A venv (or conda env) given as the interpreter: make its packages visible as well.
  "$1" - "$venv/bin/python" <<'PY'
import subprocess, sys, sysconfig
if sys.prefix != sys.base_prefix:
    paths = sysconfig.get_paths()
    dirs = sorted({{paths["purelib"], paths["platlib"]}})
    cmd = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    target = subprocess.check_output([sys.argv[1], "-c", cmd], text=True).strip()
    with open(target + "/gpuhop-base.pth", "w") as f:
        f.writelines(f"import site; site.addsitedir({{d!r}})\\n" for d in dirs)
PY
  # The pip the chosen Python has serves the venv too (as for a job's environment); a copy of
  # its own (ensurepip's) only where it has none: that copy costs seconds of CPU.
  if ! "$venv/bin/python" -c 'import pip' >/dev/null 2>&1; then
    "$venv/bin/python" -m ensurepip --default-pip >"$tmp/venv.log" 2>&1 || true
  fi
fi
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "no pip for $1 on this host: install python3-venv (or python3-pip), or pass --python" >&2
  exit 3
fi
pip="$venv/bin/python -m pip --disable-pip-version-check --no-input"
$pip install -q --no-deps --force-reinstall "$tmp/$2"
$pip install -q "$tmp/$2"
printf '%s\\n' "$3" > "$venv/gpuhop-stamp"
"""

# $1 "restart" to restart a running agent (after an upgrade).
_START = f"""
set -eu
home="{REMOTE_HOME}"
g="$home/{VENV}/bin/gpuhop"
if "$g" agent status >/dev/null 2>&1; then
  if [ "$1" = restart ]; then
    "$g" agent stop >&2
    "$g" agent start >&2
    echo "agent=restarted"
  else
    echo "agent=running"
  fi
else
  "$g" agent start >&2
  echo "agent=started"
fi
"$home/{VENV}/bin/python" - <<'PY'
from importlib import metadata
for name in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
    try:
        print("tensorflow=" + metadata.version(name))
        break
    except metadata.PackageNotFoundError:
        pass
PY
"""


@dataclass
class BootstrapReport:
    remote: str
    python: str
    python_version: str
    home: str
    installed: bool
    """False when the host already had this gpuhop."""
    agent: str
    """started, running or restarted."""
    tensorflow: str | None
    seconds: float
    notes: list[str] = field(default_factory=list)


def bootstrap(
    remote: Remote,
    python: str | None = None,
    say: Callable[[str], None] = lambda text: None,
) -> BootstrapReport:
    """Install this gpuhop on `remote`'s host (unless there already) and start its agent."""
    started = time.monotonic()
    python = python or remote.python or "python3"
    conn = SshConnection(remote)
    say(f"connecting to {conn.target}")
    facts = _keyvalues(conn.run(_PROBE, python).stdout)
    if "python_missing" in facts:
        raise GpuhopError(
            f"no Python at {python!r} on remote '{remote.name}': install Python >= 3.11 there,"
            " or pass --python PATH",
            code="no_python",
        )
    if "python_broken" in facts or "version" not in facts:
        raise GpuhopError(f"{python!r} on remote '{remote.name}' does not run", "no_python")
    version = tuple(int(p) for p in facts["version"].split("."))
    if version < MIN_PYTHON:
        raise GpuhopError(
            f"{facts['python']} on remote '{remote.name}' is Python {facts['version']};"
            f" gpuhop needs {'.'.join(map(str, MIN_PYTHON))} or newer (pass --python PATH)",
            code="no_python",
        )
    name, wheel = build_wheel()
    stamp = f"{hashlib.sha256(wheel).hexdigest()} {facts['python']}"
    old = facts.get("stamp")
    installed = old != stamp
    if installed:
        fresh = old is not None and old.split(" ", 1)[-1] != facts["python"]
        say(f"installing {name} with {facts['python']} (Python {facts['version']})")
        conn.run(_INSTALL, python, name, stamp, "fresh" if fresh else "keep", stdin=wheel)
    start = "restart" if installed and old is not None else "start"
    result = _keyvalues(conn.run(_START, start).stdout)
    remote.python = python
    remote.remote_home = facts["home"]
    remote.remote_gpuhop = f"{facts['home']}/{VENV}/bin/gpuhop"
    update_remote(remote)
    report = BootstrapReport(
        remote=remote.name,
        python=facts["python"],
        python_version=facts["version"],
        home=remote_home(conn),
        installed=installed,
        agent=result.get("agent", "started"),
        tensorflow=result.get("tensorflow"),
        seconds=time.monotonic() - started,
    )
    if report.tensorflow is None:
        report.notes.append(
            f"TensorFlow is not installed for {facts['python']}: jobs that import it fail."
            " Install it there, or bootstrap with --python pointing at an environment that has it."
        )
    return report


def _keyvalues(out: bytes) -> dict[str, str]:
    facts = {}
    for line in out.decode(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key.strip()] = value.strip()
    return facts
