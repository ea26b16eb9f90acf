"""Runs on the GPU host, in a job's leader: prepares the job's container (its image on the
host, its environment built where it has requirements: `prepare`) and runs the job (or each
worker of a gang) in it through Podman, as the agent described the container (podman.py). Standard
library only (the leader runs with `python -I -S`).

`podman run` is the leader's child, in the leader's process group: a cancel's SIGTERM reaches
it and Podman passes it on to the container's init (catatonit, `--init`), which passes it on
to the job. The job's output goes straight to the job's log (`--log-driver passthrough`: the
container's stdout and stderr are the leader's). The job's variables reach the container
through an env file in memory (`--env-file /dev/fd/N`, a memfd the leader writes: `env_file`),
never through Podman's own environment, nor its command line (which every user on the host
may read: no value, a secret's least of all, is there). Podman runs as root on a team agent:
a variable a user gives their job (LD_PRELOAD, CONTAINERS_CONF, PATH) in Podman's own
environment would run the user's code as root. Podman's environment is the agent's PATH,
HOME and XDG_RUNTIME_DIR alone (`_for_podman`). Each container is named
`gpuhop-JOB-ATTEMPT[-WORKER]` (the pid file lists the names), and removed when the leader is
done with it; where the leader itself was killed, the agent removes them
(LocalBackend.end_the_rest).

How it ended: Podman's exit status is the container's, its init's: the job's exit code, or
128+N where the job was killed by signal N (catatonit, like a shell, reports a signal so; as
does Podman for a container it killed). The job's own `exit(137)` reads the same: there is
no telling them apart from outside, so a status of 128+N, N a signal that ends a process
(1-31), is read as killed by signal N, as a shell's `$?` is; a job that must say otherwise
exits with a code below 129. 125, 126 and 127 are Podman's own: it could not run the
container, the program, or find it (its message is in the log). The job's command goes after
the image's ENTRYPOINT, if it has one (as `docker run` puts it): one that runs its arguments
(NVIDIA's images' `exec "$@"`) runs the job; where a job fails in an image whose ENTRYPOINT is
an interpreter (`["python3"]`, which takes the command for its script and fails every job),
its reason says so.

GPUs are given through the Container Device Interface (`--device nvidia.com/gpu=N`, the
NVIDIA container toolkit's names, which are NVML's indices): the job's
CUDA_VISIBLE_DEVICES on the host names them, and the container, which sees only those,
is told `0..n-1`.
"""

import contextlib
import json
import os
import subprocess

# Podman's own exit statuses: not the job's.
PODMAN_STATUS = {
    125: "Podman could not run the container (its message is above)",
    126: "the job's program in the image could not be run",
    127: "the job's program was not found in the image",
}


def name(spec: dict, worker=None) -> str:
    return spec["name"] if worker is None else f"{spec['name']}-{worker}"


def image_missing(spec: dict) -> str | None:
    """None if the image is in the host's Podman store; else what to say."""
    try:
        done = _call(spec, "image", "exists", spec["image"], capture_output=True)
    except (OSError, subprocess.SubprocessError) as e:
        return f"Podman ({spec['podman']}) did not say whether image {spec['image']} is here: {e}"
    if done.returncode == 0:
        return None
    if done.returncode == 1:
        return (
            f"image {spec['image']} is not on this host; pull it there first"
            f" (podman pull {spec['image']})"
        )
    said = done.stderr.decode(errors="replace").strip()
    return f"Podman ({spec['podman']}) cannot look up image {spec['image']}: {said}"


def prepare(spec: dict, env_spec: dict | None) -> str | None:
    """Before the job's containers start: its image must be on the host, and with
    `env_spec` (`--requirements` on top of it) its environment built, or found, for the
    image its reference names now, and mounted in `spec`'s containers. None, or why not."""
    # Where the agent looked the image up as the job started (the spec names its id, and the
    # job's `reference`), a second look would cost the job one more Podman start (some 20 ms);
    # an image removed since then is said from Podman's own failure (`outcome`).
    known = spec.get("reference") is not None
    why = None if known else image_missing(spec)
    if why is not None or env_spec is None:
        return why
    import envbuild  # beside this file, as the leader has it on its path

    found = spec["image"] if known else image_id(spec)
    if found is None:
        return f"Podman cannot say which image {spec['image']} is"
    env_spec = envbuild.image_dir(env_spec, found)
    lock, built = envbuild.claim(env_spec)
    with lock:
        if not built:
            run = build_argv(spec, env_spec)
            why = envbuild.build_in_image(env_spec, run, ENV_TARGET, REQUIREMENTS_TARGET)
            first = entrypoint(spec) if why is not None else None
            if first and eats_arguments(first):  # pip never ran: not the requirements' fault
                why += (
                    f"; the image's ENTRYPOINT {json.dumps(first)} ran with `python3 -m pip"
                    " install ...` as its arguments, as it would the job's command"
                )
                print(f"gpuhop: {why}", flush=True)
    if why is None:
        spec["mounts"].append({"source": env_spec["dir"], "target": ENV_TARGET, "readonly": True})
    return why


def image_id(spec: dict) -> str | None:
    """The id of the image the job's reference names now, or None if Podman cannot say."""
    try:
        args = ("image", "inspect", "--format", "{{.Id}}", spec["image"])
        done = _call(spec, *args, capture_output=True, text=True)
    except (OSError, subprocess.SubprocessError):
        return None
    found = done.stdout.strip()
    return found if done.returncode == 0 and found.isalnum() else None


# Where a job's environment (`--requirements` on top of an image) is in its container, and
# its requirements file while it is built.
ENV_TARGET = "/opt/gpuhop/env"
REQUIREMENTS_TARGET = "/opt/gpuhop/requirements.txt"
# What of the job's environment changes how pip builds (as gpuhop.agent.storage.envs says).
_BUILD_PREFIXES = ("PIP_", "UV_")
_BUILD_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "REQUESTS_CA_BUNDLE")


def build_argv(spec: dict, env_spec: dict) -> tuple:
    """The `podman run` argv (up to the command) that builds the environment of `env_spec` in
    the job's image, the environment to run it with, and the file descriptors it must
    inherit (its env file's): as the job's user, with the network (pip downloads), the
    environment's dir writable at ENV_TARGET, the requirements and the work dir (for
    requirements that name a path there) read-only, nothing else."""
    env_dir = env_spec["dir"]
    os.makedirs(env_dir, exist_ok=True)
    if os.geteuid() == 0:  # the job's user writes it
        uid, gid = (int(n) for n in spec["user"].split(":"))
        os.chown(env_dir, uid, gid)
    args = [*_run(spec), "--tmpfs", "/tmp"]
    args += _mount(env_dir, ENV_TARGET, False)
    args += _mount(env_spec["requirements"], REQUIREMENTS_TARGET, True)
    args += _mount(spec["workdir"], spec["workdir"], True)
    inside = {"HOME": "/tmp"}
    for key, value in os.environ.items():  # the job's: what changes how pip builds
        if key.upper().startswith(_BUILD_PREFIXES) or key.upper() in _BUILD_NAMES:
            inside[key] = value
    path, fd = env_file(inside)
    return [*args, "--env-file", path, spec["image"]], _for_podman(dict(os.environ)), (fd,)


def argv(spec: dict, env: dict, command: list, worker=None) -> tuple:
    """The `podman run` argv for `command` in the container, the environment to run Podman
    with, and the file descriptors it must inherit (its env file's, which holds the job's
    variables, `env`: see the module's docstring). Its network is the leader's (`--network
    host`: the host's, or the private one the leader is in)."""
    gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    args = [*_run(spec), "--name", name(spec, worker), "--init", "--read-only-tmpfs=false"]
    for gpu in gpus:
        args += ["--device", f"nvidia.com/gpu={gpu}"]
    for m in spec["mounts"]:
        args += _mount(m["source"], m["target"], m["readonly"])
    path, fd = env_file(job_variables(spec, env))
    args += ["--env-file", path]
    return [*args, spec["image"], *command], _for_podman(env), (fd,)


def job_variables(spec: dict, env: dict) -> dict:
    """The job's variables in its container: `env` less Podman's own, with its GPUs
    renumbered from 0 (the container sees only those) and its user's HOME."""
    out = {key: value for key, value in env.items() if key not in _PODMAN_OWN}
    gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
    home = spec.get("home") or env.get("HOME")  # the job's user's home (the spec mounts it)
    if home:
        out["HOME"] = home
    return out


# What the podman program itself needs of the agent's environment (the agent puts them in
# the leader's); never passed into the container (the image has its own).
_PODMAN_OWN = ("GPUHOP_PODMAN_PATH", "GPUHOP_PODMAN_HOME", "GPUHOP_PODMAN_XDG_RUNTIME_DIR")
# Podman's PATH where the agent had none (its conmon, OCI runtime and helpers are found on it).
_PODMAN_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _for_podman(env: dict) -> dict:
    """Podman's environment: the agent's PATH, HOME and XDG_RUNTIME_DIR as it put them in
    the leader's (`env`), and nothing of the job's. Whatever else the job's environment
    holds stays out: a user's variable (LD_PRELOAD, CONTAINERS_CONF, CONTAINERS_STORAGE_CONF,
    a PATH of their own) would act on Podman, root on a team agent."""
    out = {"PATH": _PODMAN_DEFAULT_PATH}
    for key in _PODMAN_OWN:
        value = env.get(key)
        if value is not None:
            out[key[len("GPUHOP_PODMAN_") :]] = value
    return out


# How long a line of Podman's env file may be (its reader's, Go's bufio.Scanner: 64 KiB).
ENV_LINE_MAX = 65536


def env_problem(key: str, value: str) -> str | None:
    """Why the variable cannot go through an env file (the agent asks before a job in an
    image starts, podman.container_args), or None."""
    if "\n" in value or "\r" in value:
        return (
            f"the value of {key} has a line break, which a job in a container image cannot be"
            " given (Podman reads its variables a line each): encode it (base64, say), or"
            " put it in a file in the work dir"
        )
    if len(key) + 1 + len(value.encode("utf-8", "surrogateescape")) >= ENV_LINE_MAX:
        return (
            f"the value of {key} is longer than a job in a container image can be given"
            f" ({ENV_LINE_MAX // 1024} KiB with its name): put it in a file in the work dir"
        )
    return None


def env_file(variables: dict) -> tuple:
    """Podman's env file of `variables` (a `KEY=VALUE` line each), in memory: its path as
    the leader's children open it (/dev/fd/N) and its descriptor N, which they inherit. A
    variable that cannot be said so (`env_problem`: the agent refused such a job) is left
    out, saying so, rather than read by Podman as another variable."""
    lines = []
    for key in sorted(variables):
        why = env_problem(key, variables[key])
        if why is not None:
            print(f"gpuhop: {why}; left out", flush=True)
            continue
        lines.append(f"{key}={variables[key]}\n")
    data = "".join(lines).encode("utf-8", "surrogateescape")
    fd = os.memfd_create("gpuhop-job-env", 0)
    os.set_inheritable(fd, True)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return f"/dev/fd/{fd}", fd


def outcome(spec: dict, result: dict, command: list | None = None) -> dict:
    """The job's end from Podman's (see the module's docstring); where Podman could not run
    the container because its image is gone (removed after the agent looked it up), that;
    where the job (`command`) failed in an image with an ENTRYPOINT, that it ran as the
    ENTRYPOINT's arguments (an ENTRYPOINT that does not run them, `["python3"]` say, is
    what failed)."""
    code = result.get("exit_code")
    if result.get("signal") is not None or code is None:
        return result
    if 128 < code < 160:
        return signalled(result)
    reference = spec.get("reference")
    if code == 125 and reference is not None and image_missing(spec) is not None:
        why = (
            f"image {reference} (id {spec['image'][:12]}) was removed from this host as the job"
            f" started; pull it there again (podman pull {reference})"
        )
        print(f"gpuhop: {why}", flush=True)
        return {**result, "detail": why}
    if code in PODMAN_STATUS and "detail" not in result:
        result = {**result, "detail": f"exited with code {code}: {PODMAN_STATUS[code]}"}
    if code not in (0, 125) and command is not None:
        first = entrypoint(spec)
        if first and eats_arguments(first):
            ran = " ".join(command)
            note = (
                f"the image's ENTRYPOINT {json.dumps(first)} ran with the job's command as its"
                f" arguments ({ran}): unless it runs them as a command (a script that ends in"
                ' exec "$@" does), the job\'s program never ran'
            )
            print(f"gpuhop: {note}", flush=True)
            said = result.get("detail") or f"exited with code {code}"
            result = {**result, "detail": f"{said}; {note}"}
    return result


def entrypoint(spec: dict) -> list | None:
    """The ENTRYPOINT of the job's image (its `podman run`s put the job's command after
    it), or None where it has none or Podman cannot say."""
    try:
        args = ("image", "inspect", "--format", "{{json .Config.Entrypoint}}", spec["image"])
        done = _call(spec, *args, capture_output=True, text=True)
        found = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return found if isinstance(found, list) and found else None


# Programs that take what follows them as their script or command, not as a command to run:
# an ENTRYPOINT of one of these never runs the job's program as such.
INTERPRETERS = ("python", "sh", "bash", "dash", "zsh", "ash")


def eats_arguments(first: list) -> bool:
    """Whether the ENTRYPOINT `first` is an interpreter that would read the job's command as
    its script (["python3"], ["/bin/sh", "-c"]) rather than a script of the image's that runs
    it (NVIDIA's /opt/nvidia/nvidia_entrypoint.sh, which ends in exec "$@"): a failure in an
    image with one of those is the job's own, and says nothing of its ENTRYPOINT."""
    name = os.path.basename(str(first[0]))
    return name.startswith("python") or name in INTERPRETERS


def signalled(result: dict) -> dict:
    """A container's end as the job's: Podman's 128+N (N a signal that ends a process) is the
    job killed by signal N (see the module's docstring); any other end as it is."""
    code = result.get("exit_code")
    if result.get("signal") is None and code is not None and 128 < code < 160:
        return {**result, "exit_code": None, "signal": code - 128}
    return result


def remove(spec: dict, names: list) -> None:
    """Remove the containers `names` at once, where they are left (a killed `podman run`
    leaves its container running)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        args = ("rm", "--force", "--ignore", "--time", "0", *names)
        _call(spec, *args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _run(spec: dict) -> list:
    """`podman run` as every container of a job runs: removed after, from the host's store
    only, output straight to the caller's, a read-only root, no capabilities nor new
    privileges, the leader's network, as the job's user, from its work dir, with the
    leader's limits."""
    args = [*_podman(spec), "run", "--rm", "--pull", "never", "--log-driver", "passthrough"]
    args += ["--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges"]
    args += ["--network", "host", "--user", spec["user"], "--workdir", spec["workdir"]]
    if spec.get("keep_id"):
        args += ["--userns", "keep-id"]
    for limit in spec["ulimits"]:
        args += ["--ulimit", limit]
    return args


def _mount(source, target, readonly: bool) -> list:
    ro = ",readonly=true" if readonly else ""
    return ["--mount", f"type=bind,source={source},destination={target}{ro}"]


def _call(spec: dict, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """`podman ARGS` run by the leader outside a container (to look up an image, to remove a
    container), with Podman's own HOME, XDG_RUNTIME_DIR and PATH: a rootless Podman finds
    its store by them, and the leader's environment is the job's."""
    env = _for_podman(dict(os.environ))  # the leader's: the agent's PATH, HOME, XDG_RUNTIME_DIR
    return subprocess.run(
        [*_podman(spec), *args], stdin=subprocess.DEVNULL, env=env, timeout=120, **kwargs
    )


def _podman(spec: dict) -> list:
    runtime = spec.get("runtime")
    return [spec["podman"], *(["--runtime", runtime] if runtime else [])]
