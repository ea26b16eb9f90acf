"""Runs in the agent: starts each job's process group under a shim and records how it ended.

The agent never runs user code itself. For each job it copies the work dir out of the blob
store, sets the environment contract, and starts `shim.py` in a new session with stdout and
stderr going straight to the job's log file. A thread waits on the shim; when it exits, the
supervisor reads the status the shim wrote, sweeps what is left of the process group, and
records the outcome in words a user can act on.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhop.agent import procs
from gpuhop.agent.commands import StartError, resolve_command
from gpuhop.agent.jobs import jobdeps
from gpuhop.agent.jobs.store import JobRecord, JobStore
from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.usage import disk_note
from gpuhop.api import JobState, ManifestEntry
from gpuhop.home import AgentPaths, JobPaths
from gpuhop.runtime import hook

if TYPE_CHECKING:
    from gpuhop.backends import ScaleOut

log = logging.getLogger("gpuhop.agent")

SHIM = str(Path(__file__).with_name("shim.py"))
# Variables the agent's own environment must not hand to a job.
SCRUBBED_ENV = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "GPUHOP_HOME", "GPUHOP_REMOTE")
# In a job's dir: why the agent stopped it (see `Supervisor.stop`).
STOPPED = "stopped.json"


@functools.cache
def _has_tf_keras(python: str) -> bool:
    """Whether the job's interpreter can import tf_keras (checked once, without importing)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('tf_keras') is None)"
    try:
        return subprocess.run([python, "-c", probe], timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def job_environment(
    job: JobRecord, jp: JobPaths, base: dict[str, str] | None = None
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


class Supervisor:
    def __init__(
        self,
        paths: AgentPaths,
        store: JobStore,
        blobs: BlobStore,
        on_change: Callable[[], None],
        python: str = sys.executable,
        scale_out: ScaleOut | None = None,
    ):
        self.paths = paths
        # Where jobs run when not on this host (gpuhop.backends); None: here, under the shim.
        self.scale_out = scale_out
        self.store = store
        self.blobs = blobs
        self.on_change = on_change
        self.python = python
        self._lock = threading.Lock()
        self._killed_after_grace: set[str] = set()

    def job_paths(self, job_id: str) -> JobPaths:
        return JobPaths(self.paths.job_dir(job_id))

    # -- starting -------------------------------------------------------------------------

    def launch(self, job_id: str) -> None:
        """Start a job that the scheduler moved to `starting`. Runs in a worker thread."""
        job = self.store.get(job_id)
        jp = self.job_paths(job_id)
        try:
            self._materialise(jp)
            env = job_environment(job, jp)
            deps = jobdeps.read(jp)
            if self.scale_out is not None:
                program, env = self.scale_out.leader(job, jp, deps)
            else:
                program = self._shim_argv(job, jp, env, deps)
            with open(jp.log, "ab") as logfile:
                proc = subprocess.Popen(
                    program,
                    cwd=jp.work,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except (StartError, OSError) as e:
            reason = f"could not start: {e}{disk_note(jp.root, jp.log)}"
            log.warning("job %s %s", job_id, reason)
            self.store.transition(
                job_id, [JobState.starting], JobState.failed, reason=reason, ended_at=time.time()
            )
            self.on_change()
            return
        self.store.transition(
            job_id,
            [JobState.starting],
            JobState.running,
            pid=proc.pid,
            pid_start=procs.start_time(proc.pid),
            started_at=time.time(),
        )
        if self.store.get(job_id).cancel_requested:
            procs.signal_group(proc.pid, signal.SIGTERM)
        threading.Thread(
            target=self._wait_child, args=(job_id, proc), name=f"job-{job_id}", daemon=True
        ).start()
        self.on_change()

    def _shim_argv(
        self, job: JobRecord, jp: JobPaths, env: dict[str, str], deps: dict
    ) -> list[str]:
        python = jobdeps.python(deps, self.python)
        argv = resolve_command(job.command, jp.work, env.get("PATH", os.defpath), python)
        gang = self._write_gang(job, jp, env) if job.workers > 1 else []
        gang += jobdeps.shim_args(deps, jp, self.paths)
        if job.private_network or job.workers > 1:
            gang += ["--relay", str(jp.relay)]
        return [self.python, "-I", "-S", SHIM, str(jp.status), str(jp.shim_pid), *gang, "--", *argv]

    def _write_gang(self, job: JobRecord, jp: JobPaths, env: dict[str, str]) -> list[str]:
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

    def _materialise(self, jp: JobPaths) -> None:
        entries = (
            [ManifestEntry(**e) for e in json.loads(jp.tree.read_bytes())["entries"]]
            if jp.tree.exists()
            else []
        )
        for d in (jp.work, jp.artifacts, jp.checkpoints):
            d.mkdir(parents=True, exist_ok=True)
        # Every path is relative with no '..' (ManifestEntry checks it again here), and the
        # work dir is new, holding only what is made below: nothing can lead out of it.
        work = jp.work
        for parent in sorted({str(Path(e.path).parent) for e in entries}):
            (work / parent).mkdir(parents=True, exist_ok=True)
        # One after another: on a 2-core ext4 host, 8 copying threads took 5x longer.
        for entry in entries:
            self.blobs.copy_to(entry.digest, work / entry.path, entry.executable)

    # -- watching -------------------------------------------------------------------------

    def _wait_child(self, job_id: str, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self._finish(job_id, shim_returncode=proc.returncode)

    def _poll_adopted(self, job_id: str, pid: int, started: str | None) -> None:
        while procs.alive(pid, started):
            time.sleep(0.5)
        self._finish(job_id, shim_returncode=None)

    def _finish(self, job_id: str, shim_returncode: int | None) -> None:
        """Record a job's end from the shim's status file. Safe to call more than once."""
        job = self.store.get(job_id)
        jp = self.job_paths(job_id)
        if job.pid is not None:
            # Sweep what the job left in its process group (daemons, stuck workers).
            procs.signal_group(job.pid, signal.SIGKILL)
        # The shim removes its relay's socket, unless it was killed first.
        jp.relay.unlink(missing_ok=True)
        status = _read_json(jp.status)
        now = float(status["ended_at"]) if status and status.get("ended_at") else time.time()
        elapsed = procs.describe_duration(now - (job.started_at or now))
        exit_code = status.get("exit_code") if status else None
        sig = status.get("signal") if status else None
        stopped = _read_json(jp.root / STOPPED)
        if job.cancel_requested:
            state = JobState.cancelled
            how = " (killed after the grace period)" if job_id in self._killed_after_grace else ""
            reason = f"cancelled after {elapsed}{how}"
        elif stopped is not None:
            state = JobState.failed
            reason = f"{stopped.get('reason', 'stopped by the agent')} after {elapsed}"
        elif status is None and shim_returncode is not None and disk_note(jp.root, jp.log):
            # The shim ended (it is our child) but could not write the status on a full disk.
            state = JobState.failed
            reason = f"ended after {elapsed}; its exit status could not be written"
        elif status is None:
            state = JobState.lost
            shim = f" (its shim ended with {shim_returncode})" if shim_returncode else ""
            reason = f"the job's process vanished with no exit status{shim}"
        elif sig is not None:
            state = JobState.failed
            reason = f"{procs.describe_signal(sig)} after {elapsed}"
        elif exit_code == 0:
            state = JobState.succeeded
            reason = f"exited with code 0 after {elapsed}"
        else:
            state = JobState.failed
            reason = f"exited with code {exit_code} after {elapsed}"
        if status and status.get("detail"):
            reason = f"{status['detail']} after {elapsed}"
        if state in (JobState.failed, JobState.lost) and stopped is None:
            reason += disk_note(jp.root, jp.log)
        self._killed_after_grace.discard(job_id)
        outcome = {"exit_code": exit_code, "signal": sig, "reason": reason, "ended_at": now}
        if state in (JobState.failed, JobState.lost) and job.attempt <= job.retries and not stopped:
            self._retry(job, jp, state, outcome)
        else:
            self.store.transition(job_id, [JobState.starting, JobState.running], state, **outcome)
        self.on_change()

    def _retry(self, job: JobRecord, jp: JobPaths, state: JobState, outcome: dict) -> None:
        """Queue the job's next attempt: a fresh work dir, the same checkpoint dir."""
        with open(jp.log, "ab") as f:
            f.write(
                f"gpuhop: attempt {job.attempt} {state.value}: {outcome['reason']};"
                f" retrying (attempt {job.attempt + 1} of {job.retries + 1})\n".encode()
            )
        for leftover in (jp.status, jp.shim_pid):
            leftover.unlink(missing_ok=True)
        shutil.rmtree(jp.work, ignore_errors=True)
        # The files are ready before the job is queued: the scheduler may start it at once.
        self.store.retry(job, state, **outcome)

    def reattach(self) -> None:
        """After an agent (re)start: adopt jobs whose shims still run, settle the rest."""
        for job in self.store.list([JobState.starting, JobState.running]):
            jp = self.job_paths(job.id)
            pid, started = job.pid, job.pid_start
            if pid is None:
                shim = _read_json(jp.shim_pid)
                if shim is None:
                    # The shim never ran: the job never started, so it may start now.
                    self.store.transition(job.id, [JobState.starting], JobState.queued, gpu_ids=[])
                    continue
                pid, started = int(shim["pid"]), procs.start_time(int(shim["pid"]))
                self.store.transition(
                    job.id, [JobState.starting], JobState.running, pid=pid, pid_start=started
                )
            if procs.alive(pid, started):
                log.info("re-attached to job %s (pid %d)", job.id, pid)
                threading.Thread(
                    target=self._poll_adopted,
                    args=(job.id, pid, started),
                    name=f"job-{job.id}",
                    daemon=True,
                ).start()
            else:
                self._finish(job.id, shim_returncode=None)

    # -- cancelling -----------------------------------------------------------------------

    def cancel(self, job: JobRecord, grace: float) -> None:
        """Ask a started job to stop: SIGTERM to its group, SIGKILL after `grace` seconds."""
        self.store.update(job.id, cancel_requested=1)
        if job.pid is None:
            return  # still starting: launch() sees the flag once the process exists
        self._terminate(job, grace)

    def stop(self, job: JobRecord, reason: str, grace: float = 5.0) -> None:
        """Stop a running job for a reason of the agent's own (a cap it passed): the job
        fails with `reason` and is not retried. The reason is a file in the job's dir, so
        an agent restarted meanwhile still records it. Idempotent."""
        jp = self.job_paths(job.id)
        if job.pid is None or (jp.root / STOPPED).exists():
            return
        (jp.root / STOPPED).write_text(json.dumps({"reason": reason}))
        log.warning("job %s %s", job.id, reason)
        self._terminate(job, grace)

    def _terminate(self, job: JobRecord, grace: float) -> None:
        """SIGTERM to the job's group, SIGKILL after `grace` (plus the time a scale-out
        backend's leader needs to clean up after its own grace)."""
        assert job.pid is not None
        jp = self.job_paths(job.id)
        if self.scale_out is not None and self.scale_out.runs_here(jp):
            grace = self.scale_out.before_stop(jp, grace)
        procs.signal_group(job.pid, signal.SIGTERM)
        timer = threading.Timer(grace, self._kill_after_grace, args=(job.id, job.pid))
        timer.daemon = True
        timer.start()

    def _kill_after_grace(self, job_id: str, pgid: int) -> None:
        if self.store.get(job_id).state.finished:
            return
        self._killed_after_grace.add(job_id)
        procs.signal_group(pgid, signal.SIGKILL)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
