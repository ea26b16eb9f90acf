"""Runs on the GPU host, in a job's shim: puts the job where it can read datasets but never
change them. Standard library only (the shim runs with `python -I -S`).

A file owned by the job's own uid can be chmod'ed back to writable, so file modes protect
nothing. Instead the job runs in private namespaces made by its shim:

- a mount namespace, with every mount made private first (nothing propagates back to the
  host), in which each dataset's assembled tree is bind-mounted at its mount point and
  remounted read-only, and the agent's stored copies (blobs/, datasets/, envs/) are bound
  onto themselves read-only, so the real paths cannot be written either;
- a PID namespace with its own /proc, so the job cannot reach the host's mounts through
  another process's /proc/PID/root;
- for an agent that is not root, a user namespace that maps the uid to itself (no
  privilege is gained outside it). The job's program starts with no capabilities: a
  non-root uid loses them on exec, and for root the shim empties the bounding set. So the
  job cannot unmount or remount; `no_new_privs` stops set-uid programs giving them back,
  and mounts made by a more privileged namespace stay locked in any namespace the job
  makes itself.

Writes, deletes, renames and chmods inside a dataset fail with EROFS. Where namespaces
cannot be made, the job fails with a message saying what to allow; there is no weaker mode.
"""

import ctypes
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(OSError):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target: str, fstype, flags: int) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            None,
        ),
        f"mount {target}",
    )


def _bind_readonly(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def enter(spec: dict) -> int:
    """Make the namespaces and fork. In the parent, returns the child's pid; in the child
    (PID 1 of the new PID namespace) sets up the mounts, drops privileges for what it will
    exec, and returns 0. Raises SandboxError (in the parent) if the namespaces cannot be made.
    """
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWPID
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
        _setup(spec, uid)
    except OSError as e:
        os.write(write_end, str(e).encode() or b"sandbox set-up failed")
        os._exit(1)
    os.close(write_end)
    return 0


def _setup(spec: dict, uid: int) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    work = os.path.realpath(spec["work"])
    for bind in spec["binds"]:
        target = os.path.realpath(bind["target"])
        if os.path.commonpath([work, target]) != work or not os.path.isdir(target):
            raise SandboxError(0, f"mount point {bind['target']} is not a directory in {work}")
        _bind_readonly(bind["source"], target)
    for path in spec["protect"]:
        if os.path.isdir(path):
            _bind_readonly(path, path)
    if uid == 0:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        for cap in range(last + 1):
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "dropping capabilities")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
