"""Runs in the agent: checks that Slurm's compute nodes see the agent's jobs dir, where every
job's work dir, log, metrics, artifacts and checkpoints live (the nodes read the job's files
and write its output there).

The check is one tiny `srun` on a node of the partition (any node Slurm picks), run when the
agent starts: the agent writes a fresh random nonce into the jobs dir, the task reads it back
(printing it) and writes it again into a reply file, which the agent reads. Only a node that
sees the same files in both directions gives back the same nonce. The task also says whether
the agent's Python (which runs every job's steps there) exists on the node. A node that
cannot see the files, or lacks the Python, refuses the agent's start with what is missing; a
probe Slurm does not run at once (the partition is busy) decides nothing, and the agent
starts with a warning.

A check that passed is kept in the state dir (`CHECK_NAME`) for `CACHE_SECONDS`, so that an
agent restarted meanwhile (to re-attach to its jobs) does not wait for Slurm again, and for
`gpuhop doctor`, which says where the files are and which node saw them.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpuhop.home import AgentError

CHECK_NAME = "slurm-shared.json"
CACHE_SECONDS = 24 * 3600.0
PROBE_SECONDS = 20  # how long Slurm may take to start the probe (srun --immediate)
COMMAND_TIMEOUT = 60.0
MARK = "gpuhop-probe-node "
PYTHON_OK = "gpuhop-probe-python"
# Prints the node's name, then the nonce it reads, and writes it back beside it; then
# whether the agent's Python is there.
PROBE = (
    'printf "%s%s\\n" "$0" "$SLURMD_NODENAME" && cat -- "$1" && echo && cat -- "$1" > "$2"'
    f' && if [ -x "$3" ]; then echo {PYTHON_OK}; fi'
)


@dataclass(frozen=True)
class SharedCheck:
    """What the agent knows of its jobs dir on the nodes: `ok` True (a node saw it), or None
    (not checked: `detail` says why)."""

    ok: bool | None
    detail: str


def check(jobs: Path, home: Path, scope: list[str], python: str) -> SharedCheck:
    """Check that a node of the partition (srun options `scope`: --partition, --account,
    --qos) sees `jobs` and has `python`, or reuse a recent pass. Raises AgentError when a
    node does not."""
    key: dict[str, object] = {
        "dir": str(jobs),
        "scope": scope,
        "conf": os.environ.get("SLURM_CONF"),
        "python": python,
    }
    kept = _kept(home / CHECK_NAME, key)
    if kept is not None:
        return kept
    result = probe(jobs, scope, python)
    if result.ok:
        data = {**key, "detail": result.detail, "at": time.time()}
        tmp = home / f"{CHECK_NAME}.tmp"
        tmp.write_text(json.dumps(data))
        os.replace(tmp, home / CHECK_NAME)
    return result


def _kept(path: Path, key: dict[str, object]) -> SharedCheck | None:
    try:
        data = json.loads(path.read_text())
        fresh = time.time() - float(data["at"]) < CACHE_SECONDS
        same = all(data.get(k) == v for k, v in key.items())
        return SharedCheck(True, str(data["detail"])) if fresh and same else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def probe(jobs: Path, scope: list[str], python: str) -> SharedCheck:
    """Run the probe once; raises AgentError if the node it ran on does not see `jobs`, or
    has no `python`."""
    nonce = secrets.token_hex(16)
    ask = jobs / f".slurm-probe-{nonce[:8]}"
    reply = jobs / f".slurm-probe-{nonce[:8]}.reply"
    ask.write_text(nonce)
    argv = ["srun", "--quiet", "--nodes=1", "--ntasks=1", f"--immediate={PROBE_SECONDS}"]
    argv += ["--time=1", "--job-name=gpuhop-probe", *scope]
    argv += ["sh", "-c", PROBE, MARK, str(ask), str(reply), python]
    # A new job of its own, even from an agent started inside an allocation (salloc).
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    if "SLURM_CONF" in os.environ:
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    try:
        out = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_SECONDS + COMMAND_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        answer = reply.read_text() if reply.exists() else None
    except (OSError, subprocess.SubprocessError) as e:
        return SharedCheck(None, f"srun could not run the check: {e}")
    finally:
        ask.unlink(missing_ok=True)
        reply.unlink(missing_ok=True)
    return verdict(jobs, nonce, out.stdout, out.stderr, answer, python)


def verdict(
    jobs: Path, nonce: str, stdout: str, stderr: str, answer: str | None, python: str
) -> SharedCheck:
    """What the probe's output says: a pass, a refusal (AgentError), or nothing known."""
    lines = stdout.splitlines()
    node = lines[0][len(MARK) :].strip() if lines and lines[0].startswith(MARK) else None
    # The task's own words; srun's ("srun: error: node: task 0: Exited...") only without them.
    errors = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    said = " | ".join([e for e in errors if not e.startswith("srun: ")][-3:] or errors[-3:])
    if node is None:
        # The task never ran: Slurm did not start it in time, or refused it.
        return SharedCheck(
            None,
            f"not checked: Slurm did not run the check within {PROBE_SECONDS}s"
            f" ({said or 'no word from srun'})",
        )
    if lines[1:2] == [nonce] and answer == nonce:
        if PYTHON_OK not in lines[2:]:
            raise AgentError(
                f"the agent's Python {python} does not exist on node {node}: every job's steps"
                " run there with it. Install Python and gpuhop where the nodes see them (the"
                " cluster's shared filesystem) and start the agent with that Python"
            )
        return SharedCheck(True, f"jobs' files are under {jobs}, which node {node} sees")
    if lines[1:2] != [nonce]:
        what = f"it said: {said}" if said else "it read other contents there"
    else:
        what = f"the agent cannot read what the node wrote there ({said or 'nothing came back'})"
    raise AgentError(
        f"the agent's state dir is not on a filesystem Slurm's compute nodes see: node {node}"
        f" does not see the agent's file in {jobs} ({what}). Start the agent with --home on"
        " the cluster's shared filesystem (where your home directory or project space is)"
    )
