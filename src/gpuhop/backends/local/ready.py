"""Runs on the GPU host, in the leader server and the leaders it forks: a container started
ahead of its job (a "ready container"), so that an image job's start is a fork and an exec
in a container that is there already, not Podman's start of one (Podman's `run` takes some
150 ms here: conmon, the OCI runtime, the container's mounts and namespaces; a venv job's
whole submit → first byte is some 20 ms). Standard library only (it runs with `python -I -S`).

The leader server forks a ready container's leader ahead of the next job like the last
(leaderserver.py): the same image, user, home, GPUs, limits, gpuhop's package. That leader
runs `podman run` of the image with the `WAITER` program as its command (after the image's
ENTRYPOINT, as a job's command would be), in the shape every job of the image has
(container.py's `_run`: read-only root, no capabilities, the job's uid), and waits. What
differs between jobs is mounted when the job comes, by propagation: the container has the
jobs' root (`<state>/jobs`), /tmp and /var/tmp from empty dirs of its own (`dir`, a shared
mount on the host) with `bind-propagation=rslave`, so a bind the leader makes in those dirs
on the host (the job's work dir, artifacts, checkpoints, control dir, log, metrics and
provenance files, tmp dirs, datasets read-only) appears in the container at the path it has
on the host, as `podman run` would have mounted it. Nothing of a job is in the container
before its job: the container never runs a second job (its leader is that job's, and ends
with it), and it sees under the jobs' root nothing but its own job's files.

The job is handed over on a socket the container inherits (`--preserve-fds`, fd 3 in it):
the job's command, variables and work dir as JSON, with the job's log as an attached
descriptor, which the waiter makes its stdout and stderr before it execs the command (no
job variable is ever on a command line or in a file). The waiter is the process the
container's init (catatonit) started, so the job is too: Podman's exit status is the job's,
a cancel reaches it through `podman run` as it does a cold one's, and it is the leader's
descendant (conmon is re-parented to it: a child subreaper). What the image's ENTRYPOINT
printed before the job came is put at the head of the job's log. The waiter ends when its
socket closes without a job (the leader retired, or died): its container ends with it.

Only a root agent makes them (the binds are made on the host), for jobs of one worker with
the host's network and no requirements on top of the image; any other job, and any job
whose ready container is not there or not ready, starts with its own `podman run`.
"""

import array
import contextlib
import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import time

# The waiter, run by the image's python3 as the container's command: say "r"eady, read the
# job (its JSON, with the log as the first message's descriptor), take the log as its
# output, and become the job's command. Old Pythons too (no socket.recv_fds before 3.9).
WAITER = r"""
import array, json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, 3)
s.sendall(b"r")
chunks, fds = [], array.array("i")
while True:
    data, ancillary, _flags, _addr = s.recvmsg(1 << 16, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data:
        break
    chunks.append(data)
s.close()
if not chunks or not fds:
    sys.exit(0)
job = json.loads(b"".join(chunks).decode("utf-8", "surrogateescape"))
os.dup2(fds[0], 1)
os.dup2(fds[0], 2)
os.close(fds[0])
env = dict(os.environ)
env.update(job["env"])
argv = job["argv"]
try:
    os.chdir(job["cwd"])
    os.execvpe(argv[0], argv, env)
except OSError as e:  # as the init of a `podman run` says it (endings.NO_PROGRAM)
    os.write(2, ("gpuhop: failed to exec the job's program: %s\n" % e.strerror).encode())
    os._exit(1)
"""

NAME_PREFIX = "gpuhop-ready"
# Where in a ready container's own dir each propagating mount's source is.
JOBS, TMP, VAR_TMP = "jobs", "tmp", "vartmp"
# How long a leader waits for its ready container's waiter to say it runs, before the job
# starts with a `podman run` of its own instead (Podman's start, under load: seconds).
READY_SECONDS = 20.0
# The exit code of a ready container's leader whose container ended before its job came.
GONE = 3

MS_RDONLY, MS_NOSUID, MS_NODEV = 0x1, 0x2, 0x4
MS_REMOUNT, MS_BIND, MS_REC, MS_SHARED = 0x20, 0x1000, 0x4000, 0x100000
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def key(spec: dict) -> str:
    """What makes two jobs' ready containers the same: the ready spec, whole."""
    return json.dumps(spec, sort_keys=True)


def _mount(source, target: str, flags: int, fstype=None, data=None) -> None:
    result = _libc.mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


class Ready:
    """One ready container, made and held by its leader (see the module's docstring).
    `spec` is what the agent asked for (podman.ready_spec): `podman`, `runtime`, `image`,
    `user`, `keep_id`, `ulimits`, `gpus`, `mounts` (the fixed ones), `jobs` (the jobs' root)
    and `base` (where ready containers' own dirs are)."""

    def __init__(self, spec: dict):
        self.spec = spec
        me = os.getpid()
        self.name = f"{NAME_PREFIX}-{me}-{_start_time(me)}"
        self.dir = os.path.join(spec["base"], self.name)
        self.pid: int | None = None  # `podman run`'s
        self.sock: socket.socket | None = None
        self.said_ready = False
        self.claimed = False

    def start(self) -> None:
        """Make its dir (a shared mount) and start its container; OSError if either fails."""
        os.makedirs(self.spec["base"], mode=0o700, exist_ok=True)
        os.mkdir(self.dir, 0o700)
        for sub in (JOBS, TMP, VAR_TMP):
            os.mkdir(os.path.join(self.dir, sub), 0o755)
        _mount(self.dir, self.dir, MS_BIND)
        _mount(None, self.dir, MS_SHARED | MS_REC)
        # The mount points of a job's paths are made in memory as it comes (a dir or file
        # made on the disk costs a journal's write each: a millisecond here).
        jobs = os.path.join(self.dir, JOBS)
        _mount("tmpfs", jobs, MS_NOSUID | MS_NODEV, "tmpfs", "mode=0755,size=1m,nr_inodes=4096")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        container = _sibling("container")
        argv, env = self._argv(container)
        pre = os.open(
            os.path.join(self.dir, "pre.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
        )
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                # Out of the way first: either may be 0-3, which the dup2s below fill.
                sock_fd = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD, 10)
                pre_fd = fcntl.fcntl(pre, fcntl.F_DUPFD, 10)
                null = fcntl.fcntl(os.open(os.devnull, os.O_RDONLY), fcntl.F_DUPFD, 10)
                os.dup2(null, 0)
                os.dup2(pre_fd, 1)
                os.dup2(pre_fd, 2)
                os.dup2(sock_fd, 3)  # inheritable: Podman passes it on (--preserve-fds 1)
                os.closerange(4, 65536)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        os.close(pre)
        theirs.close()
        self.pid, self.sock = pid, ours

    def _argv(self, container) -> tuple:
        spec = self.spec
        run = {**spec, "workdir": "/"}
        args = [*container._run(run), "--name", self.name, "--init", "--read-only-tmpfs=false"]
        args += ["--preserve-fds", "1"]
        for gpu in spec["gpus"]:
            args += ["--device", f"nvidia.com/gpu={gpu}"]
        for m in spec["mounts"]:
            args += container._mount(m["source"], m["target"], m["readonly"])
        for sub, target in ((JOBS, spec["jobs"]), (TMP, "/tmp"), (VAR_TMP, "/var/tmp")):
            source = os.path.join(self.dir, sub)
            args += ["--mount", f"type=bind,source={source},destination={target}"
                     ",bind-propagation=rslave"]  # fmt: skip
        args += [spec["image"], "python3", "-I", "-S", "-c", WAITER]
        return args, container._for_podman(dict(os.environ))

    def poll(self) -> bool:
        """Read what the waiter said, without waiting: False once it is gone (its container
        ended), True while it lives."""
        if self.sock is None:
            return False
        try:
            said = self.sock.recv(1, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if said:
            self.said_ready = True
            return True
        return False

    def claim(self, spec: dict) -> bool:
        """Take this container for the job whose container spec is `spec` (container.py):
        wait until its waiter runs, and mount the job's own paths in it; False, leaving
        nothing mounted, where it cannot (the job then starts a container of its own)."""
        plan = self._plan(spec)
        if plan is None:
            return False
        deadline = time.monotonic() + READY_SECONDS
        while not self.said_ready and self.sock is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return False
            if not self.poll():
                return False
        if self.sock is None or not self.said_ready:
            return False
        try:
            for source, point, readonly in plan:
                if os.path.isdir(source):
                    os.makedirs(point, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(point), exist_ok=True)
                    os.close(os.open(point, os.O_WRONLY | os.O_CREAT, 0o600))
                _mount(source, point, MS_BIND)
                if readonly:
                    _mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            self._under_tmp()
            # Its mount points made, the jobs' root is read-only, as a container's own root
            # is where `podman run` made them (the tmpfs itself: its copy in the container too).
            jobs = os.path.join(self.dir, JOBS)
            _mount(None, jobs, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        except OSError as e:
            print(f"gpuhop: the job's ready container could not be used ({e})", flush=True)
            self._unmount()
            return False
        self.claimed = True
        return True

    def _under_tmp(self) -> None:
        """Where the jobs' root (or the home) lies under /tmp or /var/tmp (an agent of a
        temporary dir), the job's tmp dir, mounted there after them, covers them in the
        container: bind them again inside it, as `podman run` mounts them over the job's
        /tmp. The dirs on the way are the job's tmp dir's, which a job of an earlier attempt
        wrote: made and entered without following a link."""
        binds = [(os.path.join(self.dir, JOBS), self.spec["jobs"], False)]
        binds += [(m["source"], m["target"], m["readonly"]) for m in self.spec["mounts"]]
        for sub, tmp in ((TMP, "/tmp"), (VAR_TMP, "/var/tmp")):
            for source, target, readonly in binds:
                if not target.startswith(tmp + "/"):
                    continue
                if readonly:
                    raise OSError(f"{target}: a read-only mount under {tmp}")
                fd = _open_dirs(os.path.join(self.dir, sub), target[len(tmp) + 1 :])
                try:
                    _mount(source, f"/proc/self/fd/{fd}", MS_BIND | MS_REC)
                finally:
                    os.close(fd)

    def _plan(self, spec: dict):
        """Each of the job's mounts as (source, where on the host it goes to reach the
        container, read-only), parents first; None where one is neither the ready
        container's own nor under a dir that propagates (so it could not be there)."""
        fixed = {(m["source"], m["target"], m["readonly"]) for m in self.spec["mounts"]}
        jobs = self.spec["jobs"].rstrip("/") + "/"
        plan = []
        for m in spec["mounts"]:
            source, target, readonly = m["source"], m["target"], m["readonly"]
            if (source, target, readonly) in fixed:
                continue
            if target == "/tmp":
                point = os.path.join(self.dir, TMP)
            elif target == "/var/tmp":
                point = os.path.join(self.dir, VAR_TMP)
            elif target.startswith(jobs) and ".." not in target.split("/"):
                point = os.path.join(self.dir, JOBS, target[len(jobs) :])
            else:
                return None
            plan.append((source, point, readonly))
        if len(plan) != len(spec["mounts"]) - len(fixed):
            return None  # a fixed mount of the ready container's is not the job's
        return sorted(plan, key=lambda p: p[1].count("/"))

    def hand_over(self, command: list, env: dict, cwd: str, log_fd: int) -> int:
        """Give the claimed container its job; the pid of its `podman run` (this process's
        child), whose exit status is the job's."""
        pre = os.path.join(self.dir, "pre.log")
        with contextlib.suppress(OSError), open(pre, "rb") as f:
            head = f.read()  # what the image's ENTRYPOINT said before the job came
            while head:
                head = head[os.write(log_fd, head) :]
        data = json.dumps({"argv": command, "env": env, "cwd": cwd}).encode(
            "utf-8", "surrogateescape"
        )
        sock, pid = self.sock, self.pid
        assert sock is not None and pid is not None, "hand_over of a container never started"
        log = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [log_fd]))
        sent = sock.sendmsg([data[: 1 << 16]], [log])
        if sent < len(data):
            sock.sendall(data[sent:])
        sock.shutdown(socket.SHUT_WR)
        return pid

    def release(self) -> None:
        """Let the container go unused (its job starts a container of its own): its waiter
        reads the end of its socket and ends it; `close` waits for that."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def close(self) -> None:
        """End the container where it has no job (its waiter reads the end of its socket),
        and wait for its `podman run`; then take down its mounts and dir."""
        self.release()
        if self.pid is not None:
            with contextlib.suppress(ChildProcessError):
                while True:
                    try:
                        os.waitpid(self.pid, 0)
                        break
                    except InterruptedError:
                        continue
            self.pid = None
        self._unmount()
        sweep_dir(self.dir)

    def _unmount(self) -> None:
        """Take down the job's mounts in the ready container's dir (never its own)."""
        for point in reversed(mounts_under(self.dir)):
            if point != self.dir:
                with contextlib.suppress(OSError):
                    _umount(point)


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dirs(top: str, relative: str) -> int:
    """The dir `relative` under `top`, made where missing, each step entered as a dir and
    never through a link; an open descriptor of it."""
    fd = os.open(top, DIR_FLAGS)
    try:
        for name in [part for part in relative.split("/") if part]:
            if name in (".", ".."):
                raise OSError(f"{relative}: not a plain path")
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
            step = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _umount(point: str) -> None:
    if _libc.umount2(point.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {point}: {os.strerror(err)}")


def mounts_under(top: str) -> list[str]:
    """The mount points at or under `top`, in the order they were mounted."""
    top = top.rstrip("/")
    found: list[str] = []
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split(b" ")
        if len(fields) < 5:
            continue
        point = fields[4].decode("utf-8", "surrogateescape")
        point = point.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
        if point == top or point.startswith(top + "/"):
            found.append(point)
    return found


def sweep_dir(path: str) -> bool:
    """Take down a ready container's dir: every mount in it (deepest first), then what
    `Ready.start` and `claim` made in it (dirs and empty mount points, never a file with
    bytes: after the unmounts none is the job's). False where a mount stayed."""
    for point in reversed(mounts_under(path)):
        with contextlib.suppress(OSError):
            _umount(point)
    if mounts_under(path):
        return False
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))
        for name in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, name))
    with contextlib.suppress(OSError):
        os.rmdir(path)
    return True


def sweep(base: str) -> None:
    """Take down the dirs of ready containers in `base` whose leader is gone (left by a
    leader or server that was killed); a live one's (its job may run) stays."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        parts = name[len(NAME_PREFIX) + 1 :].split("-") if name.startswith(NAME_PREFIX) else []
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        if _start_time(int(parts[0])) == parts[1]:
            continue  # its leader lives
        sweep_dir(os.path.join(base, name))


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return "gone"
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else "gone"


def _sibling(name: str):
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    return __import__(name)
