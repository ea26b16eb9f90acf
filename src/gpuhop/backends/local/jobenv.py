"""Runs in the agent: a local job's environment, the contract every job gets (gpuhop's
variables, the GPUs it holds, its share of one, the start-up hook on its path) over the
host's variables a job may see and the job's own."""

from __future__ import annotations

import os

from gpuhop.backends.base import QUIET_TF, SCRUBBED_ENV, Attempt, allowed_for_jobs
from gpuhop.home import JobPaths
from gpuhop.runtime import hook


def job_environment(
    attempt: Attempt,
    jp: JobPaths,
    base: dict[str, str] | None = None,
    gpu_total_mb: int | None = None,
    passed: tuple[str, ...] | None = None,
) -> dict[str, str]:
    """The job's environment: the host's, the job's own variables, then gpuhop's contract.

    With `passed` (a team agent's job) only the host's variables that `allowed_for_jobs`
    lets through, and those named in `passed`, are taken: the agent's own credentials and
    settings never reach another user's job.

    Defaults the job may override: TensorFlow's C++ start-up chatter quieted (INFO and
    WARNING lines, such as the oneDNN notice; errors still show), and gpuhop's Keras
    callbacks added to every `fit` (`GPUHOP_AUTO=1`, see gpuhop.runtime.hook). A share job
    (`gpu_memory_mb` of a GPU of `gpu_total_mb`) also gets that share as a fraction, for
    JAX's allocator (XLA_PYTHON_CLIENT_MEM_FRACTION) and PyTorch's (the hook).

    When an after-import action applies (see gpuhop.runtime.hook), the hook's start-up
    directory goes first on PYTHONPATH, before whatever PYTHONPATH the job has.
    """
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if k not in SCRUBBED_ENV
        and not k.startswith("GPUHOP_")
        and (passed is None or allowed_for_jobs(k, passed))
    }
    # The job starts in its work dir: a shell's PWD (and OLDPWD) from wherever the agent was
    # started (the first `gpuhop` command's project dir) would name another dir as its own.
    env.pop("OLDPWD", None)
    env["PWD"] = str(jp.work)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_TF)
    # GPU indices are NVML's (PCI bus order); CUDA's default order may differ.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if attempt.spec.gpu_memory_mb is not None and gpu_total_mb:
        fraction = f"{min(1.0, attempt.spec.gpu_memory_mb / gpu_total_mb):.4f}"
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fraction
        env["GPUHOP_GPU_MEMORY_FRACTION"] = fraction
    env.update(attempt.spec.env)
    env.setdefault("GPUHOP_AUTO", "1")
    env.update(
        {
            "GPUHOP_JOB_ID": attempt.job_id,
            "GPUHOP_ATTEMPT": str(attempt.number),
            "GPUHOP_RETRIES": str(attempt.spec.retries),
            "GPUHOP_ARTIFACTS_DIR": str(jp.artifacts),
            "GPUHOP_TENSORBOARD_DIR": str(jp.tensorboard),
            "GPUHOP_CHECKPOINT_DIR": str(jp.checkpoints),
            "GPUHOP_METRICS_FILE": str(jp.metrics),
            # The job's first Python process writes what it ran on there (runtime/provenance).
            "GPUHOP_PROVENANCE_FILE": str(jp.provenance),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in attempt.gpu_ids),
        }
    )
    if env["GPUHOP_AUTO"] != "0":
        # `gpuhop profile`'s requests reach the job's TensorFlow and JAX processes there
        # (runtime/profiling). A `--no-auto` job is left alone: py-spy samples it instead.
        env["GPUHOP_CONTROL_DIR"] = str(jp.control)
    if attempt.spec.workers > 1:
        env["GPUHOP_NUM_WORKERS"] = str(attempt.spec.workers)
        env["GPUHOP_WORKER_TIMEOUT"] = str(attempt.spec.worker_timeout)
    if attempt.spec.gpu_memory_mb is not None:
        env["GPUHOP_GPU_MEMORY_MB"] = str(attempt.spec.gpu_memory_mb)
    # The start-up dir (where the record of what the job ran on is written from, too).
    if hook.wanted(env):
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (hook.STARTUP_DIR, env.get("PYTHONPATH")) if p
        )
    return env
