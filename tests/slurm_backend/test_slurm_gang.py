"""Multi-worker jobs on the Slurm backend: one Slurm job of N tasks that `srun` starts
together, each told of its peers, on the real two-node test cluster (tests/slurm_backend/
cluster.py): each node has its own address, reached by its host name (its NodeAddr, which
the nodes resolve from their hosts files), not its Slurm name, its own ports and its own
/tmp, so a gang's workers (one a node, unless packed) meet as on a site's nodes.

The module's agent takes its gangs' ports from a block of PORTS ports ([slurm] ports in its
agent.toml), which a test holds nearly all of on one node, and its scratch dir from
NODE_SCRATCH ([slurm] scratch), which each node has on its own /tmp and this host lacks."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.backends.slurm.gang import task_hosts
from gpuhop.backends.slurm.rendezvous import base_port, candidates
from tests.conftest import Agent, jax_env, wait_until
from tests.ports import port_block
from tests.slurm_backend.cluster import NODE_SCRATCH, SlurmCluster
from tests.slurm_backend.conftest import skip_without_slurm, start_agent
from tests.slurm_backend.test_slurm_backend import _info, _script, _submit

pytestmark = pytest.mark.timeout(180)

PORTS = 24


@pytest.fixture(scope="module")
def gang_ports() -> range:
    return port_block(PORTS)


@pytest.fixture(scope="module")
def slurm_cluster(two_node_cluster: SlurmCluster) -> SlurmCluster:
    return two_node_cluster


@pytest.fixture(scope="module")
def slurm_agent(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory, gang_ports: range
) -> Iterator[Agent]:
    toml = f'[slurm]\nports = "{gang_ports[0]}-{gang_ports[-1]}"\nscratch = "{NODE_SCRATCH}"\n'
    yield from start_agent(slurm_cluster, tmp_path_factory.mktemp("slurm-agent"), toml)


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

TELL = """
import json, os
config = json.loads(os.environ["TF_CONFIG"])
print("index", config["task"]["index"], "of", len(config["cluster"]["worker"]),
      config["cluster"]["worker"][config["task"]["index"]],
      os.environ["GPUHOP_WORKER_INDEX"], os.environ["GPUHOP_NUM_WORKERS"],
      "gpus", os.environ["CUDA_VISIBLE_DEVICES"], "on", os.environ["SLURMD_NODENAME"],
      flush=True)
"""

# Each worker writes its pid (whole, then renamed into place) and holds on until killed.
HOLD = """
import os, sys, time
pid = f"{sys.argv[1]}/pid-{os.environ['GPUHOP_WORKER_INDEX']}"
with open(pid + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(pid + ".tmp", pid)
print("up", flush=True)
time.sleep(300)
"""


def test_task_hosts_follow_slurms_tasks_per_node():
    assert task_hosts(["a", "b", "c"], "2,1(x2)") == ["a", "a", "b", "c"]
    assert task_hosts(["a"], "2") == ["a", "a"]
    with pytest.raises(ValueError, match="does not match"):
        task_hosts(["a", "b"], "2")
    with pytest.raises(ValueError, match="cannot read SLURM_TASKS_PER_NODE"):
        task_hosts(["a"], "two")
    # Each job's first choice is its own, drawn from its Slurm id: a literal (no
    # per-process hash salt), below the ephemeral range client sockets take ports from.
    assert base_port("123") == 23001
    assert all(20000 <= base_port(str(i)) <= 32000 for i in range(1000))
    assert candidates(31999, 4, (20000, 32000)) == [31999, 32000, 20000, 20001]


@pytest.mark.parametrize("pack", [False, True], ids=["a-node-each", "packed"])
def test_each_worker_gets_its_tf_config_naming_its_peers_by_node_address_and_its_own_log(
    slurm_agent, slurm_cluster, tmp_path, pack
):
    work = _script(tmp_path, "tell.py", TELL)
    args = ("--workers", "2", "--gpus-per-worker", "1", *(["--pack"] if pack else []), "tell.py")
    job_id = _submit(slurm_agent, work, *args)
    info = _ended(slurm_agent, job_id)
    assert info["state"] == "succeeded", info
    log = slurm_agent.cli("logs", job_id).stdout
    lines = {}
    for i in range(2):
        out = slurm_agent.cli("logs", "--worker", str(i), job_id)
        assert out.returncode == 0, out.stderr
        lines[i] = out.stdout.strip()
        assert f"[worker {i}] {lines[i]}" in log  # the job's log has both, prefixed
    index = [lines[i].split() for i in range(2)]
    assert [w[:4] for w in index] == [["index", "0", "of", "2"], ["index", "1", "of", "2"]]
    assert [w[5:7] for w in index] == [["0", "2"], ["1", "2"]]
    # Block distribution: packed, both on the first node, else one on each.
    nodes = [slurm_cluster.nodes[0]] * 2 if pack else slurm_cluster.nodes
    assert [w[10] for w in index] == [n.name for n in nodes]
    # Each its own GPU, as Slurm set it: on one node, its two; on two, each node's first.
    assert [w[8] for w in index] == (["0", "1"] if pack else ["0", "0"])
    hosts, ports = zip(*(w[4].rsplit(":", 1) for w in index), strict=True)
    # Peers by Slurm's NodeAddr, a host name, which the nodes resolve: a node's Slurm name
    # resolves nowhere (tests/slurm_backend/cluster.py).
    assert list(hosts) == [n.addr for n in nodes] and ports[0] != ports[1]
    assert not any(h.replace(".", "").isdigit() for h in hosts), hosts  # names, not IPs
    where = ", ".join(sorted({n.name for n in nodes}))
    assert f"gpuhop: 2 workers on {where}, ports {ports[0]}, {ports[1]}" in log
    _no_slurm_jobs(slurm_cluster)


# Each worker saves to the same relative path, as every process of a Keras 3 job saves its
# model, and says where its temp files go; once all its peers are up (each has named its
# scratch dir in the shared flags dir), which of their scratch dirs it sees.
SAVE = """
import json, os, sys, tempfile, time
index = os.environ.get("GPUHOP_WORKER_INDEX", "-")
open("model.txt", "a").write(f"saved by worker {index}\\n")
open(os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "out.txt"), "w").write(index)
scratch = os.environ["GPUHOP_SCRATCH_DIR"]
open(os.path.join(scratch, "big.bin"), "wb").write(b"x" * 1000)
flags, workers = sys.argv[1], int(os.environ.get("GPUHOP_NUM_WORKERS", "1"))
with open(f"{flags}/up-{index}.tmp", "w") as f:
    f.write(scratch)
os.replace(f"{flags}/up-{index}.tmp", f"{flags}/up-{index}")
deadline = time.monotonic() + 60
while len(ups := [n for n in os.listdir(flags) if n.startswith("up-") and not n.endswith(".tmp")]
          ) < workers and time.monotonic() < deadline:
    time.sleep(0.05)
others = [open(f"{flags}/{n}").read() for n in ups if n != f"up-{index}"]
seen = {"cwd": os.getcwd(), "tmp": tempfile.gettempdir(), "scratch": scratch,
        "files": sorted(os.listdir(".")), "others_seen": [o for o in others if os.path.exists(o)]}
print("seen", json.dumps(seen), flush=True)
"""


def _seen(log: str) -> dict[str, dict]:
    """What each worker said it saw, by its index ("-": a single-worker job's)."""
    out = {}
    for line in log.splitlines():
        if "seen {" in line:
            prefix, _, seen = line.partition("seen ")
            out[prefix.strip("[] ").removeprefix("worker ") or "-"] = json.loads(seen)
    return out


def test_each_worker_has_its_own_files_and_node_local_scratch_and_worker_0s_come_back(
    slurm_agent, slurm_cluster, tmp_path
):
    work = _script(tmp_path, "save.py", SAVE)
    (work / "model.txt").write_text("synced\n")
    flags = tmp_path / "flags"
    flags.mkdir()
    job_id = _submit(slurm_agent, work, "--workers", "2", "save.py", str(flags))
    info = _ended(slurm_agent, job_id)
    log = slurm_agent.cli("logs", job_id).stdout
    assert info["state"] == "succeeded", (info, log)
    seen = _seen(log)
    assert set(seen) == {"0", "1"}, log
    job_dir = slurm_agent.paths.job_dir(job_id)
    # Worker 0 works in the job's own work dir; worker 1, on the other node, in a copy of
    # it, as it was synced: the shared filesystem holds both.
    assert seen["0"]["cwd"] == str(job_dir / "work")
    assert seen["1"]["cwd"] != seen["0"]["cwd"] and "model.txt" in seen["1"]["files"]
    # Temp files and the scratch dir on each node's local disk ([slurm] scratch), one per
    # worker, each TMPDIR in its own scratch root; neither node sees the other's, nor does
    # this host (the login node); and all gone from the nodes once the job ended.
    for i in ("0", "1"):
        root = Path(seen[i]["scratch"]).parent
        assert str(root.parent) == NODE_SCRATCH
        assert root.name.startswith(f"gpuhop-{job_id}-1-w{i}-")
        assert seen[i]["tmp"] == str(root / "tmp")
        assert seen[i]["others_seen"] == [], seen
        assert not root.exists()
    for i in range(2):
        assert slurm_cluster.on(i, "ls", "-A", NODE_SCRATCH).stdout == ""
    # What comes back is worker 0's: one writer per file, the copies gone.
    back = tmp_path / "back"
    pulled = slurm_agent.cli("pull", job_id, "-o", str(back))
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert (back / "workdir" / "model.txt").read_text() == "synced\nsaved by worker 0\n"
    assert (back / "out.txt").read_text() == "0"
    assert not (job_dir / "worker-views").exists()
    assert "worker 0's files come back" in log
    _no_slurm_jobs(slurm_cluster)


def test_a_jobs_own_tmpdir_wins_over_the_node_local_one(slurm_agent, slurm_cluster, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    work = _script(tmp_path, "save.py", SAVE)
    flags = tmp_path / "flags"
    flags.mkdir()
    job_id = _submit(slurm_agent, work, "-e", f"TMPDIR={mine}", "save.py", str(flags))
    info = _ended(slurm_agent, job_id)
    log = slurm_agent.cli("logs", job_id).stdout
    assert info["state"] == "succeeded", (info, log)
    seen = _seen(log)["-"]
    assert seen["tmp"] == str(mine)
    assert seen["cwd"] == str(slurm_agent.paths.job_dir(job_id) / "work")
    assert Path(seen["scratch"]).parent.name.startswith(f"gpuhop-{job_id}-1-")  # no -wI
    _no_slurm_jobs(slurm_cluster)


def _ended(agent: Agent, job_id: str, timeout: float = 60) -> dict:
    """The job's record once it has ended; failing, after `timeout`, with its log."""
    with agent.client() as client:
        try:
            return client.job(job_id).wait_json(timeout)
        except TimeoutError:
            log = agent.cli("logs", job_id).stdout[-3000:]
            pytest.fail(
                f"job {job_id} did not end within {timeout}s: {_info(agent, job_id)}\n{log}"
            )


def _no_slurm_jobs(cluster: SlurmCluster) -> None:
    """Until Slurm holds no job any more (each look an `squeue` and a request to slurmctld:
    five a second, not fifty)."""
    wait_until(lambda: not cluster.jobs(), timeout=60, interval=0.2)


def test_a_gang_starts_on_ports_free_on_every_node_when_its_first_choice_is_taken_on_one(
    slurm_agent, slurm_cluster, gang_ports, tmp_path
):
    # Servers of the test's listen on the second node on all of the agent's range but two
    # ports that are not neighbours, so whatever the job's first choice (two neighbouring
    # ports from where its Slurm id hashes to), one of them is taken there, and free on the
    # first node, where the gang's batch step runs. (With the last two left free, an id
    # hashing to the second-to-last port found both free: nothing avoided, 1 run in 24.)
    busy = set(gang_ports) - {gang_ports[0], gang_ports[len(gang_ports) // 2]}
    with slurm_cluster.ports_held(1, busy):
        work = _script(tmp_path, "tell.py", TELL)
        job_id = _submit(slurm_agent, work, "--workers", "2", "tell.py")
        info = _ended(slurm_agent, job_id)
    log = slurm_agent.cli("logs", job_id).stdout
    assert info["state"] == "succeeded", (info, log)
    ports = {int(p) for p in re.findall(r"\] index \d of 2 \S+:(\d+) ", log)}
    assert len(ports) == 2 and not ports & busy, (ports, log)
    avoided = log.split("gpuhop: in use, so not chosen: ")[1].splitlines()[0]
    first, second = (n.name for n in slurm_cluster.nodes)
    assert f" on {second}" in avoided and first not in avoided, avoided


# Each worker says it ran, in the shared dir it is given.
RAN = """
import os, sys
open(os.path.join(sys.argv[1], "ran-" + os.environ["GPUHOP_WORKER_INDEX"]), "w").close()
"""


def test_a_gang_whose_node_cannot_resolve_its_peers_address_fails_at_once_saying_so(
    slurm_agent, slurm_cluster, tmp_path
):
    # The second node's hosts file lacks the first node's NodeAddr, which slurmctld, this
    # host and the first node (where the gang's batch step runs) still resolve: Slurm itself
    # starts the job, and only the peers could not meet.
    first, second = slurm_cluster.nodes
    ran = tmp_path / "ran"
    ran.mkdir()
    work = _script(tmp_path, "ran.py", RAN)
    with slurm_cluster.unresolved(0, on=1):
        assert slurm_cluster.on(1, "getent", "hosts", first.addr).returncode != 0
        job_id = _submit(slurm_agent, work, "--workers", "2", "ran.py", str(ran))
        # Well before the 300 s workers wait for their peers by default (--worker-timeout).
        info = _ended(slurm_agent, job_id, timeout=60)
    assert info["state"] == "failed", info
    said = f"node {second.name} cannot resolve its peer's address {first.addr} ("
    assert said in info["reason"], info
    assert f"gpuhop: could not start: {said}" in slurm_agent.cli("logs", job_id).stdout
    assert list(ran.iterdir()) == []  # no worker started
    _no_slurm_jobs(slurm_cluster)
    # Nothing of the job's left on any node (the nodes share this host's process ids).
    job_dir = str(slurm_agent.paths.job_dir(job_id))
    wait_until(lambda: not _processes_mentioning(job_dir), timeout=30)


def _processes_mentioning(text: str) -> list[str]:
    """The argv of each live process on this host (and so on the test nodes) that has
    `text` in it."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and text in argv:
            found.append(argv.replace("\0", " "))
    return found


def test_a_worker_killed_by_the_test_fails_the_gang(slurm_agent, slurm_cluster, tmp_path):
    skip_without_slurm()
    work = _script(tmp_path, "hold.py", HOLD)
    job_id = _submit(slurm_agent, work, "--workers", "2", "hold.py", str(tmp_path))
    pids = [tmp_path / f"pid-{i}" for i in range(2)]
    try:
        _wait_for(slurm_agent, job_id, pids)
        worker0 = int(pids[0].read_text())
        os.kill(int(pids[1].read_text()), signal.SIGKILL)
        info = _ended(slurm_agent, job_id)
    finally:
        _end(slurm_agent, slurm_cluster, job_id)
    assert info["state"] == "failed", info
    assert info["reason"].startswith("worker 1 was killed by signal 9 (SIGKILL) first")
    assert "1 other worker was stopped" in info["reason"]
    assert not _alive(worker0)


def test_a_cancelled_gang_ends_every_worker_and_leaves_no_slurm_job(
    slurm_agent, slurm_cluster, tmp_path
):
    skip_without_slurm()
    work = _script(tmp_path, "hold.py", HOLD)
    job_id = _submit(slurm_agent, work, "--workers", "2", "hold.py", str(tmp_path))
    pids = [tmp_path / f"pid-{i}" for i in range(2)]
    try:
        _wait_for(slurm_agent, job_id, pids)
        workers = [int(p.read_text()) for p in pids]
        assert slurm_agent.cli("cancel", job_id).returncode == 0
        info = _ended(slurm_agent, job_id)
    finally:
        _end(slurm_agent, slurm_cluster, job_id)
    assert info["state"] == "cancelled"
    wait_until(lambda: not any(_alive(pid) for pid in workers), timeout=30)


@pytest.mark.tf
def test_two_workers_on_two_nodes_train_to_the_same_weights(slurm_agent, slurm_cluster, tmp_path):
    skip_without_slurm()
    work = tmp_path / "work"
    shutil.copytree(EXAMPLES / "multiworker", work / "multiworker")
    args = ("--workers", "2", "multiworker/train.py", "--epochs", "1")
    run = slurm_agent.cli("run", "--no-requirements", *args, cwd=work, timeout=170)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    finals = {
        line.split("] ", 1)[0]: line.split("final loss: ", 1)[1]
        for line in run.stdout.splitlines()
        if "final loss: " in line
    }
    assert set(finals) == {"[worker 0", "[worker 1"}
    assert finals["[worker 0"] == finals["[worker 1"]  # MWMS kept the two in step
    _no_slurm_jobs(slurm_cluster)


@pytest.mark.tf
def test_keras3_on_jax_across_two_tasks_trains_to_the_same_weights(
    slurm_agent, slurm_cluster, tmp_path
):
    skip_without_slurm()
    work = tmp_path / "work"
    shutil.copytree(EXAMPLES / "keras3-jax-multiworker", work / "example")
    args = ("--workers", "2", *jax_env(), "-e", "KERAS_BACKEND=jax", "example/train.py")
    run = slurm_agent.cli("run", "--no-requirements", *args, "--epochs", "1", cwd=work, timeout=170)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    finals = {
        line.split("] ", 1)[0]: line.split("final loss: ", 1)[1]
        for line in run.stdout.splitlines()
        if "final loss: " in line
    }
    assert set(finals) == {"[worker 0", "[worker 1"}
    assert finals["[worker 0"] == finals["[worker 1"]  # keras.distribution kept them in step
    assert "process 1 of 2: 2 devices in the mesh" in run.stdout
    _no_slurm_jobs(slurm_cluster)


@pytest.mark.tf
def test_a_worker_whose_peer_never_joins_says_so(slurm_agent, slurm_cluster, tmp_path):
    work = _script(
        tmp_path,
        "lone.py",
        "import os, time\n"
        "if os.environ['GPUHOP_WORKER_INDEX'] == '1':\n"
        "    print('never joining', flush=True); time.sleep(600)\n"
        "import tensorflow as tf; tf.distribute.MultiWorkerMirroredStrategy()\n",
    )
    args = ("--workers", "2", "--worker-timeout", "5", "lone.py")
    job_id = _submit(slurm_agent, work, *args)
    info = _ended(slurm_agent, job_id, timeout=120)
    assert info["state"] == "failed", info
    assert info["reason"].startswith("worker 0 exited with code 1 first; 1 other worker was")
    assert "(its peers did not join within 5s; see gpuhop logs JOB --worker 0)" in info["reason"]
    _no_slurm_jobs(slurm_cluster)


def _wait_for(agent, job_id: str, pids: list[Path]) -> None:
    """Until every worker has written its pid; failing at once if the job ends first (a
    worker that could not start), else after a deadline, with the job's state and log."""

    ended = agent.paths.job_dir(job_id) / "status.json"  # the leader's last word

    def up() -> bool:
        if all(p.exists() for p in pids):
            return True
        if ended.exists():
            raise AssertionError("the job ended before all its workers were up")
        return False

    try:
        wait_until(up, timeout=120)
    except (AssertionError, pytest.fail.Exception) as e:
        log = agent.cli("logs", job_id).stdout[-3000:]
        pytest.fail(f"the workers did not start ({e}): {_info(agent, job_id)}\n{log}")


def _end(agent, cluster, job_id: str) -> None:
    """The job ended (cancelled, if a failing test left it running) and gone from Slurm."""
    if _info(agent, job_id)["state"] in ("queued", "starting", "running"):
        agent.cli("cancel", "--grace", "1", job_id)
    _no_slurm_jobs(cluster)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
