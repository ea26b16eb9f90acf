"""Runs in the agent: the local backend, which runs each job's attempt on the agent's own
host under a shim (`shim.py` beside this file) that leads its process group.

Sets the job's environment contract, describes a multi-worker job's gang and what the job
needs besides its files (its Python environment, its read-only datasets) for the shim, and
starts the shim in a new session with stdout and stderr going straight to the job's log
(gpuhop.backends.leader). The shim imports the standard library only and writes the
attempt's end to the job's status file, so a restarted agent still learns how it ended.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from gpuhop.api import SubmitRequest
from gpuhop.backends.base import SCRUBBED_ENV, GpuHost, JobAttempt
from gpuhop.backends.jobdeps import python as job_python
from gpuhop.backends.leader import LeaderBackend, read_json
from gpuhop.backends.local.commands import resolve_command
from gpuhop.backends.local.sandbox import HOW_TO_ALLOW
from gpuhop.backends.procs import alive
from gpuhop.home import AgentPaths, JobPaths
from gpuhop.runtime import hook

SHIM = str(Path(__file__).with_name("shim.py"))
SANDBOX = str(Path(__file__).with_name("sandbox.py"))
WORKVIEW = str(Path(__file__).with_name("workview.py"))


@functools.cache
def _has_tf_keras(python: str) -> bool:
    """Whether the job's interpreter can import tf_keras (checked once, without importing)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('tf_keras') is None)"
    try:
        return subprocess.run([python, "-c", probe], timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def job_environment(
    job: JobAttempt, jp: JobPaths, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The job's environment: the host's, the job's own variables, then gpuhop's contract.

    When an after-`import tensorflow` action applies (see gpuhop.runtime.hook), the hook's
    start-up directory goes first on PYTHONPATH, before whatever PYTHONPATH the job has.
    """
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if k not in SCRUBBED_ENV and not k.startswith("GPUHOP_")
    }
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    # GPU indices are NVML's (PCI bus order); CUDA's default order may differ.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.update(job.env)
    env.update(
        {
            "GPUHOP_JOB_ID": job.id,
            "GPUHOP_ATTEMPT": str(job.attempt),
            "GPUHOP_ARTIFACTS_DIR": str(jp.artifacts),
            "GPUHOP_TENSORBOARD_DIR": str(jp.tensorboard),
            "GPUHOP_CHECKPOINT_DIR": str(jp.checkpoints),
            "GPUHOP_METRICS_FILE": str(jp.metrics),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in job.gpu_ids),
        }
    )
    if job.workers > 1:
        env["GPUHOP_NUM_WORKERS"] = str(job.workers)
        env["GPUHOP_WORKER_TIMEOUT"] = str(job.worker_timeout)
    if job.gpu_memory_mb is not None:
        env["GPUHOP_GPU_MEMORY_MB"] = str(job.gpu_memory_mb)
    if hook.wanted(env):
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (hook.STARTUP_DIR, env.get("PYTHONPATH")) if p
        )
    return env


def _probe(python: str, helper: str) -> str | None:
    """Run `helper --probe`: None if it passed, else why not."""
    try:
        probe = subprocess.run(
            [python, "-I", "-S", helper, "--probe"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"the probe {Path(helper).name} did not run ({e})"
    if probe.returncode == 0:
        return None
    why = probe.stderr.strip().splitlines()[-1:] or [f"exit code {probe.returncode}"]
    return why[0]


class LocalBackend(LeaderBackend):
    name = "local"

    def __init__(self, paths: AgentPaths, gpu_host: GpuHost, python: str):
        """`paths`: the agent's state dir, whose stored copies a sandboxed job must not
        write; `python` runs the shim, and a job's `.py` script unless it has its own."""
        super().__init__(gpu_host, python)
        self.paths = paths

    def describe(self) -> str:
        return f"running jobs on this host ({len(self.gpu_host.gpus)} GPU(s))"

    @functools.cached_property
    def _isolation(self) -> str | None:
        why = _probe(self.python, SANDBOX)
        return None if why is None else f"{why}; {HOW_TO_ALLOW}"

    def isolation(self) -> str | None:
        """None when every job runs in its own view of this host (sandbox.py); else why
        not, and what to allow. Asked of the host once."""
        return self._isolation

    @functools.cached_property
    def _work_view(self) -> str | None:
        if self.isolation() is not None:
            return "jobs run without a sandbox here, and the overlay lives in one"
        return _probe(self.python, WORKVIEW)

    def work_view(self) -> str | None:
        """None when each job sees its tree's checkout through an overlay of its own
        (workview.py); else why it gets a copy. Asked of the host once."""
        return self._work_view

    def check_submit(self, req: SubmitRequest) -> None:
        """Every kind of job runs here."""

    def end_the_rest(self, jp: JobPaths) -> None:
        """A sandboxed job's processes (`setsid` ones too) all live in its PID namespace,
        which ends with its first process, the shim's child: the kernel kills the rest and
        that process is gone only once they all are. So kill it and wait until it is gone.
        (A SIGKILL to the group can end the shim before its child has finished.)"""
        shim = read_json(jp.shim_pid) or {}
        init, init_start = shim.get("init"), shim.get("init_start")
        if not isinstance(init, int) or init_start is None:
            return  # not sandboxed, or unknown: never signal a pid we cannot vouch for
        while alive(init, str(init_start)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(init, signal.SIGKILL)
            time.sleep(0.02)

    def leader(
        self, job: JobAttempt, jp: JobPaths, deps: dict[str, Any]
    ) -> tuple[list[str], dict[str, str]]:
        env = job_environment(job, jp)
        python = job_python(deps, self.python)
        # What the job will see in its work dir: its checkout, under what the agent put there.
        files = jp.work if (jp.work / job.command[0]).exists() else deps.get("checkout", jp.work)
        argv = resolve_command(job.command, Path(files), env.get("PATH", os.defpath), python)
        if argv[0].startswith(f"{files}/"):  # a program in the checkout: run it from the view
            argv[0] = f"{jp.work}{argv[0][len(str(files)) :]}"
        gang = self._write_gang(job, jp, env) if job.workers > 1 else []
        gang += self._shim_args(deps, jp, job.workers)
        if job.private_network or job.workers > 1:
            gang += ["--relay", str(jp.relay)]
        shim = [self.python, "-I", "-S", SHIM, str(jp.status), str(jp.shim_pid)]
        return [*shim, *gang, "--", *argv], env

    def _write_gang(self, job: JobAttempt, jp: JobPaths, env: dict[str, str]) -> list[str]:
        """Describe a multi-worker job's workers for the shim; return the shim's arguments.

        Each worker gets its slice of the job's GPUs and its own log; the shim adds each
        worker's TF_CONFIG once it has the ports of the job's private network.
        """
        per = len(job.gpu_ids) // job.workers
        workers = []
        for i in range(job.workers):
            gpus = job.gpu_ids[i * per : (i + 1) * per]
            workers.append(
                {
                    "env": {
                        "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
                        "GPUHOP_WORKER_INDEX": str(i),
                    },
                    "log": str(jp.worker_log(i)),
                }
            )
        spec = {"workers": workers, "grace": 10, "timeout": job.worker_timeout}
        jp.gang.write_text(json.dumps(spec))
        if "TF_USE_LEGACY_KERAS" not in job.env:
            if _has_tf_keras(self.python):
                # Keras 3's fit fails under MultiWorkerMirroredStrategy (keras#20585).
                env["TF_USE_LEGACY_KERAS"] = "1"
            else:
                with open(jp.log, "ab") as f:
                    f.write(
                        b"gpuhop: tf-keras is not installed on this host, so Keras 3 runs this"
                        b" job; its model.fit does not work under MultiWorkerMirroredStrategy"
                        b" (keras-team/keras#20585). Use a custom training loop, or"
                        b" `pip install tf-keras` on the host.\n"
                    )
        return ["--gang", str(jp.gang)]

    def _shim_args(self, deps: dict[str, Any], jp: JobPaths, workers: int) -> list[str]:
        """The shim's `--env` and `--sandbox` arguments for these deps; makes the datasets'
        mount points. Every job gets a sandbox where this host allows one; a job with
        datasets gets one anyway (and fails, saying why, where the host allows none)."""
        args: list[str] = []
        if deps.get("env"):
            spec = dict(deps["env"], requirements=str(jp.root / "requirements.txt"))
            (jp.root / "env.json").write_text(json.dumps(spec))
            args += ["--env", str(jp.root / "env.json")]
        if self.isolation() is not None and not deps.get("data"):
            return args  # a single-user agent's choice; see gpuhop doctor
        binds = []
        for mount in deps.get("data", []):
            target = jp.work / mount["mount"]
            target.mkdir(parents=True, exist_ok=True)
            binds.append({"source": mount["source"], "target": str(target)})
        spec = {
            "home": str(self.paths.home),
            "work": str(jp.work),
            "lower": deps.get("checkout"),
            "keep": self._view(deps, jp, workers),
            "binds": binds,
        }
        (jp.root / "sandbox.json").write_text(json.dumps(spec))
        return [*args, "--sandbox", str(jp.root / "sandbox.json")]

    def _view(self, deps: dict[str, Any], jp: JobPaths, workers: int) -> list[dict[str, Any]]:
        """What the job sees of the state dir: its own files (made here if missing, so
        that each can be bound), its environment and what else it may read."""
        for d in (jp.work, jp.artifacts, jp.checkpoints):
            d.mkdir(parents=True, exist_ok=True)
        logs = [jp.worker_log(i) for i in range(workers)] if workers > 1 else []
        files = [jp.log, jp.metrics, *logs]
        for f in files:
            f.touch()
        keep: list[dict[str, Any]] = [
            {"path": str(p)} for p in (jp.work, jp.artifacts, jp.checkpoints, *files)
        ]
        readable = [*deps.get("readonly", [])]
        if deps.get("env"):
            readable.append(deps["env"]["dir"])
        # gpuhop's own Python, when it lives in the state dir (`remote bootstrap` puts its
        # venv there): the job's interpreter and its start-up hook come from it.
        install = Path(self.python).parent.parent
        if install.is_relative_to(self.paths.home):
            readable.append(str(install))
        return keep + [{"path": p, "readonly": True} for p in readable]
