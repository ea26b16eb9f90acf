"""Runs on the GPU host, in a job's leader, before the job: builds the job's Python environment,
or finds it already built. Standard library only (the leader runs with `python -I -S`).

An environment is a venv in `envs/ID/`, where ID hashes the requirements text and the
interpreter (see `gpuhop.agent.storage.envs`). It is built once, under a lock, so jobs that ask for
the same set at the same time build it once: the others wait and reuse it. The venv sees
the base interpreter's site-packages through a .pth file placed after its own, so the
host's TensorFlow is used as installed, never reinstalled, and a package the requirements
pin is found in the venv first. pip runs with the job's environment (PIP_INDEX_URL,
PIP_FIND_LINKS, PIP_NO_INDEX... apply) and writes to the job's log. `gpuhop-env.json` is
written last: a venv without it is half-built and is built again.

A job with an identity of its own (a team agent's) has its environment built inside its
sandbox, as that identity, by `build` (the leader takes the lock with `claim` first): pip and
whatever a requirement runs never run as the agent, nor see more of the host than the job.
"""

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time

MARKER = "gpuhop-env.json"
LAST_USED = "last-used"


def _say(message: str) -> None:
    sys.stdout.write(f"gpuhop: {message}\n")
    sys.stdout.flush()


def _empty(env_dir: str) -> None:
    """Remove what is in `env_dir` (in a job's sandbox the dir itself is a mount point)."""
    if not os.path.isdir(env_dir):
        return
    for name in os.listdir(env_dir):
        path = os.path.join(env_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _discard(env_dir: str) -> None:
    """A failed build's dir: emptied, and removed unless it is a mount point (in a job's
    sandbox; the agent lists an empty one as nothing)."""
    _empty(env_dir)
    with contextlib.suppress(OSError):
        os.rmdir(env_dir)


def _size(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def prepare(spec: dict) -> str | None:
    """Make sure the environment of `spec` is built. Returns None, or why it failed."""
    lock, built = claim(spec)
    with lock:
        return None if built else build(spec)


def claim(spec: dict):
    """Take the environment's build lock (waiting for a job that builds it now). Returns the
    lock's open file, which holds the lock until closed, and whether the environment is
    built already (then it is marked used now)."""
    env_dir, short = spec["dir"], spec["id"][:12]
    os.makedirs(os.path.dirname(env_dir), exist_ok=True)
    lock = open(f"{env_dir}.lock", "a")  # noqa: SIM115 (held past this function)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _say(f"waiting for another job that is building environment {short}")
        fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(os.path.join(env_dir, MARKER)):
        return lock, False
    with open(os.path.join(env_dir, LAST_USED), "w") as f:
        f.write(str(time.time()))
    _say(f"environment {short} is ready (reused, not built again)")
    return lock, True


def build(spec: dict) -> str | None:
    """Build the environment (its lock held). Returns None, or why it failed."""
    return _build(spec, spec["id"][:12])


def _build(spec: dict, short: str) -> str | None:
    env_dir, python = spec["dir"], spec["python"]
    started = time.time()
    _say(f"building environment {short} with {python} (once; later jobs reuse it)")
    _empty(env_dir)  # a half-built one from a crash
    try:
        subprocess.run([python, "-m", "venv", "--without-pip", env_dir], check=True)
        env_python = os.path.join(env_dir, "bin", "python")
        base_sites = subprocess.run(
            [python, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        own_site = subprocess.run(
            [env_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        # Lines starting with `import` in a .pth file run at start-up; addsitedir appends, so
        # the venv's own packages come first, and it processes the base's .pth files too.
        lines = [f"import site; site.addsitedir({d!r})" for d in json.loads(base_sites)]
        with open(os.path.join(own_site, "_gpuhop_base_site.pth"), "w") as f:
            f.write("\n".join(lines) + "\n")
    except (OSError, subprocess.CalledProcessError, ValueError) as e:
        _discard(env_dir)
        return f"could not create a venv with {python}: {e}"
    if subprocess.run([env_python, "-c", "import pip"], capture_output=True).returncode != 0:
        subprocess.run([env_python, "-m", "ensurepip", "--default-pip"], check=False)
    pip = [env_python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    code = subprocess.run([*pip, "-r", spec["requirements"]]).returncode
    return _finish(spec, code, started, short)


def build_in_image(spec: dict, run: tuple, target: str, requirements: str) -> str | None:
    """Build the environment of a job in a container image (its lock held): the image's own
    pip installs the requirements (at `requirements` in the container) into the
    environment's dir, mounted at `target` in a container that `run` starts (a `podman run`
    argv up to the command, the environment to run it with, and the file descriptors it
    inherits). The dir is one of the
    image's (`image_dir`). Returns None, or why it failed."""
    env_dir, short = spec["dir"], spec["id"][:12]
    started = time.time()
    _say(f"building environment {short} on image {spec['python']} (once; later jobs reuse it)")
    _empty(env_dir)  # a half-built one from a crash
    pip = ["python3", "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    pip += ["--no-warn-script-location", "--target", target, "-r", requirements]
    argv, env, fds = run
    try:
        code = subprocess.run(
            [*argv, *pip], env=env, stdin=subprocess.DEVNULL, pass_fds=fds
        ).returncode
    except OSError as e:
        _discard(env_dir)
        return f"could not run Podman to build the job's environment: {e.strerror}"
    return _finish(spec, code, started, short)


def image_dir(spec: dict, image_id: str) -> dict:
    """`spec` with its dir made the one for the image `image_id`: what pip installs is for
    that image's Python, and a tag moved to another image gets an environment of its own."""
    return dict(spec, dir=os.path.join(spec["dir"], image_id[:12]))


def _finish(spec: dict, code: int, started: float, short: str) -> str | None:
    """Record a built environment (pip exited with `code`), or discard a failed one."""
    env_dir = spec["dir"]
    if code != 0:
        _discard(env_dir)
        # The requirements may be a requirements.txt that `run` sent unasked: say whose.
        _say(
            "pip could not install the job's requirements (its error is above): fix them (the"
            " work dir's requirements.txt, or the file -r names), or run without them"
            " (--no-requirements, or no -r)"
        )
        return f"could not build the job's Python environment: pip install exited with {code}"
    seconds = time.time() - started
    info = {
        "id": spec["id"],
        "python": spec["python"],
        "requirements": spec["requirements_text"],
        "created_at": time.time(),
        "build_seconds": seconds,
        "size": _size(env_dir),
    }
    if spec.get("owner"):
        info["owner"] = spec["owner"]
    with open(os.path.join(env_dir, LAST_USED), "w") as f:
        f.write(str(time.time()))
    # Every file pip wrote is on the disk before the marker says the environment is built:
    # one named before could come back from a power loss as empty files, for every job.
    os.sync()
    tmp = os.path.join(env_dir, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(info, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(env_dir, MARKER))
    directory = os.open(env_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    _say(f"built environment {short} in {seconds:.1f}s")
    return None
