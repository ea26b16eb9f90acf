"""Runs in the agent: the Ray backend, which runs every job on an existing Ray cluster.

Ray itself is never imported into the agent's process: a subprocess probes the cluster at
start (gpuhop.backends.ray.probe: reachable? token authentication enforced? which nodes
and GPUs?), and each job is led by a leader process (gpuhop.backends.ray.leader) that
is the Ray driver for that job alone. So the agent starts without Ray on the local
backend, and a cluster in trouble cannot take the agent down with it.

The scheduler hands out the cluster's GPUs as found at start, numbered across nodes
(`gpuhop gpus` lists them per node): a job waits in gpuhop's queue until the cluster as a
whole has room for it, and Ray decides where its workers go. Ray's token authentication is
required: a cluster that does not enforce it is refused unless the agent is started with
`--ray-allow-no-auth`, because anyone who reaches such a cluster's ports can run code on
every node.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuhop.api import ErrorCode, GpuInfo
from gpuhop.api.spec import JobSpec
from gpuhop.backends import clusterjob, kerasmode
from gpuhop.backends.base import SCRUBBED_ENV, Attempt, GpuHost, Refused, Started, StartError
from gpuhop.backends.leader import LeaderBackend
from gpuhop.backends.settings import BackendSettings
from gpuhop.home import AgentError, JobPaths

log = logging.getLogger("gpuhop.agent")

INSTALL = "pip install 'gpuhop[ray]'"
SPEC_NAME = "ray.json"
PROBE_TIMEOUT = 60.0
# Seconds a cancelled job's leader gets after the grace to clean up on the cluster.
CLEAN_UP_SECONDS = 30.0
DOCTOR_WAIT = 30  # seconds doctor's probe waits for the cluster to place it on a node
DOCTOR_LIMIT = 120  # seconds it may then run there (doctor gives the whole PROBE_TIMEOUT)
TF_PORTS_NOTE = (
    "multi-worker jobs on the Ray cluster talk over TensorFlow's gRPC, which has no"
    " authentication and listens on every interface of each node while the job runs; a"
    " private network namespace (as on the local backend) cannot span hosts, so keep the"
    " Ray cluster on a private network that only its nodes can reach"
)
SAME_USER_NODE = (
    "a Ray node runs on this host as the agent's own user, and jobs on Ray's nodes run"
    " unsandboxed as that user: a job placed there could read the agent's state dir (its"
    " tokens, TLS key and job store) and use its socket as the owner. Run Ray on this host as"
    " another user than the agent's, or keep this host out of the cluster"
)
NO_AUTH = (
    "the Ray cluster at {address} does not enforce token authentication, so anyone who can"
    " reach its ports can run code on every node. Restart it with RAY_AUTH_MODE=token in the"
    " environment of `ray start` on every node (see https://docs.ray.io/en/latest/"
    "ray-security/token-auth.html), or pass --ray-allow-no-auth to use it anyway"
)


def runs_on_ray(jp: JobPaths) -> bool:
    """Whether this job (any attempt) was started on a Ray cluster."""
    return (jp.root / SPEC_NAME).exists()


class RayBackend(LeaderBackend):
    name = "ray"
    identities = False
    remote = True
    where = "the Ray cluster"

    def __init__(
        self, settings: BackendSettings, auth: bool, nodes: list[dict[str, Any]], python: str
    ):
        assert settings.ray_address is not None
        super().__init__(GpuHost("ray", gpus=_gpus(nodes)), python)
        self.address = settings.ray_address
        self.auth = auth
        self.nodes = nodes
        self.ray_env = {"RAY_AUTH_MODE": "token" if auth else "disabled"}
        self.token_file = settings.ray_token_file
        self._beside = SAME_USER_NODE if ray_node_of_this_user() else None

    @classmethod
    def connect(cls, settings: BackendSettings, python: str) -> RayBackend:
        """Probe the cluster of `settings`; raise AgentError saying why it cannot be used."""
        assert settings.ray_address is not None
        if importlib.util.find_spec("ray") is None:
            raise AgentError(f"the ray backend needs Ray on the agent's host: {INSTALL}")
        env = _base_env(settings.ray_token_file)
        env.pop("RAY_AUTH_MODE", None)  # the probe's first call goes without a token
        try:
            out = subprocess.run(
                [python, "-m", "gpuhop.backends.ray.probe", settings.ray_address],
                env=env,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT,
            )
            answer = json.loads(out.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
            tail = locals().get("out")
            detail = tail.stderr.strip()[-2000:] if tail is not None else str(e)
            raise AgentError(f"probing the Ray cluster failed: {detail}") from None
        if "error" in answer:
            raise AgentError(answer["error"])
        if not answer["auth"]:
            if not settings.ray_allow_no_auth:
                raise AgentError(NO_AUTH.format(address=settings.ray_address))
            log.warning("%s", NO_AUTH.format(address=settings.ray_address).split(". Restart")[0])
        log.warning("%s", TF_PORTS_NOTE)
        return cls(settings, answer["auth"], answer["nodes"], python)

    def describe(self) -> str:
        auth = "token authentication" if self.auth else "NO authentication (--ray-allow-no-auth)"
        gpus = sum(n["gpus"] for n in self.nodes)
        return (
            f"running jobs on the Ray cluster at {self.address} ({auth}):"
            f" {len(self.nodes)} node(s), {gpus} GPU(s)"
        )

    def isolation(self) -> str | None:
        """Jobs run on the cluster's nodes as Ray's user, unsandboxed (see the README): on
        a node of another host, or of this one run by another user, the agent's state dir
        (mode 0700) is out of their reach; on a node of this host run by the agent's own
        user it is not, and then this says so (a team agent starts no job)."""
        return self._beside

    def work_view(self, owned: bool = False) -> str | None:
        return "the job's files are sent to the cluster's nodes from a copy"

    def check_submit(self, spec: JobSpec) -> None:
        """Refuse, with what to do instead, the jobs that need the agent's own host."""
        why = None
        if spec.image is not None:
            why = (
                "container images (--image) run on the local backend only; this agent runs"
                " jobs on the Ray cluster, whose nodes' own Python runs them. Run without --image,"
                " or on an agent with the local backend"
            )
        elif spec.data or spec.data_sources:
            why = (
                "datasets (and buckets' data) are mounted from the agent's host and cannot"
                " reach the Ray cluster's"
                " nodes; put the data where every node can read it"
            )
        elif spec.secrets:
            why = (
                "secrets (--secret) are given only to jobs on the agent's own host, whose"
                " leader masks them in the job's log; this agent runs jobs on the Ray cluster"
            )
        elif spec.requirements is not None:
            why = (
                "jobs on the Ray cluster run with the nodes' own Python packages; a requirements"
                " file (requirements.txt is sent by default) cannot be installed there. Use"
                " --no-requirements, and install what the job needs on every node"
            )
        elif spec.gpu_memory_mb is not None:
            why = "shares of a GPU (--gpu-memory) are not supported on the Ray cluster"
        elif spec.private_network:
            why = (
                "a private network (TensorFlow servers) exists only on the agent's own host,"
                " and this agent runs jobs on a Ray cluster"
            )
        elif spec.workers > 1:
            why = _keras_on_the_cluster(spec.env)
        if why is not None:
            raise Refused(ErrorCode.bad_request, f"{why} (agent started with --backend ray)")
        per_worker = spec.gpus // spec.workers
        largest = max((n["gpus"] for n in self.nodes), default=0)
        if per_worker > largest:
            raise Refused(
                ErrorCode.unsatisfiable,
                f"each worker asks for {per_worker} GPU(s) on one node; the largest node of"
                f" the Ray cluster has {largest}",
            )

    def leader(
        self, attempt: Attempt, jp: JobPaths, deps: dict[str, Any]
    ) -> tuple[list[str], dict[str, str]]:
        head = attempt.command[0]
        if head.endswith(".py") and not (jp.work / head).is_file():
            raise StartError(f"script {head} is not in the job's work dir")
        spec = {
            "address": self.address,
            "job_id": attempt.job_id,
            "attempt": attempt.number,
            "retries": attempt.spec.retries,
            "command": attempt.command,
            "python": deps.get("python"),
            "env": dict(attempt.spec.env),
            "workers": attempt.spec.workers,
            "gpus_per_worker": attempt.spec.gpus // attempt.spec.workers,
            "cpus_per_worker": 1,
            "strategy": "PACK" if deps.get("pack") else "SPREAD",
            "worker_timeout": attempt.spec.worker_timeout,
            "grace": 10,
            "work": str(jp.work),
            "artifacts": str(jp.artifacts),
            "checkpoints": str(jp.checkpoints),
            "metrics": str(jp.metrics),
            "worker_logs": [str(jp.worker_log(i)) for i in range(attempt.spec.workers)]
            if attempt.spec.workers > 1
            else [],
        }
        (jp.root / SPEC_NAME).write_text(json.dumps(spec))
        (jp.root / "grace").unlink(missing_ok=True)
        clusterjob.forget(jp.root)
        argv = [self.python, "-m", "gpuhop.backends.ray.leader"]
        argv += [str(jp.status), str(jp.leader_pid), str(jp.root / SPEC_NAME)]
        return argv, {**_base_env(self.token_file), **self.ray_env}

    def elsewhere(self, jp: JobPaths) -> bool:
        return runs_on_ray(jp)

    def doctor_command(self, argv: list[str]) -> list[str] | None:
        """A Ray driver on this host (gpuhop.backends.ray.doctor) that runs `argv` as one
        task on a node, with one GPU where the cluster has any, placed within DOCTOR_WAIT
        seconds or not at all (a busy cluster is said, not waited on)."""
        spec = {
            "address": self.address,
            "gpus": 1 if any(n["gpus"] for n in self.nodes) else 0,
            "wait": DOCTOR_WAIT,
            "limit": DOCTOR_LIMIT,
        }
        # doctor runs it in its own environment: the token as the leaders get it.
        env = ["env", f"RAY_AUTH_MODE={self.ray_env['RAY_AUTH_MODE']}"]
        if self.token_file is not None:
            env[1:1] = ["-u", "RAY_AUTH_TOKEN"]
            env.append(f"RAY_AUTH_TOKEN_PATH={Path(self.token_file).absolute()}")
        driver = [self.python, "-m", "gpuhop.backends.ray.doctor", json.dumps(spec)]
        return [*env, *driver, "--", *argv]

    def stop(self, jp: JobPaths, started: Started, grace: float) -> float:
        """Tell the job's leader its grace, then SIGTERM; return how long to wait before
        SIGKILL (a job started here by the local backend before a restart: the grace)."""
        if not runs_on_ray(jp):
            return super().stop(jp, started, grace)
        (jp.root / "grace").write_text(f"{grace}")
        super().stop(jp, started, grace)
        return grace + CLEAN_UP_SECONDS


def _base_env(token_file: str | None) -> dict[str, str]:
    """The agent's environment for Ray's processes; a token file replaces other tokens."""
    env = {
        k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV and not k.startswith("GPUHOP_")
    }
    env["PYTHONUNBUFFERED"] = "1"
    if token_file is not None:
        env.pop("RAY_AUTH_TOKEN", None)
        env["RAY_AUTH_TOKEN_PATH"] = str(Path(token_file).absolute())
    return env


def _gpus(nodes: list[dict[str, Any]]) -> list[GpuInfo]:
    """The cluster's GPUs numbered across nodes, head first, each with its node's name."""
    nodes = sorted(nodes, key=lambda n: not n["head"])
    names = [n["name"] or n["address"] for n in nodes]
    out: list[GpuInfo] = []
    for node, name in zip(nodes, names, strict=True):
        label = name if names.count(name) == 1 else f"{name} ({node['node_id'][:8]})"
        for _ in range(node["gpus"]):
            gpu_name = node["accelerator"] or "GPU"
            out.append(GpuInfo(index=len(out), name=gpu_name, memory_mb=0, node=label))
    return out


def _keras_on_the_cluster(env: Mapping[str, str]) -> str | None:
    """Why the job's Keras cannot run across the cluster's workers, if it cannot. The
    nodes' packages are theirs (each worker checks for tf-keras); the modes are checked
    here. Keras 3's keras.distribution (JAX) runs on the local backend only."""
    try:
        mode = kerasmode.decide(env, lambda m: True)
    except kerasmode.KerasRefusal as e:
        return str(e)
    if mode.mode == kerasmode.KERAS_JAX:
        return (
            "Keras 3 on JAX across processes (keras.distribution) runs on an agent with the"
            " local backend only; on the cluster, use --keras tf-keras"
            " (MultiWorkerMirroredStrategy)"
        )
    return None


def ray_node_of_this_user() -> bool:
    """Whether a Ray node (its raylet) runs on this host as this process's user."""
    uid = os.getuid()
    with os.scandir("/proc") as entries:  # closed also on the early return
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/comm") as f:
                    if f.read().strip() != "raylet":
                        continue
                if entry.stat().st_uid == uid:
                    return True
            except OSError:
                continue  # gone meanwhile, or not ours to read
    return False
