"""Remote transports: re-syncing a work dir and uploading a large one to a GPU host, with
gpuhop over SSH and over TLS next to `rsync -az` and `scp -r` over the same SSH, and the
loopback's own limit (bytes through one local TCP connection) measured in the same run.

The "host" is this machine: a private sshd on a loopback port and an agent with a TLS
listener on loopback (see remotes.py), both set up here and stopped afterwards. Every
command is the one a user would type: `gpuhop run --on REMOTE -d true` (sync, submit,
return) against `rsync -az -e ssh DIR/ host:DIR/`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

from harness import PYTHON, Row, Settings, private_agent, quiet_disk, run_checked, timed_run
from remotes import Remote, remote_host, ssh_remote, ssh_unavailable, tls_remote
from resync import make_tree

NAME = "transports"
SEED_FILE_MB = 64  # the bulk tree: files of this size (the last one smaller)


def make_bulk_tree(root: Path, megabytes: int) -> int:
    """`megabytes` of random bytes in files of SEED_FILE_MB. Returns the size in bytes."""
    root.mkdir(parents=True)
    total, i = megabytes * 1_000_000, 0
    left = total
    past = time.time() - 3600
    while left > 0:
        size = min(left, SEED_FILE_MB * 1_000_000)
        path = root / f"shard{i:04d}.bin"
        with open(path, "wb") as f:
            for start in range(0, size, 1 << 24):
                f.write(os.urandom(min(1 << 24, size - start)))
        os.utime(path, (past, past))
        left -= size
        i += 1
    return total


def renew(tree: Path) -> None:
    """Rewrite the first bytes of every file of `tree`: each is new content to any store."""
    for path in sorted(tree.iterdir()):
        with open(path, "r+b") as f:
            f.write(os.urandom(16))


def gpuhop_sync(remote: Remote, tree: Path, cache: Path) -> float:
    """Seconds for `gpuhop run --on REMOTE -d true` in `tree`: sync and submit. Then (not
    timed) waits for that job to end: its start makes the tree's checkout (a copy of every
    file, on a disk with no reflinks), which must not run beside the next measurement."""
    env = {**remote.env, "GPUHOP_CACHE_DIR": str(cache)}
    with tempfile.TemporaryFile() as out:
        seconds = timed_run([PYTHON, "-m", "gpuhop", "run", "--on", remote.name, "-d", "true"],
                            cwd=tree, env=env, stdout=out)  # fmt: skip
        out.seek(0)
        job = out.read().decode().split()[-1]
        run_checked([PYTHON, "-m", "gpuhop", "logs", "--on", remote.name, "-f", job], env=env,
                    stdout=out)  # fmt: skip
    return seconds


def ssh_argv(remote: Remote) -> list[str]:
    assert remote.server is not None
    return ["ssh", "-F", str(remote.server.ssh_config)]


def rsync(remote: Remote, src: Path, dest: Path, *options: str, ssh: str | None = None) -> float:
    """`rsync -az OPTIONS` over ssh (`ssh`: the ssh command rsync runs, the plain one by
    default)."""
    ssh = ssh or " ".join(ssh_argv(remote))
    target = f"{remote_host(remote)}:{dest}/"
    return timed_run(["rsync", "-az", *options, "-e", ssh, f"{src}/", target])


def scp(remote: Remote, src: Path, dest: Path) -> float:
    assert remote.server is not None
    argv = ["scp", "-q", "-r", "-F", str(remote.server.ssh_config)]
    return timed_run([*argv, str(src), f"{remote_host(remote)}:{dest}"])


def bulk_over_ssh(
    lab: Remote, big: Path, size: int, root: Path, i: int, bulk: dict[str, list[float]]
) -> None:
    """Sample `i` of the bulk upload over SSH: rsync, rsync as gpuhop stores, scp, gpuhop,
    each from a disk with nothing left to flush and into a place that has none of it."""
    quiet_disk()
    bulk["rsync"].append(size / 1e6 / rsync(lab, big, root / f"rsync{i}"))
    # As gpuhop does: its tunnel's cipher, every file on disk before the end.
    gcm = " ".join([*ssh_argv(lab), "-c", "aes128-gcm@openssh.com"])
    quiet_disk()
    bulk["rsync-gcm"].append(size / 1e6 / rsync(lab, big, root / f"gcm{i}", "--fsync", ssh=gcm))
    quiet_disk()
    bulk["scp"].append(size / 1e6 / scp(lab, big, root / f"scp{i}"))
    for name in (f"rsync{i}", f"gcm{i}", f"scp{i}"):
        shutil.rmtree(root / name)
    renew(big)
    quiet_disk()
    bulk["ssh"].append(size / 1e6 / gpuhop_sync(lab, big, root / f"cache-bulk-ssh{i}"))


def loopback_limit(tree: Path) -> float:
    """MB/s of the tree's bytes through one TCP connection on loopback (sendfile, discard)."""
    server = socket.create_server(("127.0.0.1", 0))
    received = [0]

    def drain() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1 << 20):
                received[0] += len(data)

    reader = threading.Thread(target=drain)
    reader.start()
    start = time.perf_counter()
    with socket.create_connection(server.getsockname()) as out:
        for path in sorted(tree.iterdir()):
            with open(path, "rb") as f:
                out.sendfile(f)
    reader.join()
    seconds = time.perf_counter() - start
    server.close()
    return received[0] / 1e6 / seconds


def disk_limit(tree: Path, dest: Path) -> float:
    """MB/s of writing the tree's files into `dest` (a copy in the kernel), each flushed to
    disk before the next, as an upload stores them: what the host's disk allows, with no
    network, hashing or encryption."""
    dest.mkdir()
    start = time.perf_counter()
    total = 0
    for path in sorted(tree.iterdir()):
        with open(path, "rb") as src, open(dest / path.name, "wb") as out:
            while copied := os.copy_file_range(src.fileno(), out.fileno(), 1 << 30):
                total += copied
            out.flush()
            os.fsync(out.fileno())
    seconds = time.perf_counter() - start
    shutil.rmtree(dest)
    return total / 1e6 / seconds


def run(settings: Settings) -> list[Row]:
    # Without sshd or rsync (a bare GPU host) the TLS rows and the limits are still measured.
    why = ssh_unavailable()
    repeats = settings.repeats(default=5, quick=3)
    bulk_runs = settings.repeats(default=1, quick=1)
    files = 1_000 if settings.quick else 5_000
    bulk_mb = int(os.environ.get("BENCH_BULK_MB") or (256 if settings.quick else 2000))
    unchanged: dict[str, list[float]] = {"gpuhop": [], "rsync": []}
    changed: dict[str, list[float]] = {"gpuhop": [], "rsync": []}
    bulk: dict[str, list[float]] = {
        k: [] for k in ("ssh", "tls", "rsync", "rsync-gcm", "scp", "limit", "disk")
    }
    with tempfile.TemporaryDirectory(prefix="gpuhop-bench-") as tmp:
        root = Path(tmp)
        tree = root / "tree"
        megabytes = make_tree(tree, files) / 1e6
        big = root / "big"
        bulk_bytes = make_bulk_tree(big, bulk_mb)
        with private_agent(root / "local") as local, contextlib.ExitStack() as stack:
            lab = None if why else stack.enter_context(ssh_remote(root / "ssh", local.env))
            # Re-sync: the first sync fills the agent and the hash cache; then time them.
            if lab is not None:
                gpuhop_sync(lab, tree, root / "cache-resync")
                rsync(lab, tree, root / "mirror")
                for _ in range(repeats):
                    unchanged["gpuhop"].append(gpuhop_sync(lab, tree, root / "cache-resync"))
                    unchanged["rsync"].append(rsync(lab, tree, root / "mirror"))
                for victim in sorted(tree.rglob("*.bin"))[:repeats]:
                    victim.write_bytes(os.urandom(50_000))
                    changed["gpuhop"].append(gpuhop_sync(lab, tree, root / "cache-resync"))
                    changed["rsync"].append(rsync(lab, tree, root / "mirror"))
            # Bulk: every sample into a place that has none of it: rsync and scp into new
            # dirs, gpuhop with every file's first bytes rewritten (all its blobs new) and a
            # cold hash cache. The same number of samples of each.
            with tls_remote(root / "tls", local.env) as team:
                for i in range(bulk_runs):
                    # Each measured from a disk with nothing left to flush (`quiet_disk`).
                    quiet_disk()
                    bulk["limit"].append(loopback_limit(big))
                    if lab is not None:
                        bulk_over_ssh(lab, big, bulk_bytes, root, i, bulk)
                    renew(big)
                    # Right before the TLS upload: after a few GBs written, this kind of VM
                    # takes writes at a fraction of its first GBs' speed (see the README).
                    quiet_disk()
                    bulk["disk"].append(disk_limit(big, root / f"disk{i}"))
                    quiet_disk()
                    seconds = gpuhop_sync(team, big, root / f"cache-bulk-tls{i}")
                    bulk["tls"].append(bulk_bytes / 1e6 / seconds)

    size = f"{files:,} files, {megabytes:.0f} MB"
    mb = f"{bulk_bytes / 1e6:,.0f} MB in {SEED_FILE_MB} MB files"
    cli = "gpuhop run --on lab -d true (a new CLI process each time)"
    limit = bulk["limit"]
    rows = [
        Row(NAME, f"re-sync over ssh, unchanged {size}", "s", unchanged["gpuhop"],
            "rsync -az over ssh", unchanged["rsync"], cli),
        Row(NAME, "re-sync over ssh, one 50 KB file rewritten", "s", changed["gpuhop"],
            "rsync -az over ssh", changed["rsync"], cli),
        Row(NAME, f"bulk upload over ssh, {mb}", "MB/s", bulk["ssh"], "rsync -az over ssh",
            bulk["rsync"], "gpuhop: hash + send through the ssh tunnel (first upload)"),
        Row(NAME, f"bulk upload over ssh, {mb}", "MB/s", bulk["ssh"],
            "rsync -az --fsync, ssh -c aes128-gcm", bulk["rsync-gcm"],
            "as gpuhop does: its tunnel's cipher (AES-GCM first where ssh_config leaves the"
            " defaults; plain ssh uses chacha20-poly1305) and each file flushed to disk"
            " (gpuhop fsyncs every blob before it names it); the data is random"),
        Row(NAME, f"bulk upload over ssh, {mb}", "MB/s", bulk["ssh"], "scp -r", bulk["scp"],
            "the same"),
        Row(NAME, f"bulk upload over TLS, {mb}", "MB/s", bulk["tls"], "loopback TCP limit",
            limit, "the limit: the same bytes through one local TCP connection (sendfile)"),
        Row(NAME, f"bulk upload over TLS, {mb}", "MB/s", bulk["tls"], "the disk's limit",
            bulk["disk"], "the same files copied in the kernel into a new dir on this disk,"
            " each flushed (as gpuhop stores each blob), right before the TLS upload: no"
            " network, hash or cipher"),
        Row(NAME, f"bulk upload over ssh, {mb}", "MB/s", bulk["ssh"], "loopback TCP limit",
            limit, "the same limit"),
        Row(NAME, "hello.py start latency", "s", [], "ray job submit", None,
            "skipped: Ray is not installed (the Ray backend is a later issue)"),
    ]  # fmt: skip
    for row in rows:
        if why is not None and "over ssh" in row.what:
            row.alternative, row.note = None, f"skipped: {why}"
    return rows
