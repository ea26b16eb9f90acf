"""Runs on the agent's host as the leader of one attempt of a job on Slurm: submits it with
`sbatch`, follows it with `squeue`, cancels it with `scancel`, and records how it ended.

The Slurm backend starts it as the local backend starts its own leader, with the same contract
(gpuhop.backends.leader): `python -m gpuhop.backends.slurm.leader STATUS PID_FILE SPEC`, in
a new session, with stdout and stderr going to the job's log (Slurm appends the job's own
output there). It writes its pid first, the Slurm job id beside the spec once `sbatch`
took the job (so whatever is left of it can be cancelled by id, even if this process is
killed), Slurm's pending reason beside it while the job waits, and the attempt's end last.

The batch step (gpuhop.backends.slurm.task) writes the job's exit status to a file on the
shared filesystem: with accounting storage off, Slurm itself keeps no exit code once the
job has left `squeue`. A job that Slurm ended for a node failure is `lost`; one its time
limit ended is `timeout`. SIGTERM (cancel): `scancel --signal=TERM` to the job's processes,
then SIGKILL after the grace the agent wrote beside the spec (a pending job: at once).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuhop.backends import clusterjob
from gpuhop.backends.ownlines import append_line

POLL_SECONDS = 1.0
COMMAND_TIMEOUT = 60.0
EXIT_FILE_WAIT = 10.0  # seconds for the batch step's exit file to show on this host
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED"}  # fmt: skip
LOST = {"NODE_FAIL", "BOOT_FAIL"}

_stop = threading.Event()


def say(text: str) -> None:
    # On a line of its own: the job's output, which Slurm appends to the same log, may have
    # stopped mid-line.
    sys.stdout.flush()
    append_line(sys.stdout.fileno(), f"gpuhop: {text}")


def slurm(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)


def cancel(*argv: str) -> None:
    """`scancel ARGV`; a failure is said in the log (the agent cancels by id again once
    this leader has ended)."""
    try:
        out = slurm("scancel", *argv)
    except (OSError, subprocess.SubprocessError) as e:
        say(f"scancel failed: {e}")
        return
    if out.returncode != 0:
        say(f"scancel failed: {out.stderr.strip()}")


def sbatch_args(spec: dict[str, Any], script: Path) -> list[str]:
    args = ["sbatch", "--parsable", f"--job-name=gpuhop-{spec['job_id']}"]
    args += [f"--output={spec['log']}", "--open-mode=append", f"--chdir={spec['work']}"]
    # --no-requeue: a job whose node fails is not run again by Slurm behind the agent's back
    # (gpuhop's own --retries decide that, on a fresh attempt).
    args += ["--export=ALL", "--no-requeue"]
    workers = spec.get("workers", 1)
    if workers > 1:
        # One task per worker, one per node unless packed (then as few nodes as fit them).
        args.append(f"--ntasks={workers}")
        if not spec.get("pack"):
            args += [f"--nodes={workers}", "--ntasks-per-node=1"]
        if spec["gpus"]:
            args.append(f"--gpus-per-task={spec['gpus'] // workers}")
    else:
        args += ["--nodes=1", "--ntasks=1"]
        if spec["gpus"]:
            args.append(f"--gres=gpu:{spec['gpus']}")
    if spec.get("timeout"):
        args.append(f"--time={max(1, math.ceil(spec['timeout'] / 60))}")
    for option in ("partition", "account", "qos"):
        if spec.get(option):
            args.append(f"--{option}={spec[option]}")
    return [*args, str(script)]


def state(slurm_id: str) -> tuple[str, str] | None:
    """The job's state and reason as squeue shows them; None once it has left squeue.
    Raises OSError (or SubprocessError) when squeue cannot answer."""
    out = slurm("squeue", "-h", "-t", "all", "-j", slurm_id, "-o", "%T|%r")
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            return None
        raise OSError(out.stderr.strip() or f"squeue exited with {out.returncode}")
    line = out.stdout.strip()
    if not line:
        return None
    st, _, reason = line.splitlines()[0].partition("|")
    return st.strip(), reason.strip()


class Follow:
    """One submitted Slurm job, followed until it has ended."""

    def __init__(self, spec: dict[str, Any], root: Path):
        self.spec = spec
        self.root = root
        self.id = ""

    def submit(self) -> dict[str, Any] | None:
        script = self.root / "slurm-batch.sh"
        step = "gang" if self.spec.get("workers", 1) > 1 else "task"
        script.write_text(
            "#!/bin/sh\n"
            f"exec {shlex.quote(self.spec['python'])} -m gpuhop.backends.slurm.{step}"
            f" {shlex.quote(str(self.root / 'slurm-task.json'))}\n"
        )
        clusterjob.write_atomic(self.root / "slurm-task.json", self.spec)
        try:
            out = slurm(*sbatch_args(self.spec, script))
        except (OSError, subprocess.SubprocessError) as e:
            return _start_failure(f"sbatch failed: {e}")
        if out.returncode != 0:
            return _start_failure(f"Slurm refused the job: {out.stderr.strip()}")
        self.id = out.stdout.strip().split(";")[0]
        clusterjob.write(self.root, self.id, f"Slurm job {self.id}")
        say(f"submitted as Slurm job {self.id}")
        return None

    def follow(self) -> tuple[str, bool]:
        """Poll until the job has ended; its last state, and whether it ever ran."""
        last, ran, kill_at, stopping, unreachable = "", False, None, False, False
        while True:
            if _stop.is_set() and not stopping:
                stopping = True
                if ran:
                    cancel("--full", "--signal=TERM", self.id)
                    kill_at = time.monotonic() + self._grace()
                else:
                    cancel(self.id)
            if kill_at is not None and time.monotonic() > kill_at:
                cancel("--full", "--signal=KILL", self.id)
                cancel(self.id)
                kill_at = None
            try:
                now = state(self.id)
                unreachable = False
            except (OSError, subprocess.SubprocessError) as e:
                if not unreachable:
                    say(f"squeue does not answer ({e}); still trying")
                unreachable = True
                _stop.wait(POLL_SECONDS)
                continue
            if now is None:
                break
            last, reason = now
            if last == "PENDING":
                # "None": Slurm's scheduler has not looked at the job yet.
                why = f": {reason}" if reason and reason != "None" else ""
                clusterjob.hold(self.root, f"Slurm job {self.id} is pending{why}")
            else:
                clusterjob.released(self.root)
                if not ran and last not in ("PENDING", "CANCELLED"):
                    ran = True
                    # From now on the job's --timeout runs (the agent's TimeLimits reads it).
                    clusterjob.runs(self.root)
            if last in ENDED:
                break
            _stop.wait(POLL_SECONDS)
        clusterjob.released(self.root)
        return last, ran

    def _grace(self) -> float:
        try:
            return float((self.root / "grace").read_text())
        except (OSError, ValueError):
            return 10.0

    def ending(self, last: str, ran: bool) -> dict[str, Any]:
        exit_file = Path(self.spec["exit_file"])
        if last in LOST:
            return {"lost": f"Slurm job {self.id} was lost: its node failed ({last})"}
        deadline = time.monotonic() + (EXIT_FILE_WAIT if ran or not _stop.is_set() else 0)
        while not exit_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            result: dict[str, Any] = json.loads(exit_file.read_text())
        except (OSError, ValueError):
            if _stop.is_set():
                return {"exit_code": None, "signal": signal.SIGTERM}
            ended = last or "gone from squeue"
            return {"lost": f"Slurm job {self.id} ended ({ended}) with no exit status"}
        if last == "TIMEOUT":
            result["end_class"] = "timeout"
            result["detail"] = f"Slurm's time limit ended it (Slurm job {self.id}, TIMEOUT)"
        return result


def _start_failure(why: str) -> dict[str, Any]:
    say(f"could not start: {why}")
    return {"exit_code": 1, "signal": None, "detail": f"could not start: {why}"}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m gpuhop.backends.slurm.leader STATUS PID_FILE SPEC", file=sys.stderr)
        return 2
    status_path, pid_path, spec_path = (Path(a) for a in argv)
    clusterjob.write_atomic(pid_path, {"pid": os.getpid()})
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: _stop.set())
    spec = json.loads(spec_path.read_text())
    job = Follow(spec, spec_path.parent)
    try:
        result = job.submit()
        if result is None:
            result = job.ending(*job.follow())
    except Exception as e:
        result = {"exit_code": 1, "signal": None, "detail": f"the Slurm backend failed: {e}"}
    result["ended_at"] = time.time()
    clusterjob.write_atomic(status_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
