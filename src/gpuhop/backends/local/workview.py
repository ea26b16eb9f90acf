"""Runs on the GPU host, in a job's sandbox: gives the job a writable view of its tree's
checkout instead of a copy of every file. Standard library only (the shim runs with
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

import os
import sys

# In a job's dir: overlayfs's own scratch dir, on the same filesystem as the work dir.
SCRATCH = "overlay"


def mount(spec: dict, mount_fn) -> None:
    """Mount the overlay on spec["work"] with spec["lower"] under it. `mount_fn` is the
    sandbox's mount(source, target, fstype, flags, data); raises OSError on failure."""
    work = os.path.realpath(spec["work"])
    scratch = os.path.join(os.path.dirname(work), SCRATCH)
    os.makedirs(scratch, exist_ok=True)
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
    fds = [os.open(path, flags) for path in (spec["lower"], work, scratch)]
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


def probe() -> str | None:
    """None if a job can have an overlay view of its checkout on this host; else why not."""
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    sandbox = __import__("sandbox")
    with tempfile.TemporaryDirectory(prefix="gpuhop-probe-") as home:
        lower, job = os.path.join(home, "checkout"), os.path.join(home, "job")
        work = os.path.join(job, "work")
        os.makedirs(lower)
        os.makedirs(work)
        with open(os.path.join(lower, "f"), "w") as f:
            f.write("stored")
        spec = {"home": home, "work": work, "lower": lower, "keep": [{"path": work}], "binds": []}
        try:
            child = sandbox.enter(spec)
        except OSError as e:
            return f"overlayfs: {e}"
        if child == 0:
            try:
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
                return "overlayfs: a job's write reached the stored checkout"
        if os.waitstatus_to_exitcode(status) != 0:
            return "overlayfs: the job did not see its checkout, or could not change it"
        _allow_removal(job)
    return None


def _allow_removal(root: str) -> None:
    # Overlayfs leaves its scratch dir's `work` subdir with mode 000.
    scratch = os.path.join(root, SCRATCH, "work")
    if os.path.isdir(scratch):
        os.chmod(scratch, 0o700)


if __name__ == "__main__" and sys.argv[1:] == ["--probe"]:
    problem = probe()
    if problem is not None:
        print(problem, file=sys.stderr)
    sys.exit(0 if problem is None else 1)
