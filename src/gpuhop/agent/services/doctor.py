"""Runs in the agent: `gpuhop doctor`, a preflight of the GPU host for TensorFlow jobs.

Facts come from two places. The agent knows the driver (NVML or nvidia-smi, read at start)
and its state dir's free disk. What TensorFlow makes of the host comes from `probe.py`, run
in a subprocess with the jobs' Python and a job's environment: the agent never imports
TensorFlow. `evaluate` turns the facts into checks and is pure, so every verdict is tested
without a GPU. A host without NVIDIA GPUs is a valid setup: there the GPU checks are
skipped, not failed.

The probe costs its ~600 MB of memory and seconds of CPU, so any user asking for it must not
be able to start many: `ProbeRuns` runs one at a time and reuses its report for
`PROBE_CACHE_SECONDS`; callers that arrive meanwhile wait for that one. Only an admin may ask
for a fresh one (`fresh`), and a fresh run that started after they asked serves them all.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.host import probe
from gpuhop.agent.services import bucketcreds, hostchecks
from gpuhop.agent.services.hostchecks import Facts, TlsFacts
from gpuhop.agent.services.hostchecks import check as _check
from gpuhop.api import CheckStatus, DoctorCheck, format_mb
from gpuhop.backends import podman
from gpuhop.backends.base import SCRUBBED_ENV

PROBE_TIMEOUT = 180.0  # importing TensorFlow and initialising CUDA can take a while
INSTALL_GPU_TF = "pip install 'tensorflow[and-cuda]'"
PROBE_CACHE_SECONDS = 60.0
PROBE_FILE = probe.__file__


class ProbeRuns:
    """One probe at a time; its report reused for `ttl` seconds (see the module's doc)."""

    def __init__(
        self, ttl: float = PROBE_CACHE_SECONDS, clock: Callable[[], float] = time.monotonic
    ):
        self.ttl = ttl
        self.clock = clock
        self._lock = asyncio.Lock()
        self._report: dict[str, Any] | None = None
        self._started = self._ended = 0.0

    async def report(
        self, probe: Callable[[], dict[str, Any]], fresh: bool = False
    ) -> dict[str, Any]:
        """The probe's report: the last one if recent enough (for `fresh`, if it started
        after this call), else a new one, run in a worker thread."""
        asked = self.clock()
        async with self._lock:
            if self._report is not None:
                if fresh and self._started >= asked:
                    return self._report
                if not fresh and self.clock() - self._ended < self.ttl:
                    return self._report
            started = self.clock()
            report = await asyncio.to_thread(probe)
            self._report, self._started, self._ended = report, started, self.clock()
            return report


async def checks(
    ctx: AgentContext,
    runs: ProbeRuns,
    caller: Caller,
    fresh: bool = False,
    probe: bool = True,
) -> list[DoctorCheck]:
    """The preflight's checks, with the probe's report from `runs`, and last the credentials
    a bucket's fetch would use for `caller`; without `probe`, only those that need none
    (known at once: `doctor` shows them while the probe runs)."""
    mine = bucketcreds.check(await asyncio.to_thread(bucketcreds.gather, ctx, caller, os.environ))
    if not probe:
        return [*evaluate(await asyncio.to_thread(gather, ctx, {}), probed=False), mine]
    python = ctx.supervisor.python
    command = ctx.backend.doctor_command([python, PROBE_FILE])
    if command is None:
        report: dict[str, Any] = {"python": python, "not_probed": ctx.backend.where}
    else:
        report = await runs.report(lambda: run_probe(python, ctx.paths.tmp, command=command), fresh)
    return [*evaluate(await asyncio.to_thread(gather, ctx, report)), mine]


def gather(ctx: AgentContext, report: dict[str, Any]) -> Facts:
    """The facts the agent knows now, with the probe's `report`."""
    host = ctx.gpu_host
    return Facts(
        gpu_source=host.source,
        gpus=list(host.gpus),
        driver_version=host.driver_version,
        driver_cuda=host.cuda_version,
        driver_error=host.error,
        state_dir=str(ctx.paths.home),
        disk_free=shutil.disk_usage(ctx.paths.home).free,
        probe=report,
        isolation=ctx.backend.isolation(),
        team=ctx.team(),
        ray=ctx.backend.remote,  # a cluster (Ray, Slurm): not this host's sandbox
        cluster=ctx.backend.where if ctx.backend.remote else None,
        quarantined={i: q.detail for i, q in ctx.quarantine.all().items()},
        work_view=ctx.backend.work_view(),
        files_seen=ctx.backend.files_seen(),
        agent_uid=os.geteuid(),
        identities=ctx.backend.identities,
        identity_users=len(ctx.identities.listed()),
        uid_base=ctx.identities.base,
        tls=tls_facts(ctx),
        **_containers(ctx),
    )


def tls_facts(ctx: AgentContext, now: datetime.datetime | None = None) -> TlsFacts | None:
    """The TLS listener's certificate, as `hostchecks.tls_certificate` judges it."""
    listener = ctx.listener
    if listener is None or listener.expires is None or listener.fingerprint is None:
        return None
    return TlsFacts(
        fingerprint=listener.fingerprint,
        expires=listener.expires,
        own=str(ctx.own_certificate) if ctx.own_certificate else None,
        now=now or datetime.datetime.now(datetime.UTC),
    )


def _containers(ctx: AgentContext) -> dict[str, Any]:
    """What `hostchecks.containers` reads of Podman here (for the local backend only)."""
    settings = getattr(ctx.backend, "containers", None)
    if not isinstance(settings, podman.PodmanSettings):
        return {}
    program = podman.find(settings)
    cdi = podman.cdi_spec()
    return {
        "podman": program,
        "podman_version": podman.version(program) if program else None,
        "container_runtime": podman.runtime(settings) if program else None,
        "cdi_spec": str(cdi) if cdi else None,
        "nvidia_ctk": shutil.which("nvidia-ctk") is not None,
    }


def run_probe(
    python: str, cwd: Path, timeout: float = PROBE_TIMEOUT, command: list[str] | None = None
) -> dict[str, Any]:
    """Run probe.py with `python` and a job's environment (as `command`, where the backend
    runs it elsewhere: Slurm's srun, a Ray task); its report, or a probe_error."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env = {k: v for k, v in env.items() if not k.startswith("GPUHOP_")}
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        done = subprocess.run(
            command or [python, PROBE_FILE],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {
            "python": python,
            "probe_error": f"{python} did not finish importing TensorFlow in {timeout:.0f}s",
        }
    except OSError as e:
        return {"python": python, "probe_error": f"cannot run {python}: {e}"}
    for line in done.stdout.splitlines():
        if line.startswith(probe.MARK):
            try:
                report = json.loads(line[len(probe.MARK) :])
            except ValueError:
                break
            if isinstance(report, dict):
                return report
            break
    tail = " | ".join(done.stderr.strip().splitlines()[-3:])
    return {
        "python": python,
        "probe_error": f"the probe exited with {done.returncode}: {tail or 'no output'}",
    }


def evaluate(f: Facts, probed: bool = True) -> list[DoctorCheck]:
    """The checks, in the order a person fixes things: driver, TensorFlow, CUDA, GPUs, disk.
    Without `probed`, those whose verdict needs no report of the probe's."""
    tf = (
        [_tensorflow(f), _cuda(f), _tf_gpus(f)] if probed else [],
        [_tf_keras(f)] if probed else [],
    )
    return [
        _driver(f),
        *tf[0],
        hostchecks.gpu_health(f.gpus, f.quarantined),
        *tf[1],
        hostchecks.disk(f),
        hostchecks.sandbox(f),
        hostchecks.identity(f),
        hostchecks.containers(f),
        hostchecks.work_dirs(f),
        *hostchecks.shared_files(f),
        *([hostchecks.tls_certificate(f.tls)] if f.tls else []),
    ]


def _driver(f: Facts) -> DoctorCheck:
    name = "NVIDIA driver"
    if f.gpu_source == "fake":
        return _check(
            name,
            CheckStatus.skipped,
            f"{len(f.gpus)} fake GPU(s) of {format_mb(f.gpus[0].memory_mb) if f.gpus else '-'}"
            " (--fake-gpus); no driver is needed and jobs run on the CPU",
        )
    if f.driver_error:
        return _check(
            name,
            CheckStatus.failed,
            f.driver_error,
            "make `nvidia-smi` list the GPUs: install the NVIDIA driver, or load it (a reboot"
            " after a driver update often does)",
        )
    if f.cluster:
        nodes = len({g.node for g in f.gpus})
        return _check(
            name,
            CheckStatus.skipped,
            f"the drivers are on the nodes of {f.cluster} ({len(f.gpus)} GPU(s) on {nodes}"
            " node(s)), not on the agent's host; TensorFlow's check below runs on a node",
        )
    if not f.gpus:
        return _check(name, CheckStatus.skipped, "no NVIDIA GPU on this host; jobs run on the CPU")
    names = sorted({g.name for g in f.gpus})
    return _check(
        name,
        CheckStatus.passed,
        f"driver {f.driver_version or '?'} (supports CUDA {f.driver_cuda or '?'}),"
        f" {len(f.gpus)} GPU(s): {', '.join(names)}; read through {f.gpu_source}",
    )


def _pip(f: Facts) -> str:
    python = f.probe.get("python")
    return f"{python} -m pip" if python else "pip"


def _gpus_there(f: Facts) -> int:
    """The GPUs the probe's host had for it: the host's, or on a cluster those the
    scheduler gave the probe's job on its node."""
    if not f.cluster:
        return len(f.gpus) if f.real_gpus else 0
    return len([g for g in (f.probe.get("visible") or "").split(",") if g.strip()])


def _scheduler(f: Facts) -> str:
    """Who gave the probe's job its GPUs on a cluster, by name ("Slurm", "Ray")."""
    return {"slurm": "Slurm", "ray": "Ray"}.get(f.gpu_source, "the cluster")


def _on(f: Facts) -> str:
    """Where the probe ran, for a cluster: " on node N"."""
    return f" on node {f.probe.get('node', '?')}" if f.cluster else ""


def _not_probed(f: Facts, name: str) -> DoctorCheck | None:
    if "not_probed" not in f.probe:
        return None
    return _check(
        name,
        CheckStatus.skipped,
        f"jobs run on {f.probe['not_probed']}, and this check does not run there yet; the"
        " agent's host is not where jobs run (a short job that imports TensorFlow tells)",
    )


def _tensorflow(f: Facts) -> DoctorCheck:
    name = "TensorFlow"
    p = f.probe
    if (skipped := _not_probed(f, name)) is not None:
        return skipped
    gpus = _gpus_there(f)
    want = INSTALL_GPU_TF if gpus else "pip install tensorflow-cpu"
    python = p.get("python", "?")
    if "probe_error" in p:
        where = f"in a job on {f.cluster}" if f.cluster else "on the GPU host"
        return _check(
            name,
            CheckStatus.failed,
            p["probe_error"],
            f"run {python} -c 'import tensorflow' {where} to see what goes wrong",
        )
    if "tf_error" in p:
        return _check(
            name,
            CheckStatus.failed,
            f"cannot import tensorflow with {python}: {p['tf_error']}",
            want.replace("pip", _pip(f), 1),
        )
    version = p.get("tf_version", "?")
    if "build_error" in p:
        return _check(name, CheckStatus.warning, f"TensorFlow {version}: {p['build_error']}")
    if not p.get("cuda_build"):
        if gpus:
            fix = INSTALL_GPU_TF.replace("pip", _pip(f), 1)
            if "tensorflow-cpu" in p.get("tf_dists", {}):
                fix = f"{_pip(f)} uninstall -y tensorflow-cpu && {fix}"
            return _check(
                name,
                CheckStatus.failed,
                f"TensorFlow {version} is a CPU build; it cannot use"
                + (
                    f" the {gpus} GPU(s) {_scheduler(f)} gave it{_on(f)}"
                    if f.cluster
                    else f" this host's {gpus} GPU(s)"
                ),
                fix,
            )
        return _check(
            name, CheckStatus.passed, f"TensorFlow {version} (CPU build), with {python}{_on(f)}"
        )
    built = f"CUDA {p.get('cuda_version') or '?'}, cuDNN {p.get('cudnn_version') or '?'}"
    where = "" if gpus else "; there is no GPU here, so jobs run on the CPU"
    return _check(
        name,
        CheckStatus.passed,
        f"TensorFlow {version} built for {built}, with {python}{_on(f)}{where}",
    )


def _cuda(f: Facts) -> DoctorCheck:
    name = "CUDA version"
    built = f.probe.get("cuda_version")
    if (skipped := _not_probed(f, name)) is not None:
        return skipped
    if f.cluster:
        return _check(
            name,
            CheckStatus.skipped,
            "the nodes' driver is not read from the agent's host; TensorFlow seeing its GPUs"
            " on a node (below) is the check that counts",
        )
    if not f.real_gpus:
        return _check(name, CheckStatus.skipped, "no NVIDIA GPU, so no CUDA to match")
    if not f.probe.get("cuda_build") or not built:
        return _check(name, CheckStatus.skipped, "TensorFlow here is not a CUDA build")
    if not f.driver_cuda:
        return _check(
            name,
            CheckStatus.warning,
            f"TensorFlow was built for CUDA {built}; could not read which CUDA the driver supports",
        )
    have, need = _major_minor(f.driver_cuda), _major_minor(built)
    both = f"the driver supports CUDA up to {f.driver_cuda}; TensorFlow was built for {built}"
    update = f"update the NVIDIA driver to one that supports CUDA {need[0]}.{need[1]} or newer"
    if have[0] < need[0]:
        return _check(name, CheckStatus.failed, both, update)
    if have < need:
        return _check(
            name,
            CheckStatus.warning,
            f"{both}: it runs through CUDA minor-version compatibility, but kernels that need"
            " PTX compiled by the driver may fail",
            update,
        )
    return _check(name, CheckStatus.passed, both)


def _tf_gpus(f: Facts) -> DoctorCheck:
    name = "TensorFlow sees the GPUs"
    p = f.probe
    seen = p.get("gpus")
    if (skipped := _not_probed(f, name)) is not None:
        return skipped
    if f.cluster:
        return _tf_gpus_on_a_node(f, name)
    if f.gpu_source == "fake":
        return _check(
            name,
            CheckStatus.skipped,
            f"fake GPUs are not real; TensorFlow sees {len(seen or [])} GPU(s) on this host",
        )
    if not f.gpus:
        return _check(name, CheckStatus.skipped, "no NVIDIA GPU on this host")
    if "probe_error" in p or "tf_error" in p:
        return _check(name, CheckStatus.skipped, "TensorFlow could not be imported (see above)")
    if seen is None:
        return _check(name, CheckStatus.failed, f"listing GPUs failed: {p.get('gpus_error')}", None)
    if len(seen) >= len(f.gpus):
        return _check(name, CheckStatus.passed, f"TensorFlow sees all {len(f.gpus)} GPU(s)")
    if not p.get("cuda_build"):
        fix = INSTALL_GPU_TF.replace("pip", _pip(f), 1)
    else:
        fix = (
            f"reinstall with {INSTALL_GPU_TF} (it brings the CUDA libraries) and check that"
            " LD_LIBRARY_PATH does not point at other CUDA versions; TF_CPP_MIN_LOG_LEVEL=0"
            " python -c 'import tensorflow as tf; tf.config.list_physical_devices()' says why"
        )
    return _check(
        name,
        CheckStatus.failed,
        f"TensorFlow sees {len(seen)} of the {len(f.gpus)} GPU(s)",
        fix,
    )


def _tf_gpus_on_a_node(f: Facts, name: str) -> DoctorCheck:
    p = f.probe
    given, seen = _gpus_there(f), p.get("gpus")
    if not f.gpus:
        return _check(name, CheckStatus.skipped, f"{f.cluster} offers no GPU")
    if "probe_error" in p or "tf_error" in p:
        return _check(name, CheckStatus.skipped, "TensorFlow could not be imported (see above)")
    if not given:
        return _check(name, CheckStatus.skipped, f"the check's job got no GPU{_on(f)}")
    if seen is None:
        return _check(name, CheckStatus.failed, f"listing GPUs failed: {p.get('gpus_error')}", None)
    if len(seen) >= given:
        return _check(
            name,
            CheckStatus.passed,
            f"TensorFlow sees the {given} GPU(s) {_scheduler(f)} gave it{_on(f)}",
        )
    fix = f"install {INSTALL_GPU_TF} in {p.get('python', 'the Python')} the nodes run"
    if p.get("cuda_build"):
        look = "python -c 'import tensorflow as tf; tf.config.list_physical_devices()'"
        look = f"srun --gres=gpu:1 {look}" if f.gpu_source == "slurm" else f"{look} on that node"
        fix = (
            "check the node's CUDA libraries and LD_LIBRARY_PATH there:"
            f" TF_CPP_MIN_LOG_LEVEL=0 {look} says why"
        )
    return _check(
        name,
        CheckStatus.failed,
        f"TensorFlow sees {len(seen)} of the {given} GPU(s) {_scheduler(f)} gave it{_on(f)}",
        fix,
    )


def _tf_keras(f: Facts) -> DoctorCheck:
    name = "tf-keras"
    p = f.probe
    if (skipped := _not_probed(f, name)) is not None:
        return skipped
    version = p.get("tf_version")
    if not version:
        return _check(name, CheckStatus.skipped, "TensorFlow could not be imported (see above)")
    series = ".".join(str(n) for n in _major_minor(version))
    fix = f"{_pip(f)} install 'tf-keras=={series}.*'"
    have = p.get("tf_keras")
    if not have:
        return _check(
            name,
            CheckStatus.warning,
            "not installed: Keras `fit` in multi-worker jobs needs it (Keras 3's fit fails"
            " under MultiWorkerMirroredStrategy)",
            fix,
        )
    if _major_minor(have) != _major_minor(version):
        return _check(
            name,
            CheckStatus.warning,
            f"tf-keras {have} does not match TensorFlow {version}",
            fix,
        )
    return _check(name, CheckStatus.passed, f"tf-keras {have}, for Keras fit in multi-worker jobs")


def _major_minor(version: str) -> tuple[int, int]:
    major, minor, *_ = [int(p) if p.isdigit() else 0 for p in f"{version}.0.0".split(".")]
    return major, minor
