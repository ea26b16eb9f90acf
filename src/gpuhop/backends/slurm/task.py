"""Runs on a Slurm compute node, as the batch step of one gpuhop job: starts the job's
command in its work dir with its environment, passes SIGTERM on to it, and writes how it
ended to the exit file that the leader (gpuhop.backends.slurm.leader) reads.

`python -m gpuhop.backends.slurm.task SPEC`; SPEC is the JSON file the leader wrote on the
shared filesystem. Slurm sets CUDA_VISIBLE_DEVICES for the GPUs (GRES) it gave the job.
Each task gets a node-local scratch dir (gpuhop.backends.slurm.scratch: $GPUHOP_SCRATCH_DIR,
and $TMPDIR in it), removed once the job's command has ended.

In a multi-worker job it runs once per worker, as Slurm task SLURM_PROCID of the `srun` that
gpuhop.backends.slurm.gang started: the worker is told of its peers (TF_CONFIG, or Keras 3's
distribution variables, by the job's mode: gpuhop.backends.local.gangenv), it runs in its
own view of the job's files (gpuhop.backends.slurm.workerdirs: worker 0 in the job's), its
output goes to its own log and, each line prefixed with its index, to the job's, and it ends
in its own exit file, which the gang reads.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuhop.backends import clusterjob
from gpuhop.backends.base import QUIET_TF, StartError
from gpuhop.backends.local.commands import resolve_command
from gpuhop.backends.local.gangenv import worker_env
from gpuhop.backends.slurm import rendezvous, scratch, workerdirs
from gpuhop.runtime import hook

PEERS_VAR = "GPUHOP_SLURM_PEERS"  # what the gang tells each task: its peers' hosts and ports


def worker_exit_file(spec: dict[str, Any], index: int) -> Path:
    return Path(f"{spec['exit_file']}.worker-{index}")


def write_exit(path: Path, result: dict[str, Any]) -> None:
    clusterjob.write_atomic(path, result)


def environment(
    spec: dict[str, Any], index: int | None = None, made: scratch.Scratch | None = None
) -> dict[str, str]:
    """The node's environment (sbatch carried the leader's, Slurm added its own), then the
    job's variables, then gpuhop's contract (and worker `index`'s, in a multi-worker job),
    with the node-local scratch dir `made` as GPUHOP_SCRATCH_DIR and TMPDIR (a TMPDIR the
    job sets is its own)."""
    peers = os.environ.get(PEERS_VAR)
    dirs = workerdirs.of(spec, index)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHOP_")}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_TF)
    env.pop("TF_CONFIG", None)
    env.update({k: v for k, v in spec.get("mode_env", {}).items() if k not in spec["env"]})
    env.update(spec["env"])
    env.setdefault("GPUHOP_AUTO", "1")
    env.update(
        {
            "GPUHOP_JOB_ID": spec["job_id"],
            "GPUHOP_ATTEMPT": str(spec["attempt"]),
            "GPUHOP_RETRIES": str(spec["retries"]),
            "GPUHOP_ARTIFACTS_DIR": dirs.artifacts,
            "GPUHOP_CHECKPOINT_DIR": dirs.checkpoints,
            "GPUHOP_METRICS_FILE": dirs.metrics,
        }
    )
    if made is not None:
        env["GPUHOP_SCRATCH_DIR"] = str(made.scratch)
        if "TMPDIR" not in spec["env"]:
            env["TMPDIR"] = str(made.tmp)
    if not spec["gpus"]:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GRES asked: none of the node's GPUs
    if index is not None and peers is not None:
        hosts_ports = json.loads(peers)
        env.update(worker_env(spec["mode"], hosts_ports["ports"], index, hosts_ports["hosts"]))
        env["GPUHOP_WORKER_INDEX"] = str(index)
        env["GPUHOP_NUM_WORKERS"] = str(spec["workers"])
        env["GPUHOP_WORKER_TIMEOUT"] = str(spec["worker_timeout"])
    if hook.wanted(env):
        paths = (hook.STARTUP_DIR, env.get("PYTHONPATH"))
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def _tee(proc: subprocess.Popen[bytes], log: Path, index: int) -> None:
    """The worker's output to its own log, and each line, prefixed, to the job's."""
    assert proc.stdout is not None
    prefix = f"[worker {index}] ".encode()
    with open(log, "ab") as own:
        for line in iter(proc.stdout.readline, b""):
            own.write(line)
            own.flush()
            sys.stdout.buffer.write(prefix + line)
            sys.stdout.buffer.flush()


def run(spec: dict[str, Any]) -> dict[str, Any]:
    index = int(os.environ["SLURM_PROCID"]) if spec.get("workers", 1) > 1 else None
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # Slurm's name for it
    try:
        made = scratch.make(spec, index, host)
    except OSError as e:
        why = f"cannot make the job's scratch dir on {host}: {e}"
        print(f"gpuhop: could not start: {why}", flush=True)
        return {"exit_code": 1, "signal": None, "detail": f"could not start: {why}"}
    try:
        if made.note:
            print(f"gpuhop: {made.note}", flush=True)
        return _run(spec, index, host, made)
    finally:
        scratch.remove(made)


def _run(
    spec: dict[str, Any], index: int | None, host: str, made: scratch.Scratch
) -> dict[str, Any]:
    env = environment(spec, index, made)
    work = Path(workerdirs.of(spec, index).work)
    try:
        argv = resolve_command(
            spec["command"], work, env.get("PATH", os.defpath), spec["python"], where=host
        )
    except StartError as e:
        print(f"gpuhop: could not start: {e}", flush=True)
        return {"exit_code": 1, "signal": None, "detail": f"could not start: {e}"}
    gpus = env.get("CUDA_VISIBLE_DEVICES") or "none"
    who = "" if index is None else f"worker {index} "
    print(
        f"gpuhop: {who}running on {host} as Slurm job {os.environ.get('SLURM_JOB_ID', '?')},"
        f" GPUs: {gpus}, scratch {made.scratch}",
        flush=True,
    )
    if index is not None:
        port = json.loads(os.environ[PEERS_VAR])["ports"][index]
        if not rendezvous.bindable(port):
            # Taken since the gang chose it (free on every node a moment ago).
            why = f"worker {index}'s port {port} on {host} is in use; run the job again"
            print(f"gpuhop: could not start: {why}", flush=True)
            return {"exit_code": 1, "signal": None, "detail": f"could not start: {why}"}
    out, err = (None, None) if index is None else (subprocess.PIPE, subprocess.STDOUT)
    proc = subprocess.Popen(
        argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
    )

    def forward(sig: int, _frame: object) -> None:
        proc.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    if index is not None:
        _tee(proc, Path(spec["worker_logs"][index]), index)
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
    if spec.get("workers", 1) > 1:
        index = int(os.environ["SLURM_PROCID"])
        write_exit(worker_exit_file(spec, index), {**result, "ended_at": time.time()})
        failed = result["signal"] is not None or result["exit_code"] != 0
        return 1 if failed else 0  # srun --kill-on-bad-exit stops the others
    write_exit(Path(spec["exit_file"]), result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
