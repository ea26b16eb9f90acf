"""Runs on the GPU host as each job's process-group leader: starts the job, waits, records.

Started by the supervisor as `python -I -S leader.py STATUS_FILE PID_FILE [--gang SPEC]
[--relay SOCKET] -- COMMAND...` in a new session, with stdout and stderr already pointing
at the job's log (or forked, as just that, by the warm leader server: leaderserver.py).
It imports the standard library only (fast start, and no path to gpuhop's modules under
-I), outlives an agent restart, and writes the job's exit status to STATUS_FILE
atomically, so a restarted agent still learns how the job ended. Signals sent to the
group (cancel) reach the job; the leader itself keeps waiting for it.

With `--gang SPEC` (a JSON file from the supervisor) it runs a multi-worker job: one
process per worker, each with its own environment, log file and TF_CONFIG (or Keras 3's
distribution variables: gangenv.py), all inside a
private network namespace so TensorFlow's unauthenticated gRPC ports (which bind every
interface) are reachable from nowhere but each other. Worker logs are merged into the
job's log line by line with a `[worker I]` prefix. When one worker fails, the others
are stopped (gang failure) and the status says which worker ended first and how.

With `--relay SOCKET` the job runs in a private network namespace (a multi-worker job
already does), and the leader relays connections from the Unix socket SOCKET to ports
inside it, so the agent can forward them (relay.py).

With `--container SPEC` the job (each worker) runs in a container image through Podman
(container.py): Podman, not the sandbox, gives it its own view of the host. A leader the
server forked with a container started ahead (`READY`: ready.py) runs a one-worker job in
that container instead of a `podman run` of its own, where the job's mounts allow.

With `--env SPEC` it first builds (or finds) the job's Python environment (envbuild.py);
with `--sandbox SPEC` (every job, where the host allows namespaces) it runs the job in its
own view of the host, where the state dir holds only the job's files and its datasets are
mounted read-only (sandbox.py). The leader then stays outside and its child, the first process
of the job's PID namespace, runs the job and reports the result on a pipe; the leader records
it once that child, and so every process of the job, has ended. Both modules sit beside this
file and use the standard library only.
"""

import contextlib
import ctypes
import errno
import json
import os
import signal
import sys
import time

POLL_SECONDS = 0.05
# The container this leader started ahead of its job, where the leader server forked it as
# a ready container's (ready.Ready: leaderserver.py sets it); None for any other leader.
READY = None
PR_SET_CHILD_SUBREAPER = 36


def _write_atomic(path: str, data: dict, durable: bool = True) -> None:
    with open(tmp := f"{path}.tmp", "w") as f:
        json.dump(data, f)
        f.flush()
        if durable:  # not a pid file: after a crash of the host, its processes are gone
            os.fsync(f.fileno())
    os.replace(tmp, path)


def _outcome(status: int) -> dict:
    if os.WIFSIGNALED(status):
        return {"exit_code": None, "signal": os.WTERMSIG(status)}
    return {"exit_code": os.WEXITSTATUS(status), "signal": None}


def how(outcome: dict) -> str:
    if outcome["signal"] is not None:
        try:
            name = signal.Signals(outcome["signal"]).name
        except ValueError:
            name = "?"
        return f"was killed by signal {outcome['signal']} ({name})"
    return f"exited with code {outcome['exit_code']}"


def _spawn(command: list, env: dict | None = None, log_fd: int | None = None, worker=None) -> int:
    inherited: tuple = ()
    if _CONTAINER and READY is not None and READY.claimed and worker is None:
        # The job runs in the container started ahead of it (ready.py): no `podman run`.
        inside = _sibling("container").job_variables(
            _CONTAINER, dict(os.environ if env is None else env)
        )
        out = 1 if log_fd is None else log_fd
        try:
            return READY.hand_over(command, inside, _CONTAINER["workdir"], out)
        except OSError as e:  # its container ended since the claim (its image removed, say)
            print(f"gpuhop: the container started ahead of the job ended ({e})", flush=True)
            READY.claimed = False
            READY.release()
    if _CONTAINER:  # the job (this worker) runs in its container, through `podman run`
        base = dict(os.environ)
        env = base if env is None else env
        command, env, inherited = _sibling("container").argv(_CONTAINER, env, command, worker)
    pid = os.fork()
    if pid == 0:
        if log_fd is not None:
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
        try:
            if env is None:
                os.execvp(command[0], command)
            os.execvpe(command[0], command, env)
        except OSError as e:
            os.write(
                2, f"gpuhop: cannot start {command[0]!r}: {_why_not(command[0], e)}\n".encode()
            )
        os._exit(127)
    for fd in inherited:  # the child's now (its env file: podman reads it)
        os.close(fd)
    return pid


def _why_not(program: str, error: OSError) -> str:
    """Why exec failed, in words: a script that is there but whose #! interpreter is not
    fails with ENOENT, which would read as the script missing."""
    if error.errno != errno.ENOENT or not os.path.isfile(program):
        return error.strerror or str(error)
    try:
        with open(program, "rb") as f:
            line = f.readline(256)
    except OSError:
        return error.strerror or str(error)
    if not line.startswith(b"#!"):
        return error.strerror or str(error)
    interpreter = line[2:].rstrip(b"\n").strip(b" \t").decode(errors="backslashreplace")
    if interpreter.endswith("\r"):
        return (
            f"its #! line ends in a carriage return (Windows line endings), so its interpreter"
            f" is {interpreter!r}, which does not exist: convert the file to Unix line endings"
            f" (dos2unix, or sed -i 's/\\r$//' FILE) and run it again"
        )
    return f"the interpreter its #! line names, {interpreter!r}, is not on this host"


def run_single(command: list, private: bool = False, relay=None) -> dict:
    """Run the job's command, in a private network if `private`; `relay`, a listening
    socket, then serves its ports."""
    if private:
        refused = _sibling("jobnet").entered_or_refusal("This job asked for one")
        if refused is not None:
            return refused
    pid = _spawn(command)
    if relay is not None:
        _start_relay(relay)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return _outcome(status)
        except ChildProcessError:
            return {"exit_code": 0, "signal": None}


# -- multi-worker ---------------------------------------------------------------------------


class LogTail:
    """Copies a worker's log into the job's log, whole lines only, each with a prefix."""

    def __init__(self, path: str, prefix: str, offset: int = 0):
        self.path = path
        self.prefix = prefix.encode()
        self.offset = offset  # where this attempt's lines start: a retry appends to the log
        self.partial = b""

    def pump(self, final: bool = False) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        if lines:
            os.write(1, b"".join(self.prefix + line + b"\n" for line in lines))


def _listen_relay(path: str):
    try:
        return _sibling("relay").listen(path)
    except OSError as e:
        print(f"gpuhop: cannot relay the job's ports from {path}: {e}", flush=True)
        return None


def _start_relay(listener) -> None:
    # After the job's processes are forked: the relay's threads must not exist at fork.
    if listener is not None:
        _sibling("relay").serve(listener)


def run_gang(spec: dict, command: list, relay=None) -> dict:
    workers = spec["workers"]
    refused = _sibling("jobnet").entered_or_refusal("Multi-worker jobs need one")
    if refused is not None:
        refused["detail"] = "no private network for the workers"
        return refused
    ports, mode = _sibling("jobnet").free_ports(len(workers)), spec.get("mode", "tf")
    running: dict = {}
    tails = []
    pumps = []
    for index, worker in enumerate(workers):
        env = dict(os.environ, **worker["env"])
        env.update(_sibling("gangenv").worker_env(mode, ports, index))
        log_fd = os.open(worker["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # The worker's log holds the earlier attempts' output too (logs --worker I shows
        # all): only what this attempt adds goes into the job's log, not theirs again.
        tails.append(LogTail(worker["log"], f"[worker {index}] ", os.fstat(log_fd).st_size))
        if _MASKED:  # the worker's own log is shown too (logs --worker I): masked as well
            pump, pipe = _sibling("mask").start(_MASKED, log_fd)
            os.close(log_fd)
            pumps.append(pump)
            log_fd = pipe
        running[_spawn(command, env, log_fd, index)] = index
        os.close(log_fd)
    if relay is not None:
        _start_relay(relay)
    first = None
    kill_at = None
    while running:
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                running.clear()
                break
            if pid == 0:
                break
            index = running.pop(pid, None)
            if index is None:
                continue
            outcome = _outcome(status)
            if _CONTAINER:  # a worker's container: Podman says its job killed by N as 128+N
                outcome = _sibling("container").signalled(outcome)
            if first is None and (outcome["signal"] is not None or outcome["exit_code"] != 0):
                first = (index, outcome, len(running))
                for other in running:
                    _signal(other, signal.SIGTERM)
                kill_at = time.monotonic() + spec.get("grace", 10)
        if kill_at is not None and time.monotonic() > kill_at:
            for other in running:
                _signal(other, signal.SIGKILL)
            kill_at = None
        for tail in tails:
            tail.pump()
        time.sleep(POLL_SECONDS)
    for pump in pumps:
        _sibling("mask").finish(pump)
    for tail in tails:
        tail.pump(final=True)
    if first is None:
        return {"exit_code": 0, "signal": None}
    index, outcome, stopped = first
    detail = f"worker {index} {how(outcome)} first"
    if stopped:
        detail += f"; {stopped} other worker{'s were' if stopped > 1 else ' was'} stopped"
    detail += peers_hint(workers[index]["log"], spec.get("timeout"), index)
    return {**outcome, "detail": detail}


def peers_hint(log_path: str, timeout: object, index: int) -> str:
    """What to add to the end of a gang whose first failed worker `index` gave up waiting
    for its peers (TensorFlow's registration deadline, in its log): "" otherwise."""
    if not _peers_never_joined(log_path):
        return ""
    return (
        f" (its peers did not join within {timeout if timeout is not None else '?'}s;"
        f" see gpuhop logs JOB --worker {index})"
    )


def _peers_never_joined(log_path: str) -> bool:
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - 16384))
            tail = f.read()
    except OSError:
        return False
    return b"DeadlineExceeded" in tail and b"register" in tail.lower()


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


USAGE = (
    "usage: leader.py STATUS PID_FILE [--gang SPEC] [--env SPEC] [--sandbox SPEC] [--relay SOCKET]"
    " [--mask VAR,...] [--container SPEC] -- COMMAND..."
)
# The values of the job's secrets (`--mask`: the variables that hold them), masked in its
# output by a pump between the job and its log (mask.py).
_MASKED: list = []
# With `--container SPEC`: the container the job runs in (container.py). Its network is
# `podman run`'s own (`--network host`), which is the leader's: the host's, or the job's
# private one, which the leader made first. (`--network ns:PATH` would have Podman set its
# default sysctls there, which runc refuses outside a namespace of the container's own.)
_CONTAINER: dict = {}
# The first signal that asked the job to stop (a cancel, a time limit), if any came.
_STOPPED_BY: list[int] = []


def _note_signal(sig: int, _frame: object) -> None:
    if not _STOPPED_BY:
        _STOPPED_BY.append(sig)


def _mask_output(names: str) -> int | None:
    """With secrets, put a masking pump between this process's output (the job's log) and
    whatever writes it from now on; its pid, or None without secrets."""
    _MASKED[:] = [os.environ[n] for n in names.split(",") if os.environ.get(n)]
    if not _MASKED:
        return None
    pid, pipe = _sibling("mask").start(_MASKED, 1)
    os.dup2(pipe, 1)
    os.dup2(pipe, 2)
    os.close(pipe)
    return pid


def _end_output(pump: int | None) -> None:
    """Close this process's end of the masking pump's pipe and wait for it to write all."""
    if pump is None:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    _sibling("mask").finish(pump)


def main(argv: list, given: dict | None = None) -> int:
    status_path, pid_path, *rest = argv
    specs = dict(given or {})  # from the leader server's request: as --sandbox would give
    relay = None
    masked = ""
    flags = (["--gang"], ["--env"], ["--sandbox"], ["--relay"], ["--mask"], ["--container"])
    while rest[:1] in flags and len(rest) > 1:
        if rest[0] == "--relay":
            relay = rest[1]
        elif rest[0] == "--mask":
            masked = rest[1]
        else:
            with open(rest[1]) as f:
                specs[rest[0][2:]] = json.load(f)
        rest = rest[2:]
    if rest[:1] != ["--"] or len(rest) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    command = rest[1:]
    # With its start time: an agent that adopts the job from this file after a crash must
    # not take a process that got the pid once this one was gone for the job's leader.
    pid_record: dict = {"pid": os.getpid(), "pid_start": _start(os.getpid())}
    if "container" in specs:
        _CONTAINER.update(specs["container"])
        _adopt_orphans()
        if READY is not None:  # a container started ahead (ready.py), for a job it can run
            alone = "gang" not in specs and relay is None and "env" not in specs
            if not (alone and READY.claim(_CONTAINER)):
                READY.release()
        workers = range(len(specs["gang"]["workers"])) if "gang" in specs else [None]
        pid_record["containers"] = [_sibling("container").name(_CONTAINER, w) for w in workers]
        if READY is not None and READY.claimed:  # named so until the job runs in it
            pid_record["containers"].append(READY.name)
    _write_atomic(pid_path, pid_record, durable=False)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A handler, not SIG_IGN: exec resets handled signals to their default in the child.
        signal.signal(sig, _note_signal)
    # Before anything is written to the log; the pump, forked here, outlives the job's end.
    pump = _mask_output(masked) if masked else None
    # Bound now, while the job's dir is in view: the sandbox hides it from the job.
    listener = _listen_relay(relay) if relay is not None else None
    report = None
    if _CONTAINER:  # Podman gives it its own view of the host, not the sandbox
        result = _failed(_sibling("container").prepare(_CONTAINER, specs.get("env")))
    elif specs.get("sandbox", {}).get("identity"):
        private = relay is not None or "gang" in specs
        result, report = _enter_as_identity(specs, pid_path, private)
    else:
        result = _prepare(specs)
        if result is None and "sandbox" in specs:
            # The parent stays outside: it records the result the child (which runs the job
            # in its namespaces) reports, once every process of the job has ended.
            result, report = _enter_sandbox(specs["sandbox"], pid_path)
    if result is None:
        if "gang" in specs:
            result = run_gang(specs["gang"], command, listener)
        else:
            result = run_single(command, relay is not None, listener)
        if _CONTAINER:
            result = _sibling("container").outcome(_CONTAINER, result, command)
    if _CONTAINER:  # none is left, however the job ended
        _sibling("container").remove(_CONTAINER, pid_record["containers"])
    if READY is not None:  # its mounts and dir
        READY.close()
    result["ended_at"] = time.time()
    if report is not None:
        os.write(report, json.dumps(result).encode())
        return 0
    _end_output(pump)  # the log is whole before the status says the job ended
    if relay is not None:
        with contextlib.suppress(OSError):
            os.unlink(relay)
    _write_atomic(status_path, result)
    return 0


def _sibling(name: str):
    # -I leaves this file's directory off sys.path; the helpers beside it are stdlib-only.
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    return __import__(name)


def _adopt_orphans() -> None:
    """Make the leader the parent of its descendants' orphans (a child subreaper). Podman's
    conmon, which parents a container's processes, leaves `podman run` (double fork): without
    this it would be re-parented to the host's init, and the job's processes would not be the
    leader's descendants, which is how the agent finds them (stacks, profiles, the listener a
    forward reaches, the GPU memory a job holds). The leader waits for its own children by
    pid; the adopted conmon it reaps as it ends, or the host's init does after it."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _failed(why: str | None) -> dict | None:
    """None if nothing failed; else the job's result, `why` said in its log. A preparation
    that failed because the job was stopped meanwhile (its pip or Podman killed by the same
    signal) says that, not the killed program's words."""
    if why is None:
        return None
    if _STOPPED_BY:
        why = f"stopped by {signal.Signals(_STOPPED_BY[0]).name} before the job started"
    print(f"gpuhop: {why}", flush=True)
    return {"exit_code": 1, "signal": None, "detail": why}


def _prepare(specs: dict) -> dict | None:
    """Build the job's environment, if it has one; a failure ends the job here."""
    if "env" not in specs:
        return None
    return _failed(_sibling("envbuild").prepare(specs["env"]))


def _enter_as_identity(specs: dict, pid_path: str, private: bool) -> tuple:
    """As `_enter_sandbox`, for a job with an identity of its own (a team agent's): its
    environment is built in the sandbox as that identity, its private network made while
    the child may still make one, and then the child becomes that identity for good."""
    spec, env = specs["sandbox"], specs.get("env") or {}
    lock = None
    if env:
        lock, built = _sibling("envbuild").claim(env)
        if built:
            lock.close()
            lock = None
        else:  # the environment's dir is the job's to write until it is built
            for entry in spec["keep"]:
                if entry["path"] == env["dir"]:
                    entry["readonly"] = False
    result, report = _enter_sandbox(spec, pid_path)
    if result is not None or report is None:  # the parent (or no sandbox was had)
        if lock is not None:
            lock.close()  # the child holds the lock (the same open file) while it builds
        return result, report
    sandbox = _sibling("sandbox")
    if lock is not None:
        error = _build_as(spec["identity"], env)
        sandbox._remount_readonly(env["dir"])
        lock.close()
        if error is not None:
            print(f"gpuhop: {error}", flush=True)
            return {"exit_code": 1, "signal": None, "detail": error}, report
    if private:
        refused = _sibling("jobnet").entered_or_refusal("This job asked for one")
        if refused is not None:
            return refused, report
    try:
        sandbox.become(spec["identity"])
    except OSError as e:
        detail = f"could not run the job as its own identity ({e})"
        print(f"gpuhop: {detail}", flush=True)
        return {"exit_code": 1, "signal": None, "detail": detail}, report
    return None, report


def _build_as(identity: dict, env: dict) -> str | None:
    """Build the job's environment in a process of the job's identity, with the job's
    variables but none that would make Python run more than pip (the start-up hook)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        code = 1
        try:
            _sibling("sandbox").become(identity)
            for name in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE"):
                os.environ.pop(name, None)
            error = _sibling("envbuild").build(env)
            if error is not None:
                os.write(write_end, error.encode())
            code = 0 if error is None else 1
        except BaseException as e:
            os.write(write_end, f"building the environment failed: {e}".encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        error = r.read().decode(errors="replace")
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return error or f"building the environment {how(_outcome(status))}"


def _enter_sandbox(spec: dict, pid_path: str) -> tuple:
    """Fork into the job's namespaces. The child returns (None, fd to report its result on)
    and goes on to run the job; the parent waits for it and returns (its result, None)."""
    sandbox = _sibling("sandbox")
    read_end, write_end = os.pipe()
    try:
        child = sandbox.enter(spec)
    except OSError as e:
        os.close(read_end)
        os.close(write_end)
        detail = (
            f"could not give the job its own view of the host ({e}). Every job runs in"
            f" private mount and PID namespaces: {sandbox.HOW_TO_ALLOW}"
        )
        print(f"gpuhop: {detail}", flush=True)
        return {"exit_code": 1, "signal": None, "detail": detail}, None
    if child == 0:
        os.close(read_end)
        return None, write_end
    os.close(write_end)
    # The agent releases the job's GPUs once this process is gone: the PID namespace's
    # first process ends only after every other process in it has.
    record = {"pid": os.getpid(), "pid_start": _start(os.getpid())}
    _write_atomic(pid_path, {**record, "init": child, "init_start": _start(child)}, False)
    with os.fdopen(read_end, "rb") as r:
        report = r.read()
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    try:
        result = json.loads(report)
    except ValueError:
        result = _outcome(status)
    return result, None


def _start(pid: int):
    """A process's start time (as gpuhop.backends.procs reads it), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
