"""Runs in the agent: py-spy, the sampling profiler, on this host's processes (`gpuhop
stacks`: a dump of every Python thread's stack in a job's processes; `gpuhop profile` of a
job that runs neither TensorFlow nor JAX: a flame graph of a few seconds' samples).

py-spy runs as the agent, against the job's processes by their host pids. It reads their
memory with ptrace (it pauses each process while it reads, a few milliseconds), which
the kernel allows here without loosening the job's sandbox: a team agent runs as root, with
CAP_SYS_PTRACE over every process; a single-user agent's jobs run as its own uid in a user
namespace it made, and the creator of a user namespace holds every capability inside it,
CAP_SYS_PTRACE too (so Yama's ptrace_scope 1 lets it through as well; only scope 2 or 3,
which allow ptrace to an administrator only or to none, stop it, and py-spy's error says
so). py-spy finds the job's interpreter and libraries through /proc/PID/root, the job's own
view. Running it inside the job's sandbox instead would need the job's namespaces entered
and its identity taken, for no more rights than it has from here, and would put the dump
under the job's own control.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from gpuhop.backends import procs

# One dump is a few tens of milliseconds; a process it cannot read makes py-spy give up fast.
DUMP_TIMEOUT = 20.0
# A process's dump is a few KiB (a line a frame); its first MiB, of one that runs thousands
# of threads or recurses deep, says where it is.
DUMP_BYTES = 1 << 20


def _in_namespaces_of(pid: int, pyspy: str, fd: int) -> list[str]:
    """The command that dumps `pid` with its native frames. py-spy unwinds each thread by the
    thread id Python recorded, which is the id in the job's PID namespace: from outside it
    names another thread or none ("UNW_EBADREG"). So for a job in a PID namespace of its
    own, py-spy runs inside it and its mount namespace, entered with nsenter: as root, or,
    for an agent that is not, through the user namespace it made for the job, keeping its
    uid. py-spy (a static program) is run from `fd`, open on it here and inherited: a
    container's mount namespace, unlike the sandbox's, has no agent's venv in it."""
    try:
        namespaced = os.stat(f"/proc/{pid}/ns/pid").st_ino != os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespaced = False
    inner = pid_inside(pid) if namespaced else None
    if inner is None:
        return [pyspy, "dump", "--pid", str(pid)]
    user = [] if os.geteuid() == 0 else ["-U", "--preserve-credentials"]
    run = f"/proc/self/fd/{fd}"
    return ["nsenter", "-t", str(pid), *user, "-m", "-p", run, "dump", "--pid", str(inner)]


def pid_inside(pid: int) -> int | None:
    """The process's pid in its own (innermost) PID namespace, or None if gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


class NoPySpy(Exception):
    """py-spy is not installed where the agent looks for it."""


def find() -> str:
    """The py-spy executable beside the agent's interpreter (its venv), else on PATH."""
    beside = os.path.dirname(sys.executable)
    found = shutil.which("py-spy", path=os.pathsep.join([beside, os.environ.get("PATH", "")]))
    if found is None:
        raise NoPySpy(
            "py-spy is not installed on the agent's host (it comes with gpuhop: `pip install"
            f" py-spy` into the agent's Python, {sys.executable})"
        )
    return found


def _error_of(code: int, said: str) -> str:
    """Why py-spy gave nothing, in its own words where it said them."""
    why = next((line for line in said.strip().splitlines() if line.startswith("Error: ")), None)
    if why is None:
        return f"py-spy exited with code {code}"
    if "Failed to find python version" in why:
        return "not a Python process"
    return why.removeprefix("Error: ")


def record(pyspy: str, targets: list[tuple[int, str]], seconds: int) -> list[str | None]:
    """Sample each (pid, svg) of `targets` at once for `seconds` (100 times a second, Python
    frames only, without pausing it) into a flame graph at `svg`, a path the agent alone
    writes (never one in the job's dirs). For each: None if it was written, else why not."""
    running: list[subprocess.Popen[bytes] | OSError] = []
    for pid, svg in targets:
        command = [pyspy, "record", "--pid", str(pid), "--duration", str(seconds)]
        command += ["--format", "flamegraph", "--output", svg, "--nonblocking"]
        try:
            running.append(
                subprocess.Popen(
                    command,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env={"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"},
                )
            )
        except OSError as e:
            running.append(e)
    said: list[str | None] = []
    for each in running:
        if isinstance(each, OSError):
            said.append(f"py-spy could not run: {each.strerror}")
            continue
        try:
            out, err = each.communicate(timeout=seconds + DUMP_TIMEOUT)
        except subprocess.TimeoutExpired:
            each.kill()
            out, err = each.communicate()
        text = (err or out).decode(errors="replace")
        said.append(None if each.returncode == 0 else _error_of(each.returncode, text))
    return said


def dump(pyspy: str, pid: int, native: bool = False) -> tuple[str | None, str | None]:
    """(py-spy's dump of the process's threads, None), or (None, why there is none). A job
    decides how long its dump is (its threads, their depth): past DUMP_BYTES it is cut,
    and says so, rather than read whole into the agent's memory."""
    command = [pyspy, "dump", "--pid", str(pid)]
    try:
        fd = os.open(pyspy, os.O_RDONLY)
    except OSError as e:
        return None, f"py-spy could not run: {e.strerror}"
    if native:
        command = [*_in_namespaces_of(pid, pyspy, fd), "--native"]
    try:
        answer = procs.ask(
            command,
            env={"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"},
            cap=DUMP_BYTES,
            seconds=DUMP_TIMEOUT,
            pass_fds=(fd,),
        )
    except OSError as e:
        return None, f"py-spy could not run: {e.strerror}"
    finally:
        os.close(fd)
    if answer.cut:
        whole_lines = answer.out[: answer.out.rfind("\n") + 1]
        return whole_lines + f"... (cut: the dump is longer than {DUMP_BYTES >> 20} MiB)\n", None
    if answer.stopped is not None:
        return None, f"py-spy did not answer within {DUMP_TIMEOUT:.0f}s"
    if answer.code == 0 and answer.out.strip():
        return answer.out, None
    return None, _error_of(answer.code, answer.out)
