"""Runs on the GPU host, in a job's leader: gives every job its own view of the host, in which
the agent's state dir holds only the job's own files. Standard library only (the leader runs
with `python -I -S`).

Jobs run as the agent's OS user, so file modes protect nothing (a file of one's own uid can
be chmod'ed back to writable). Instead the job runs in private namespaces made by its leader:

- a mount namespace, with every mount made private first (nothing propagates back to the
  host), in which a small tmpfs covers the agent's state dir and only what the job may see
  is bound back at its own path: its work dir, artifacts, checkpoints, metrics file and
  logs (writable), its Python environment and what else it may read (read-only). The
  agent's socket, job store, tokens, TLS key, blobs, trees, datasets and every other job's
  dir are not there. Each dataset's assembled tree (and a model server's SavedModel) is
  bind-mounted at its mount point in the work dir and remounted read-only. Where the job's
  tree has a checkout, the work dir bound back is an overlay of it (workview.py). The tmpfs
  itself is read-only. The job's own temporary dir (`tmp` in the spec, in its job dir, kept
  with the job's files) is bound over `/tmp`, so what it writes there neither collides with
  other jobs nor the host's; where the state dir (or anything else the job must see) lies
  under `/tmp`, it is bound back at its own path inside that;
- a PID namespace with its own /proc, so the job sees and signals only its own processes
  and cannot reach the host's mounts through another process's /proc/PID/root; when its
  first process (the leader's child) ends, the kernel kills every process left in it, so
  `setsid` is no escape;
- for an agent that is not root, a user namespace that maps the uid to itself (no
  privilege is gained outside it). The job's program starts with no capabilities: a
  non-root uid loses them on exec, and for root the leader empties the bounding set. So the
  job cannot unmount or remount; `no_new_privs` stops set-uid programs giving them back,
  and mounts made by a more privileged namespace stay locked in any namespace the job
  makes itself.

The sources are opened (O_PATH) before the tmpfs hides them and bound from /proc/self/fd,
and the job starts in its work dir looked up again after the mounts, so no directory of the
real state dir stays reachable through an old reference.

`python sandbox.py --run SPEC -- COMMAND...` runs COMMAND in such a view (as the spec's
identity), for the agent's probes of a job's interpreter.

`python sandbox.py --probe` says whether this host lets a job have such a view (exit 0), or
why not (the reason on stderr, exit 1): the agent asks once at start.
"""

import ctypes
import errno
import os
import re
import resource
import stat
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 0x400, 0x800, 0x200000
ST_NOATIME, ST_NODIRATIME, ST_RELATIME = 0x400, 0x800, 0x1000
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
# What to allow, for the messages of the leader and the agent.
HOW_TO_ALLOW = (
    "run the agent as root, or allow unprivileged user namespaces"
    " (sysctl kernel.unprivileged_userns_clone=1, and on Ubuntu 24.04+"
    " kernel.apparmor_restrict_unprivileged_userns=0)"
)

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(OSError):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _remount_readonly(target: str, keep_flags: bool = False) -> None:
    """Make the mount at `target` read-only, and (unless `keep_flags`, which keeps a
    mount's own nodev) no set-uid programs or devices on it either."""
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if keep_flags else MS_NODEV)
    _mount(None, target, None, flags | _locked_flags(target))


def _remount_writable(target: str) -> None:
    # A bind of a path on a read-only mount is read-only too, until remounted so.
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | _locked_flags(target))


def _locked_flags(target: str) -> int:
    """The flags of the mount at `target` that a remount must keep (the kernel refuses to
    clear them where they are locked, and they are never to be loosened here)."""
    have = os.statvfs(target).f_flag
    flags = 0
    for st, ms in ((os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC)):
        if have & st:
            flags |= ms
    for st, ms in ((ST_NOATIME, MS_NOATIME), (ST_NODIRATIME, MS_NODIRATIME)):
        if have & st:
            flags |= ms
    if have & ST_RELATIME:
        flags |= MS_RELATIME
    return flags


def enter(spec: dict) -> int:
    """Make the namespaces and fork. In the parent, returns the child's pid; in the child
    (PID 1 of the new PID namespace) sets up the mounts, drops privileges for what it will
    exec, and returns 0. Raises SandboxError (in the parent) if the namespaces cannot be made.
    """
    uid, gid = os.getuid(), os.getgid()
    # The mount namespace is the child's alone: the leader outside must still see the real
    # state dir (it writes the job's status there).
    flags = CLONE_NEWPID
    if uid != 0:
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(flags), "unshare")
    if uid != 0:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        # The child reports whether its mounts worked before it runs anything.
        os.close(write_end)
        with os.fdopen(read_end, "rb") as r:
            report = r.read().decode()
        if report:
            os.waitpid(pid, 0)
            raise SandboxError(0, report)
        return pid
    os.close(read_end)
    try:
        _check(_libc.unshare(CLONE_NEWNS), "unshare")
        _setup(spec, uid)
    except OSError as e:
        os.write(write_end, str(e).encode() or b"sandbox set-up failed")
        os._exit(1)
    os.close(write_end)
    return 0


def _open(path: str, kinds: tuple) -> int:
    """An O_PATH descriptor of `path`, which must be one of `kinds` (no link)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not any(kind(mode) for kind in kinds):
        os.close(fd)
        raise SandboxError(0, f"{path} is not a {'directory' if kinds == DIRS else 'file'}")
    return fd


DIRS = (stat.S_ISDIR,)
DIRS_OR_FILES = (stat.S_ISDIR, stat.S_ISREG)


def _bind_fd(fd: int, target: str, readonly: bool, writable: bool = False) -> None:
    """Bind the file or dir of `fd` at `target`: `readonly`, or with `writable` made
    writable where its source's mount is read-only."""
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    if readonly:
        _remount_readonly(target)
    elif writable:
        _remount_writable(target)


def _make_target(target: str, directory: bool) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if directory:
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o600))


def _setup(spec: dict, uid: int) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # First: what follows reads its own processes in /proc (workview's idmapping).
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    home = os.path.realpath(spec["home"])
    work = os.path.realpath(spec["work"])
    if spec.get("lower"):
        # Before the work dir is opened below: the job is given the overlay, not the dir.
        # And before the world is made read-only: the overlay keeps its upper layer's
        # mount as it was when mounted, writable.
        _sibling("workview").mount(spec, _mount)
    identity = spec.get("identity")
    if identity:
        # Before any mount of the view's own: those are made writable only where meant.
        _readonly_everywhere()
    tmp = spec.get("tmp")
    tmp_fd = _open(tmp, DIRS) if tmp else None
    # Covered by an empty read-only tmpfs, what the job may see of them bound back: the
    # state dir, /tmp (the job's own is bound there) and, for a job with an identity of its
    # own, the agent's user's home (root's: /root), where the interpreter may lie.
    hide = [os.path.realpath(h) for h in spec.get("hide", [])]
    # Dirs of the job's own over host dirs (/var/tmp): what the job must see below them is
    # bound back inside, as in its /tmp.
    private = [(_open(p["source"], DIRS), p["path"]) for p in spec.get("private", [])]
    hidden = [home, *hide, *(path for _, path in private)]
    hidden += ["/tmp"] if tmp_fd is not None else []
    keep = []  # (fd, path, is_dir, readonly), opened while the real state dir is in view
    for entry in spec["keep"]:
        path = os.path.realpath(entry["path"])
        if not any(os.path.commonpath([h, path]) == h for h in hidden):
            if identity and not entry.get("readonly", False):
                raise SandboxError(0, f"{path} is to be writable but lies outside the job's view")
            continue  # outside the state dir and /tmp: in view anyway
        fd = _open(path, DIRS_OR_FILES)
        keep.append((fd, path, stat.S_ISDIR(os.fstat(fd).st_mode), entry.get("readonly", False)))
    binds = []
    for bind in spec["binds"]:
        target = os.path.realpath(bind["target"])
        if os.path.commonpath([work, target]) != work or not os.path.isdir(target):
            raise SandboxError(0, f"mount point {bind['target']} is not a directory in {work}")
        binds.append((_open(bind["source"], DIRS), target))
    if tmp_fd is not None:
        _bind_fd(tmp_fd, "/tmp", readonly=False, writable=bool(identity))
        os.close(tmp_fd)
    for fd, target in private:
        _bind_fd(fd, target, readonly=False, writable=True)
        os.close(fd)
    covers = sorted({*hide, home}, key=len)  # outer ones first
    for cover in covers:
        os.makedirs(cover, exist_ok=True)  # in a cover already made, or the job's /tmp
        _mount("tmpfs", cover, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=1m")
    for fd, path, directory, readonly in keep:
        _make_target(path, directory)
        _bind_fd(fd, path, readonly, writable=bool(identity) and not readonly)
        os.close(fd)
    for cover in covers:
        _remount_readonly(cover)
    if identity:
        # POSIX shared memory of its own, as big as the host's (it is memory, as there).
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for fd, target in binds:
        _bind_fd(fd, target, readonly=True)
        os.close(fd)
    os.chdir(work)  # the view's work dir, not the hidden one the leader started in
    if uid == 0:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        for cap in range(last + 1):
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "dropping capabilities")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _readonly_everywhere() -> None:
    """Remount every mount of this (new, private) mount namespace read-only: the job's
    root, /usr, /home, /etc, wherever gpuhop and the interpreters are installed. Device
    files stay usable (a read-only mount still passes writes to a device)."""
    with open("/proc/self/mountinfo") as f:
        points = [_unescape(line.split()[4]) for line in f if len(line.split()) > 4]
    for point in dict.fromkeys(points):
        if point == "/proc":
            continue  # the job's own PID namespace's: its files are the kernel's to guard
        try:
            _remount_readonly(point, keep_flags=True)
        except OSError as e:
            # Covered by a later mount, or gone: nothing of it is in view.
            if e.errno not in (errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.EINVAL):
                raise


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def become(identity: dict) -> None:
    """Run from here on as the job's own identity: its uid and gid, no other groups. As
    every uid is then non-zero, the kernel clears every capability. Its processes (threads
    count) are capped at `max_processes()` for that uid: one user's fork bomb must not
    leave the host, the agent and the other users' jobs without pids."""
    cap = max_processes()

    def capped(limit: int) -> int:
        return cap if limit == resource.RLIM_INFINITY or limit > cap else limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (capped(soft), capped(hard)))
    os.setgroups([])
    os.setgid(identity["gid"])
    os.setuid(identity["uid"])
    if os.getuid() != identity["uid"] or os.geteuid() != identity["uid"]:
        raise SandboxError(0, f"could not become uid {identity['uid']}")


def _host_pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 32768


# Read as this module is loaded, in the host's PID namespace: a job's own reads another.
HOST_PID_MAX = _host_pid_max()


def max_processes() -> int:
    """How many processes and threads one user's jobs may have at once: a quarter of the
    host's pids (pid_max), and no fewer than 4,096 (TensorFlow starts a few hundred threads
    a process on a large host)."""
    return max(4096, HOST_PID_MAX // 4)


def _sibling(name: str):
    # -I leaves this file's directory off sys.path; the helpers beside it are stdlib-only.
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    return __import__(name)


def probe() -> str | None:
    """None if a job can have its own view of this host; else why not."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpuhop-probe-") as home:
        work = os.path.join(home, "work")
        os.mkdir(work)
        spec = {"home": home, "work": work, "keep": [{"path": work}], "binds": []}
        try:
            child = enter(spec)
        except OSError as e:
            return str(e)
        if child == 0:
            os._exit(0 if os.listdir(os.path.dirname(work)) == ["work"] else 1)
        _, status = os.waitpid(child, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            return "the job's view of the state dir held more than its own files"
    return None


def run(spec: dict, argv: list) -> int:
    """Run `argv` in a view made by `spec`, as its identity if it has one; its exit code."""
    child = enter(spec)
    if child == 0:
        try:
            if spec.get("identity"):
                become(spec["identity"])
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, f"gpuhop: cannot run {argv[0]!r}: {e}\n".encode())
        os._exit(127)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            return os.waitstatus_to_exitcode(status)
        except InterruptedError:
            continue


if __name__ == "__main__" and sys.argv[1:] == ["--probe"]:
    problem = probe()
    if problem is not None:
        print(problem, file=sys.stderr)
    sys.exit(0 if problem is None else 1)
elif __name__ == "__main__" and sys.argv[1:2] == ["--run"] and sys.argv[3:4] == ["--"]:
    # `sandbox.py --run SPEC -- COMMAND...`: a probe of a job's interpreter (see the backend).
    import json

    try:
        code = run(json.loads(sys.argv[2]), sys.argv[4:])
    except OSError as e:
        print(f"gpuhop: no sandbox for the probe: {e}", file=sys.stderr)
        code = 1
    sys.exit(code)
