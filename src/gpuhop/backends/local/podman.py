"""Runs in the agent: Podman on this host, for the jobs that run in a container image
(`--image`): where it is, which OCI runtime runs their containers, and what each such job's
container is (`describe`), for its leader, which runs it (container.py beside this file).

What a container job gets is what the sandbox (sandbox.py) gives a venv job, made by Podman
instead: a read-only root (the image's), its own mount, PID and IPC namespaces, its own
`/tmp` (the job's tmp dir, bound there), only its own dirs writable at the paths they have on
the host (work dir, artifacts, checkpoints, control dir, log, metrics and provenance files;
and HOME, its user's home, where caches persist across the user's jobs and reach no other
user's: its identity's, or on a single-user agent one the agent makes beside those, not the
host's home, which holds the state dir), its datasets (and a model server's SavedModel:
`jobdeps.mounts`) read-only, and nothing else of the agent's state dir; no capabilities, no
new privileges, the uid and gid of the job's identity (the agent's own where it has none);
and an init (catatonit) as its first process, which passes signals on and reaps orphans.
gpuhop's own package is bound read-only at `GPUHOP_LIB` and put on PYTHONPATH, so the image's
Python runs the start-up hook (metrics, resume) as a venv job's does.
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from typing import Any

from gpuhop.backends import jobdeps
from gpuhop.backends.base import Attempt, StartError
from gpuhop.backends.local import container
from gpuhop.backends.local.jobfiles import VAR_TMP, own_files
from gpuhop.backends.podman import PodmanSettings, find, missing, runtime
from gpuhop.home import JobPaths
from gpuhop.runtime import hook

# Where gpuhop's package is bound read-only in every container (its parent goes on
# PYTHONPATH; its start-up dir goes first).
GPUHOP_LIB = "/opt/gpuhop/python"
ENV_TARGET = "/opt/gpuhop/env"  # the job's environment in it (as container.py says)
# Podman's conmon, the parent of every container's runtime, runs with at most this many
# processes (Podman 4.3 sets it): a container's nproc limit above it is refused (EPERM).
CONMON_NPROC = 32768


def ulimits() -> list[str]:
    """This process's own limits on open files and processes, for the container: Podman's
    defaults are higher, and raising a hard limit needs a capability the agent may lack."""
    out = []
    for name, which, ceiling in (
        ("nofile", resource.RLIMIT_NOFILE, None),
        ("nproc", resource.RLIMIT_NPROC, CONMON_NPROC),
    ):
        soft, hard = resource.getrlimit(which)
        if ceiling is not None:
            hard = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
            soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
        if hard == resource.RLIM_INFINITY:
            continue  # unlimited here: Podman's default is no more than that
        soft = hard if soft == resource.RLIM_INFINITY else soft
        out.append(f"{name}={soft}:{hard}")
    return out


def command(command: list[str], work: Path) -> list[str]:
    """The argv for `command` in the image, from the work dir: a `.py` script (and `-m
    MODULE`) runs with the image's `python3`; a relative path must be an executable file of
    the work dir; a bare name or an absolute path is the image's to find."""
    head, rest = command[0], command[1:]
    if head == "-m":
        if not rest or not rest[0]:
            raise StartError("-m needs a module name to run")
        return ["python3", "-m", *rest]
    if head.endswith(".py"):
        if not (work / head).is_file():
            raise StartError(f"script {head} is not in the job's work dir")
        return ["python3", head, *rest]
    if "/" in head and not head.startswith("/"):
        target = work / head
        if not target.is_file() or not os.access(target, os.X_OK):
            raise StartError(f"{head} is not an executable file in the job's work dir")
        return [str(target), *rest]
    return command


def environment(
    env: dict[str, str], given: dict[str, str], package: Path, own_env: bool = False
) -> dict[str, str]:
    """The container's environment from a venv job's (`env`, whose host variables are the
    allow-list's only): less the host's PATH and LD_LIBRARY_PATH (the image has its own)
    unless the job gave them (`given`), with the start-up hook and gpuhop's package at their
    paths in the container, and with `own_env` the job's environment (its requirements,
    found before the image's own packages, as a venv's are before the host's)."""
    out = {k: v for k, v in env.items() if k not in ("PATH", "LD_LIBRARY_PATH") or k in given}
    startup = str(package / "runtime" / "startup")
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    mine = [ENV_TARGET] if own_env else []
    if startup in parts:  # the hook is wanted: first, as for a venv job
        parts.remove(startup)
        parts = [f"{GPUHOP_LIB}/gpuhop/runtime/startup", *mine, GPUHOP_LIB, *parts]
    else:
        parts = [*mine, *parts, GPUHOP_LIB]  # `import gpuhop.tf` works in the image
    out["PYTHONPATH"] = os.pathsep.join(parts)
    out["TMPDIR"] = given.get("TMPDIR", "/tmp")
    return out


class Mounts:
    """The binds of a container: each (source on the host, target in it, read-only)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, source: Path | str, target: Path | str, readonly: bool = False) -> None:
        for path in (str(source), str(target)):
            # --mount's syntax: a comma ends the value. Podman cannot bind such a path.
            if "," in path:
                raise StartError(f"{path}: a path with a comma cannot be mounted in a container")
        self.items.append({"source": str(source), "target": str(target), "readonly": readonly})


def probe_prefix(settings: PodmanSettings, image: str) -> tuple[str, ...]:
    """What runs a probe of the image's own `python3` (`kerasmode.packages`): in a container
    of its own that sees nothing of the host's files, nor its network."""
    program = find(settings)
    if program is None:
        raise StartError(missing(settings))
    chosen = runtime(settings)
    args = [program, *(["--runtime", chosen] if chosen else []), "run", "--rm", "--pull", "never"]
    args += ["--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges"]
    args += ["--network", "none", "--user", "65534:65534"]
    for limit in ulimits():
        args += ["--ulimit", limit]
    return (*args, image)


def unanswered(settings: PodmanSettings, image: str) -> str:
    """Why a multi-worker job whose image's `python3` gave the Keras probe no answer
    (`kerasmode.packages`) cannot start: not that the image lacks a Keras, which is not
    known; where the image has an ENTRYPOINT, that the probe ran as its arguments, as the
    job would."""
    why = (
        f"image {image}'s python3 did not say which Keras it has (the agent's log says what it"
        " printed), so which Keras would run this multi-worker job is not known"
    )
    program = find(settings)
    spec = {"podman": program, "runtime": runtime(settings), "image": image}
    first = container.entrypoint(spec) if program is not None else None
    if first:
        why += (
            f"; the image's ENTRYPOINT {json.dumps(first)} ran with `python3 -c ...` as its"
            " arguments, as it would the job's command: unless it runs them as a command (a"
            ' script that ends in exec "$@" does), no job of gpuhop\'s runs in this image'
        )
    return why


def describe(
    settings: PodmanSettings,
    image: str,
    name: str,
    user: str,
    work: Path,
    mounts: Mounts,
    reference: str | None = None,
) -> dict[str, Any]:
    """The container spec a leader runs (container.py), but for the job's variables and
    network, which the leader adds (they differ between the workers of a gang). With
    `reference` (the job's), `image` is the id the agent found that reference's image by as
    the job started: the leader does not look it up again."""
    program = find(settings)
    if program is None:
        raise StartError(missing(settings))
    rootless = os.geteuid() != 0
    # A rootless Podman maps the agent's uid to itself in the container (keep-id), so the
    # job's files stay the agent's user's; that needs the user's subordinate ids. Without
    # them Podman maps the agent's uid alone, to the container's root: the job runs as that
    # root, which is the agent's user outside and holds no capability.
    keep_id = rootless and _has_subordinate_ids()
    return {
        "podman": program,
        "runtime": runtime(settings),
        "image": image,
        "reference": reference,
        "name": name,
        "user": "0:0" if rootless and not keep_id else user,
        "keep_id": keep_id,
        "workdir": str(work),
        "mounts": mounts.items,
        "ulimits": ulimits(),
    }


def _has_subordinate_ids() -> bool:
    """Whether this (unprivileged) user has subordinate uids and gids (/etc/subuid and
    /etc/subgid, by name or by number), which Podman needs to map more than its own uid.
    A uid with no passwd entry has none that Podman can use: `newuidmap` refuses to map
    for it ("Cannot determine your user name"), whatever /etc/subuid says."""
    import pwd

    uid = os.geteuid()
    try:
        names = {str(uid), pwd.getpwuid(uid).pw_name}
    except KeyError:
        return False
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            return False
        owners = {line.split(":", 1)[0] for line in lines if line.count(":") == 2}
        if not names & owners:
            return False
    return True  # (/etc/subgid too is looked up by the user's name or uid, as Podman does)


def container_args(
    settings: PodmanSettings,
    attempt: Attempt,
    jp: JobPaths,
    deps: dict[str, Any],
    env: dict[str, str],
    specs: dict[str, Any] | None,
    home: Path,
) -> list[str]:
    """The leader's `--container` argument for a job in a container image (what this
    module's docstring says it gives it); turns `env` into the container's variables. With
    `specs`, the container's spec goes there, not to a file. `home`: the job's user's home
    (their identity's, or the agent's for its own image jobs), its HOME."""
    identity = deps.get("identity")
    var_tmp = jp.root / VAR_TMP
    var_tmp.mkdir(mode=0o700, exist_ok=True)
    mounts = Mounts()
    for path in own_files(jp, 1, identity):  # a worker's log is the leader's to write
        mounts.add(path, path)
    if not identity:  # (an identity's home is among its own files)
        mounts.add(home, home)
    mounts.add(jp.tmp, "/tmp")
    mounts.add(var_tmp, "/var/tmp")
    for mount in jobdeps.mounts(deps):  # its datasets, a model server's model
        target = jp.work / mount["mount"]
        target.mkdir(parents=True, exist_ok=True)
        mounts.add(mount["source"], target, readonly=True)
    package = Path(hook.__file__).resolve().parents[1]
    mounts.add(package, f"{GPUHOP_LIB}/gpuhop", readonly=True)
    who = identity or {"uid": os.getuid(), "gid": os.getgid()}
    noted = deps.get("image_id")
    spec = describe(
        settings,
        # The image the agent noted as this start's (its id), else as the job names it.
        str(noted or attempt.spec.image),
        f"gpuhop-{attempt.job_id}-{attempt.number}",
        f"{who['uid']}:{who['gid']}",
        jp.work,
        mounts,
        reference=attempt.spec.image if noted else None,
    )
    spec["home"] = str(home)
    inside = environment(env, dict(attempt.spec.env), package, bool(deps.get("env")))
    inside["HOME"] = str(home)
    for key, value in sorted(inside.items()):  # they go through an env file (container.py)
        why = container.env_problem(key, value)
        if why is not None:
            raise StartError(why)
    env.clear()
    env.update(inside)
    for name in ("PATH", "HOME", "XDG_RUNTIME_DIR"):  # Podman's own, not the job's
        if name in os.environ:
            env[f"GPUHOP_PODMAN_{name}"] = os.environ[name]
    if specs is not None:
        specs["container"] = spec
        return []
    (jp.root / "container.json").write_text(json.dumps(spec))
    return ["--container", str(jp.root / "container.json")]


def ready_spec(
    spec: dict[str, Any], env: dict[str, str], jobs: Path, base: Path
) -> dict[str, Any] | None:
    """What a container started ahead of this job (ready.py) must be for the job to run in
    it: the job's container spec (`describe`) less what differs between jobs (its own
    paths, its name and work dir; its variables are the leader's), with its GPUs (`env`'s
    CUDA_VISIBLE_DEVICES, the host's indices), the jobs' root `jobs` and `base`, where such
    containers' dirs go. None where the agent is not root, which binds the job's paths into
    the container from the host."""
    if os.geteuid() != 0:
        return None
    fixed = [m for m in spec["mounts"] if m["target"] in (f"{GPUHOP_LIB}/gpuhop", spec["home"])]
    gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    keep = ("podman", "runtime", "image", "user", "keep_id", "ulimits", "home")
    out = {name: spec[name] for name in keep}
    return {**out, "mounts": fixed, "gpus": gpus, "jobs": str(jobs), "base": str(base)}
