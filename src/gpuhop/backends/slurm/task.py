"""Runs on a Slurm compute node, as the batch step of one gpuhop job: starts the job's
command in its work dir with its environment, passes SIGTERM on to it, and writes how it
ended to the exit file that the leader (gpuhop.backends.slurm.leader) reads.

`python -m gpuhop.backends.slurm.task SPEC`; SPEC is the JSON file the leader wrote on the
shared filesystem. Slurm sets CUDA_VISIBLE_DEVICES for the GPUs (GRES) it gave the job.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuhop.backends.base import QUIET_TF, StartError
from gpuhop.backends.local.commands import resolve_command
from gpuhop.runtime import hook


def environment(spec: dict[str, Any]) -> dict[str, str]:
    """The node's environment (sbatch carried the leader's, Slurm added its own), then the
    job's variables, then gpuhop's contract."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHOP_")}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_TF)
    env.pop("TF_CONFIG", None)
    env.update(spec["env"])
    env.setdefault("GPUHOP_AUTO", "1")
    env.update(
        {
            "GPUHOP_JOB_ID": spec["job_id"],
            "GPUHOP_ATTEMPT": str(spec["attempt"]),
            "GPUHOP_RETRIES": str(spec["retries"]),
            "GPUHOP_ARTIFACTS_DIR": spec["artifacts"],
            "GPUHOP_CHECKPOINT_DIR": spec["checkpoints"],
            "GPUHOP_METRICS_FILE": spec["metrics"],
        }
    )
    if not spec["gpus"]:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GRES asked: none of the node's GPUs
    if hook.wanted(env):
        paths = (hook.STARTUP_DIR, env.get("PYTHONPATH"))
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def run(spec: dict[str, Any]) -> dict[str, Any]:
    env = environment(spec)
    work = Path(spec["work"])
    host = socket.gethostname()
    try:
        argv = resolve_command(
            spec["command"], work, env.get("PATH", os.defpath), spec["python"], where=host
        )
    except StartError as e:
        print(f"gpuhop: could not start: {e}", flush=True)
        return {"exit_code": 1, "signal": None, "detail": f"could not start: {e}"}
    gpus = env.get("CUDA_VISIBLE_DEVICES") or "none"
    print(
        f"gpuhop: running on {host} as Slurm job {os.environ.get('SLURM_JOB_ID', '?')},"
        f" GPUs: {gpus}",
        flush=True,
    )
    proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL)

    def forward(sig: int, _frame: object) -> None:
        proc.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = proc.wait()
    if code < 0:
        return {"exit_code": None, "signal": -code}
    return {"exit_code": code, "signal": None}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpuhop.backends.slurm.task SPEC", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    result = run(spec)
    tmp = f"{spec['exit_file']}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, spec["exit_file"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
