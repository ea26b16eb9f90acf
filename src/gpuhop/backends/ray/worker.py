"""Runs on a Ray node, inside a Ray actor: one worker of a gpuhop job.

The leader (gpuhop.backends.ray.leader) makes one such actor per worker in the job's
placement group. The actor unpacks the job's files into a private temp dir on its node,
starts the user's command there as a subprocess in its own session, with stdout and stderr
going to a node-local log file and the job's environment contract pointing at node-local
dirs, and answers the leader's polls with new log bytes, new metrics lines and, once the
process has ended and its log is drained, how it ended. The actor never runs user code in
its own process.

`check_here` is `gpuhop doctor`'s probe on a node, run as one Ray task rather than in a
worker: in the same environment a job's worker gives its job.

The subprocess is started through a small exec wrapper that asks the kernel to kill it
when the actor's process dies (PR_SET_PDEATHSIG), so a killed actor (`ray.kill`, a dead
leader whose actors Ray reaps) does not leave the job running on the node. The actor
runs its methods on its main thread (one at a time), the thread that forks, as the death
signal requires.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpuhop.backends.base import QUIET_TF
from gpuhop.backends.local.commands import resolve_command
from gpuhop.backends.ray import transfer
from gpuhop.runtime import hook
from gpuhop.version import __version__

# Variables of a Ray worker's environment that must not reach the job: Ray's own (among
# them the cluster's token, when the node was started with it in its environment), the
# thread cap Ray puts on its workers, and Ray's debugger hook.
_RAY_ONLY = ("OMP_NUM_THREADS", "TF_CONFIG", "CUDA_VISIBLE_DEVICES")

# argv: ACTOR_PID COMMAND...; dies with the actor, then becomes the command.
_EXEC_WRAPPER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"  # PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]): sys.exit(137)\n"  # the actor died already
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write(f'gpuhop: cannot start {sys.argv[2]!r}: {e.strerror}\\n')\n"
    "sys.exit(127)\n"
)


class JobWorker:
    """One worker of one attempt of a job, on whichever node Ray placed it."""

    def __init__(self, job_id: str, attempt: int, index: int):
        self.index = index
        self.root = Path(tempfile.mkdtemp(prefix=f"gpuhop-{job_id}-{attempt}-w{index}-"))
        self.work = self.root / "work"
        self.artifacts = self.root / "artifacts"
        self.checkpoints = self.root / "checkpoints"
        self.metrics = self.root / "metrics.jsonl"
        self.log = self.root / "output.log"
        for d in (self.work, self.artifacts, self.checkpoints):
            d.mkdir()
        self.log.touch()
        self.metrics.touch()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_offset = 0
        self.metrics_offset = 0

    def hello(self) -> dict[str, Any]:
        """Where this worker is: node, address, GPUs Ray gave it, a free port for TF."""
        import ray

        context = ray.get_runtime_context()
        with socket.socket() as s:
            # TensorFlow binds the port itself later; another program could take it in
            # between, and the worker then fails at once ("Could not start gRPC server").
            s.bind(("", 0))
            port = s.getsockname()[1]
        return {
            "node_id": context.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname(),
            "gpus": [str(g) for g in context.get_accelerator_ids().get("GPU", [])],
            "port": port,
            "version": __version__,
            "python": sys.executable,
        }

    def start(self, files: bytes, checkpoints: bytes, spec: dict[str, Any]) -> str | None:
        """Unpack the job and start its command. Returns why it could not start, or None."""
        try:
            transfer.unpack(files, self.work)
            transfer.unpack(checkpoints, self.checkpoints)
        except (OSError, ValueError) as e:  # tarfile's errors are ValueErrors or OSErrors
            return f"cannot unpack the job's files on {socket.gethostname()}: {e}"
        env, note = self._environment(spec)
        try:
            argv = resolve_command(
                spec["command"],
                self.work,
                env.get("PATH", os.defpath),
                spec.get("python") or sys.executable,  # a script runs with Ray's Python
                where=socket.gethostname(),
            )
        except ValueError as e:
            return str(e)
        with open(self.log, "ab") as log:
            log.write(note.encode())
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _EXEC_WRAPPER, str(os.getpid()), *argv],
                    cwd=self.work,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as e:
                return f"cannot start the job on {socket.gethostname()}: {e}"
        return None

    def _environment(self, spec: dict[str, Any]) -> tuple[dict[str, str], str]:
        """The node's environment without Ray's own variables, the job's, then the contract;
        and a note for the log about it, or ""."""
        note = ""
        env = node_environment()
        env.update(spec["env"])
        env.setdefault("GPUHOP_AUTO", "1")
        env.update(
            {
                "GPUHOP_JOB_ID": spec["job_id"],
                "GPUHOP_ATTEMPT": str(spec["attempt"]),
                "GPUHOP_RETRIES": str(spec.get("retries", 0)),
                "GPUHOP_ARTIFACTS_DIR": str(self.artifacts),
                "GPUHOP_CHECKPOINT_DIR": str(self.checkpoints),
                "GPUHOP_METRICS_FILE": str(self.metrics),
                "CUDA_VISIBLE_DEVICES": ",".join(spec["gpus"]),
            }
        )
        if spec["workers"] > 1:
            env["GPUHOP_NUM_WORKERS"] = str(spec["workers"])
            env["GPUHOP_WORKER_TIMEOUT"] = str(spec["worker_timeout"])
            env["GPUHOP_WORKER_INDEX"] = str(self.index)
            env["TF_CONFIG"] = spec["tf_config"]
            if "TF_USE_LEGACY_KERAS" not in spec["env"]:
                if importlib.util.find_spec("tf_keras") is not None:
                    # Keras 3's fit fails under MultiWorkerMirroredStrategy (keras#20585).
                    env["TF_USE_LEGACY_KERAS"] = "1"
                else:
                    note = (
                        f"gpuhop: tf-keras is not installed on {socket.gethostname()}, so Keras 3"
                        " runs this job; its model.fit does not work under"
                        " MultiWorkerMirroredStrategy (keras-team/keras#20585). Use a custom"
                        " training loop, or `pip install tf-keras` on every Ray node.\n"
                    )
        if hook.wanted(env):
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (hook.STARTUP_DIR, env.get("PYTHONPATH")) if p
            )
        return env, note

    def poll(self, limit: int) -> dict[str, Any]:
        """New log bytes (up to `limit`), new whole metrics lines, and the end once the
        process has exited and its log has been read to the end."""
        code = None if self.proc is None else self.proc.poll()
        log = _read(self.log, self.log_offset, limit)
        self.log_offset += len(log)
        metrics = _read(self.metrics, self.metrics_offset, limit)
        metrics = metrics[: metrics.rfind(b"\n") + 1]
        self.metrics_offset += len(metrics)
        end = None
        if code is not None and self.log_offset >= self.log.stat().st_size:
            if code < 0:
                end = {"exit_code": None, "signal": -code}
            else:
                end = {"exit_code": code, "signal": None}
        return {"log": log, "metrics": metrics, "end": end}

    def signal(self, sig: int) -> None:
        """Send `sig` to the job's process group on this node."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def collect(self) -> dict[str, bytes]:
        """What comes back to the agent's host: artifacts and checkpoints (worker 0's)."""
        return {
            "artifacts": transfer.pack(self.artifacts),
            "checkpoints": transfer.pack(self.checkpoints),
        }

    def close(self) -> None:
        """Kill what is left of the job on this node and remove its files here."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def node_environment() -> dict[str, str]:
    """This node's environment as every job on it starts from: without Ray's own
    variables, with gpuhop's defaults (before the job's own variables and the GPUs)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "GPUHOP_"))
        and k not in _RAY_ONLY
        and not (k == "PYTHONBREAKPOINT" and v.startswith("ray."))
    }
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_TF)
    return env


def check_here(argv: list[str], agent: dict[str, str], limit: float) -> dict[str, Any]:
    """Run `gpuhop doctor`'s probe (`argv`, as the agent's host names it) on this node, as
    one Ray task (gpuhop.backends.ray.doctor), in the environment a job's worker gets here:
    with the GPUs Ray gave the task, and for at most `limit` seconds. Its output and exit
    code, as {"stdout", "stderr", "code"}.

    The agent's paths mean nothing here: its Python (`agent["python"]`) becomes the one
    Ray's workers run, which a job's script runs with on this node, and a file of the
    agent's gpuhop (`agent["package"]`) becomes this node's copy of it."""
    import ray

    context = ray.get_runtime_context()
    where = (
        f"{socket.gethostname()} ({ray.util.get_node_ip_address()},"
        f" Ray node {context.get_node_id()[:8]})"
    )
    argv = [_on_this_node(a, agent) for a in argv]
    env = node_environment()
    env["CUDA_VISIBLE_DEVICES"] = ",".join(
        str(g) for g in context.get_accelerator_ids().get("GPU", [])
    )
    env["GPUHOP_PROBE_NODE"] = where  # the probe says where it ran
    with tempfile.TemporaryDirectory(prefix="gpuhop-doctor-") as cwd:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-S", "-c", _EXEC_WRAPPER, str(os.getpid()), *argv],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=limit,
            )
        except subprocess.TimeoutExpired:
            why = f"the check did not finish in {limit:.0f}s on {where}"
            return {"stdout": "", "stderr": why, "code": 124}
        except OSError as e:
            return {"stdout": "", "stderr": f"cannot run the check on {where}: {e}", "code": 127}
    return {"stdout": done.stdout, "stderr": done.stderr, "code": done.returncode}


def _on_this_node(arg: str, agent: dict[str, str]) -> str:
    """An argument naming the agent's Python or a file of its gpuhop, as this node has it."""
    if arg == agent["python"]:
        return sys.executable
    if arg.startswith(agent["package"] + os.sep):
        return str(Path(__file__).parents[2]) + arg[len(agent["package"]) :]
    return arg


def _read(path: Path, offset: int, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except FileNotFoundError:
        return b""
