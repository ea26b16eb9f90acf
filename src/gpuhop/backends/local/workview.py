"""Runs on the GPU host, in a job's sandbox: gives the job a writable view of its tree's
checkout instead of a copy of every file. Standard library only (the leader runs with
`python -I -S`).

The agent materialises each stored tree once, as a checkout in its state dir
(gpuhop.agent.storage.checkouts), shared by every job of that tree. In the job's own mount
namespace, before the sandbox hides the state dir, an overlay is mounted on the job's work
dir: the checkout is its lower layer and the work dir itself its upper layer. Overlayfs
copies a file up before any change to its data or metadata, so the job can never alter the
checkout, and what the job created or changed (and only that) lands in its work dir, where
the agent sees it. The layers are named by /proc/self/fd paths of descriptors opened
without following links, so no character of a path can change the mount's options.

`python workview.py --probe` says whether this host allows such a view (exit 0), or why not
(the reason on stderr, exit 1); the agent then copies each job's files, as `doctor` says.
"""

import ctypes
import os
import sys
import time

# In a job's dir: overlayfs's own scratch dir, on the same filesystem as the work dir.
SCRATCH = "overlay"
# In a job's dir: where the checkout is attached, seen as its identity's, for a job with an
# identity of its own (`lower_owner` in the spec).
IDMAPPED = "lower"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
# The mount API's system calls (the same numbers on every architecture) and their flags.
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_EMPTY_PATH, AT_FDCWD = 0x1, 0o2000000, 0x1000, -100
MOUNT_ATTR_IDMAP, MOVE_MOUNT_F_EMPTY_PATH, CLONE_NEWUSER = 0x100000, 0x4, 0x10000000


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def mount(spec: dict, mount_fn) -> None:
    """Mount the overlay on spec["work"] with spec["lower"] under it. `mount_fn` is the
    sandbox's mount(source, target, fstype, flags, data); raises OSError on failure."""
    work = os.path.realpath(spec["work"])
    scratch = os.path.join(os.path.dirname(work), SCRATCH)
    os.makedirs(scratch, exist_ok=True)
    lower = spec["lower"]
    if spec.get("lower_owner"):
        lower = _idmapped(lower, os.path.join(os.path.dirname(work), IDMAPPED), spec["lower_owner"])
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
    fds = [os.open(path, flags) for path in (lower, work, scratch)]
    try:
        lower, upper, scratch_fd = (f"/proc/self/fd/{fd}" for fd in fds)
        options = f"lowerdir={lower},upperdir={upper},workdir={scratch_fd}"
        # redirect_dir lets a job rename a directory of its tree (else EXDEV, as `mv` copes
        # with but os.rename does not); in a user namespace the overlay keeps its own
        # attributes in user.* xattrs, where the kernel allows no redirects.
        tries = [",redirect_dir=on", ""] if os.getuid() == 0 else [",userxattr", ""]
        for i, extra in enumerate(tries):
            try:
                mount_fn("overlay", work, "overlay", 0, options + extra)
                break
            except OSError:
                if i == len(tries) - 1:
                    raise
    finally:
        for fd in fds:
            os.close(fd)


def _idmapped(checkout: str, at: str, owner: dict) -> str:
    """Attach a copy of the mount of `checkout` at `at` (in this mount namespace) on which
    what the agent owns is seen as `owner`'s (an idmapped mount): the job, running as that
    identity, may then change any file of its tree, which overlayfs copies up into its
    work dir as its own, and the checkout stays as it was. Returns `at`."""
    os.makedirs(at, exist_ok=True)
    userns = _mapping(os.getuid(), os.getgid(), owner["uid"], owner["gid"])
    tree = -1
    try:
        tree = _call(
            SYS_OPEN_TREE, AT_FDCWD, os.fsencode(checkout), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC
        )
        attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns)
        _call(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr))
        _call(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, os.fsencode(at), MOVE_MOUNT_F_EMPTY_PATH)
    finally:
        os.close(userns)
        if tree >= 0:
            os.close(tree)
    return at


def _call(number: int, *args) -> int:
    result = _libc.syscall(number, *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"idmapped checkout: {os.strerror(err)}")
    return int(result)


def _mapping(uid: int, gid: int, to_uid: int, to_gid: int) -> int:
    """A user namespace in which `uid`/`gid` (the agent's, who owns the checkouts) are
    `to_uid`/`to_gid`: what an idmapped mount takes. Returns an fd of it."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(ready_r)
        os.close(done_w)
        ok = _libc.unshare(CLONE_NEWUSER) == 0
        os.write(ready_w, b"1" if ok else b"0")
        os.read(done_r, 1)  # until the parent has its fd
        os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError(0, "idmapped checkout: no user namespace for its mapping")
        with open(f"/proc/{child}/uid_map", "w") as f:
            f.write(f"{uid} {to_uid} 1")
        with open(f"/proc/{child}/setgroups", "w") as f:
            f.write("deny")
        with open(f"/proc/{child}/gid_map", "w") as f:
            f.write(f"{gid} {to_gid} 1")
        return os.open(f"/proc/{child}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(done_w)
        while True:
            try:
                os.waitpid(child, 0)
                break
            except InterruptedError:
                time.sleep(0)


def probe(owner: int | None = None) -> str | None:
    """None if a job can have an overlay view of its checkout on this host (with `owner`,
    a uid: one in which the checkout is seen as that uid's, for a job that runs as it);
    else why not."""
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    sandbox = __import__("sandbox")
    what = "overlayfs" if owner is None else "an overlay of an idmapped checkout"
    with tempfile.TemporaryDirectory(prefix="gpuhop-probe-") as home:
        lower, job = os.path.join(home, "checkout"), os.path.join(home, "job")
        work = os.path.join(job, "work")
        os.makedirs(lower)
        os.makedirs(work)
        with open(os.path.join(lower, "f"), "w") as f:
            f.write("stored")
        spec: dict = {"home": home, "work": work, "lower": lower, "keep": [{"path": work}]}
        spec["binds"] = []
        if owner is not None:
            spec["lower_owner"] = {"uid": owner, "gid": owner}
            os.chown(work, owner, owner)
        try:
            child = sandbox.enter(spec)
        except OSError as e:
            return f"{what}: {e}"
        if child == 0:
            try:
                if owner is not None:
                    sandbox.become({"uid": owner, "gid": owner})
                with open("f") as f:
                    seen = f.read()
                with open("f", "a") as f:
                    f.write(" and changed")
            except OSError:
                os._exit(1)
            os._exit(0 if seen == "stored" else 1)
        _, status = os.waitpid(child, 0)
        with open(os.path.join(lower, "f")) as f:
            if f.read() != "stored":
                return f"{what}: a job's write reached the stored checkout"
        if os.waitstatus_to_exitcode(status) != 0:
            return f"{what}: the job did not see its checkout, or could not change it"
        _allow_removal(job)
    return None


def _allow_removal(root: str) -> None:
    # Overlayfs leaves its scratch dir's `work` subdir with mode 000.
    scratch = os.path.join(root, SCRATCH, "work")
    if os.path.isdir(scratch):
        os.chmod(scratch, 0o700)


if __name__ == "__main__" and sys.argv[1:2] == ["--probe"]:
    # `--probe UID`: for a job that runs as UID (a team agent's), its checkout idmapped.
    problem = probe(int(sys.argv[2]) if sys.argv[2:] else None)
    if problem is not None:
        print(problem, file=sys.stderr)
    sys.exit(0 if problem is None else 1)
