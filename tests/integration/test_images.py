"""Jobs in a container image (`--image`): a real agent runs them through real Podman, in a
minimal image the session builds (tests/images.py).

A job in the image sees the image (its os-release), gets the environment contract and the
start-up hook, writes artifacts that `pull` brings back, streams its log, and sees nothing
of the agent's state dir but its own files, under a read-only root. Its end classes, a
cancel and a time limit behave as for a venv job, and no container is left after any of
them. What cannot run is refused at submit, saying why.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from gpuhop.api import EndClass, JobState
from gpuhop.client import GpuhopError
from gpuhop.client.embedded import start_background
from gpuhop.home import read_pid
from tests.conftest import AGENT_PYTHON_FLAGS, wait_until
from tests.images import CAN_WRITE, MARKER, job_containers

INSIDE = (
    r"""
import json, os, sys
state = sys.argv[1]
"""
    + CAN_WRITE
    + r"""
with open(os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "model.txt"), "w") as f:
    f.write("trained in the image")
print(json.dumps({
    "os_release": open("/etc/os-release").read(),
    "uid": os.getuid(),
    "gid": os.getgid(),
    "env": {k: v for k, v in os.environ.items() if k.startswith(("GPUHOP_", "TF_", "CUDA_"))},
    "path_env": os.environ.get("PATH"),
    "tmpdir": os.environ.get("TMPDIR"),
    "hook": "_gpuhop_hook" in sys.modules,
    "state_dir": sorted(os.listdir(state)) if os.path.isdir(state) else None,
    "users": sorted(os.listdir(os.path.join(state, "users"))),
    "socket": os.path.exists(os.path.join(state, "agent.sock")),
    "root": can_write("/etc/written-by-job"),
    "tmp": can_write("/tmp/mine"),
    "work": can_write("written.txt"),
    "pid1": open("/proc/1/cmdline").read().split("\0")[0],
}), flush=True)
"""
)

ENDS = r"""
import os, signal, sys, time
how = sys.argv[1]
print("ready", flush=True)
if how == "exit":
    sys.exit(3)
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
signal.signal(signal.SIGTERM, lambda *_: (print("got TERM", flush=True), sys.exit(143)))
time.sleep(600)
"""


@pytest.fixture(scope="module")
def agent(make_module_agent):
    return make_module_agent()


@pytest.fixture(scope="module")
def make_module_agent(tmp_path_factory):
    from tests.conftest import Agent

    started = []

    def make(toml: str | None = None):
        root = Path(tmp_path_factory.mktemp("image-agent"))
        home = root / "home"
        if toml is not None:
            home.mkdir(parents=True)
            (home / "agent.toml").write_text(toml)
        started.append(Agent(home, root / "cache", None).start())
        return started[-1]

    yield make
    for agent in started:
        agent.shutdown()


def test_a_job_runs_in_its_image_with_its_contract_and_nothing_else(
    agent, minimal_image, project, tmp_path
):
    root = project({"inside.py": INSIDE, "requirements.txt": "no-such-package==1\n"})
    # The CLI as a user runs it: requirements.txt is not sent with --image.
    done = agent.cli("run", "--image", minimal_image, "inside.py", str(agent.home), cwd=root)
    assert done.returncode == 0, done.stderr + done.stdout
    seen = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert MARKER in seen["os_release"]
    with agent.client() as client:
        # Had requirements.txt been sent, building its venv would have failed the job.
        job = client.jobs()[0]
        jp_root = agent.paths.job_dir(job.id)
        env = seen["env"]
        assert env["GPUHOP_JOB_ID"] == job.id and env["GPUHOP_ATTEMPT"] == "1"
        assert env["GPUHOP_ARTIFACTS_DIR"] == str(jp_root / "artifacts")
        assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert seen["hook"] is True  # the image's Python ran gpuhop's start-up hook
        assert seen["tmpdir"] == "/tmp" and seen["tmp"] is True
        assert seen["work"] is True
        assert seen["root"] == "Read-only file system"
        assert seen["uid"] == os.getuid() and seen["gid"] == os.getgid()
        assert seen["pid1"].endswith("init")  # catatonit passes signals on and reaps
        # The state dir holds only the job's own: no socket, store, tokens or other jobs;
        # and its user's home (HOME, their caches: tests/integration/test_image_home.py).
        assert seen["socket"] is False
        assert seen["state_dir"] == ["jobs", "users"]
        assert seen["users"] == [str(os.getuid())]
        # The host's PATH stayed out: the image has its own.
        assert seen["path_env"] != os.environ.get("PATH")
        pulled = client.job(job.id).pull(tmp_path / "out")
        assert [p.name for p in pulled] == ["model.txt"]
        assert (tmp_path / "out" / "model.txt").read_text() == "trained in the image"
        assert (jp_root / "tmp" / "mine").exists()  # its /tmp was its own, and is kept
    assert job_containers(agent.paths, job.id) == []


def test_exit_codes_and_signals_end_an_image_job_as_a_venv_job(agent, minimal_image, project):
    root = project({"ends.py": ENDS})
    with agent.client() as client:
        failed = client.submit(["ends.py", "exit"], workdir=root, image=minimal_image)
        killed = client.submit(["ends.py", "kill"], workdir=root, image=minimal_image)
        info = failed.wait(60)
        assert info.state == JobState.failed and info.exit_code == 3
        assert info.end_class == EndClass.app_error
        assert b"ready" in b"".join(failed.logs())
        info = killed.wait(60)
        assert info.state == JobState.failed
        assert (info.exit_code, info.signal) == (None, signal.SIGKILL)
    for job in (failed, killed):
        assert job_containers(agent.paths, job.id) == []


def test_cancel_and_time_limit_end_the_container(agent, minimal_image, project):
    root = project({"ends.py": ENDS})
    with agent.client() as client:
        job = client.submit(["ends.py", "wait"], workdir=root, image=minimal_image)
        limited = client.submit(["ends.py", "wait"], workdir=root, image=minimal_image, timeout=2)
        wait_until(lambda: b"ready" in b"".join(job.logs()), 60)
        assert len(job_containers(agent.paths, job.id)) == 1
        job.cancel(grace=10)
        info = job.wait(60)
        assert info.state == JobState.cancelled
        assert b"got TERM" in b"".join(job.logs())  # the SIGTERM reached the job
        info = limited.wait(60)
        assert info.end_class == EndClass.timeout
    for ended in (job, limited):
        assert job_containers(agent.paths, ended.id) == []


def test_a_killed_leader_leaves_no_container(agent, minimal_image, project):
    root = project({"ends.py": ENDS})
    with agent.client() as client:
        job = client.submit(["ends.py", "wait"], workdir=root, image=minimal_image)
        wait_until(lambda: b"ready" in b"".join(job.logs()), 60)
        leader = json.loads((agent.paths.job_dir(job.id) / "shim.pid").read_text())
        os.killpg(leader["pid"], signal.SIGKILL)  # the leader and `podman run` at once
        info = job.wait(60)
        assert info.state == JobState.lost  # as a venv job whose leader left no status
    assert job_containers(agent.paths, job.id) == []


def test_what_cannot_run_in_an_image_is_refused_at_submit(
    agent, make_module_agent, minimal_image, project
):
    root = project({"ends.py": ENDS})
    with agent.client() as client:
        for bad in ("Not A Ref", "x" * 300, "--privileged"):
            with pytest.raises(GpuhopError) as e:
                client.submit(["ends.py", "exit"], workdir=root, image=bad)
            assert 400 <= e.value.status < 500 and "image" in e.value.message
        with pytest.raises(GpuhopError, match="python3"):
            client.submit(
                ["ends.py", "exit"], workdir=root, image=minimal_image, python="/usr/bin/python3"
            )
        # A Keras that cannot run across processes, whatever the image holds.
        with pytest.raises(GpuhopError, match="torch backend across processes"):
            client.submit(
                ["ends.py", "exit"],
                workdir=root,
                image=minimal_image,
                workers=2,
                env={"KERAS_BACKEND": "torch"},
            )
        missing_image = client.submit(
            ["ends.py", "exit"], workdir=root, image="localhost/gpuhop-test/absent:1"
        )
        info = missing_image.wait(60)
        assert info.state == JobState.failed
        assert "image localhost/gpuhop-test/absent:1 is not on this host" in (info.reason or "")
    done = agent.cli("run", "--image", minimal_image, "--python", "/usr/bin/python3", "x.py")
    assert done.returncode != 0 and "--python" in done.stderr
    both = agent.cli("run", "--image", minimal_image, "--no-image", "x.py")
    assert both.returncode != 0 and "--image" in both.stderr and "--no-image" in both.stderr
    # An agent whose host has no Podman says what to install; its default image (agent.toml)
    # is what a job that names none asks for.
    bare = make_module_agent(f'podman = "/nonexistent/podman"\nimage = "{minimal_image}"\n')
    with bare.client() as client, pytest.raises(GpuhopError) as e:
        client.submit(["ends.py", "exit"], workdir=root, requirements=False)
    assert e.value.status == 400 and "apt-get install podman runc" in e.value.message
    # A model server is such a job too: it would run in the default image.
    (root / "saved_model.pb").write_bytes(b"not read: refused before")
    with bare.client() as client, pytest.raises(GpuhopError) as e:
        client.serve(root, name="served", wait=False)
    assert e.value.status == 400 and "apt-get install podman runc" in e.value.message
    # Unless it says --no-image: then it runs with the host's Python (the agent's venv), as
    # a model server does.
    (root / "prefix.py").write_text("import sys; print(sys.prefix)\n")
    host = bare.cli("run", "--no-image", "--no-requirements", "prefix.py", cwd=root)
    assert (host.returncode, host.stdout) == (0, f"{sys.prefix}\n"), host.stderr
    with bare.client() as client:
        server = client.serve(root, name="served", no_image=True, wait=False)
        try:
            assert server.job.info.image is None
        finally:
            server.job.cancel(grace=0)
            server.job.wait(30)


def test_a_program_of_the_image_runs_though_the_host_lacks_it(
    agent, minimal_image, project, tmp_path
):
    """A bare name or an absolute path is the image's to find: submit does not look for it
    on the host (where a program the image holds, such as a model server's own, may be
    absent). A relative path is still a file of the synced tree."""
    import subprocess
    import uuid

    program = f"gpuhop-test-only-in-image-{uuid.uuid4().hex[:8]}"
    build = tmp_path / "build"
    build.mkdir()
    (build / program).write_text('#!/bin/sh\necho "in the image: $*"\n')
    (build / program).chmod(0o755)
    (build / "Containerfile").write_text(
        f"FROM {minimal_image}\nCOPY {program} /usr/local/bin/{program}\n"
    )
    ref = f"localhost/gpuhop-test/with-program:{os.getpid()}"
    subprocess.run(
        ["podman", "build", "-q", "-t", ref, str(build)], capture_output=True, check=True
    )
    try:
        root = project({"ends.py": ENDS})
        with agent.client() as client:
            for command in ([program, "a"], [f"/usr/local/bin/{program}", "b"]):
                job = client.submit(command, workdir=root, image=ref)
                info = job.wait(60)
                assert info.state == JobState.succeeded, info.reason
                assert f"in the image: {command[1]}" in b"".join(job.logs()).decode()
            # One the image lacks: its init cannot start it, and the reason says so.
            missing = client.submit([f"{program}-not-there"], workdir=root, image=ref).wait(60)
            assert missing.state == JobState.failed
            assert "its program could not be started in its image (No such file or" in (
                missing.reason or ""
            ), missing.reason
            # Off the image, the host is asked, as before.
            with pytest.raises(GpuhopError, match="was not found on the GPU host"):
                client.submit([program], workdir=root)
            with pytest.raises(GpuhopError, match="not among the synced files"):
                client.submit([f"bin/{program}"], workdir=root, image=ref)
    finally:
        subprocess.run(["podman", "rmi", "--force", "--ignore", ref], capture_output=True)


def test_an_image_whose_entrypoint_ate_the_command_is_said_so(
    agent, minimal_image, project, tmp_path
):
    """`podman run IMAGE COMMAND` puts the job's command after the image's ENTRYPOINT: one
    that runs its arguments (a script ending in `exec "$@"`, NVIDIA's images' shape) runs
    the job; one that does not (`["python3"]`) fails it, and the reason says the
    ENTRYPOINT ran with the job's command as its arguments, not only an exit code."""
    import subprocess

    refs = {
        "python": f"localhost/gpuhop-test/entrypoint-python:{os.getpid()}",
        "exec": f"localhost/gpuhop-test/entrypoint-exec:{os.getpid()}",
    }
    build = tmp_path / "build"
    build.mkdir()
    (build / "entry.sh").write_text('#!/bin/sh\necho "entrypoint ran"\nexec "$@"\n')
    (build / "entry.sh").chmod(0o755)
    files = {
        "python": f'FROM {minimal_image}\nENTRYPOINT ["python3"]\n',
        "exec": f'FROM {minimal_image}\nCOPY entry.sh /entry.sh\nENTRYPOINT ["/entry.sh"]\n',
    }
    try:
        for kind, text in files.items():
            (build / "Containerfile").write_text(text)
            subprocess.run(
                ["podman", "build", "-q", "-t", refs[kind], str(build)],
                capture_output=True,
                check=True,
            )
        root = project({"ends.py": ENDS})
        with agent.client() as client:
            ran = client.submit(["ends.py", "exit"], workdir=root, image=refs["exec"])
            info = ran.wait(60)
            assert info.exit_code == 3, info.reason  # the job's own code, run by the script
            assert "ENTRYPOINT" not in (info.reason or "")  # the job's own failure, said so
            assert b"entrypoint ran\nready" in b"".join(ran.logs())
            eaten = client.submit(["ends.py", "exit"], workdir=root, image=refs["python"])
            info = eaten.wait(60)
            # A gang's Keras is asked of the image's python3 the same way: no answer is not
            # "tf-keras is not installed", and the ENTRYPOINT is named.
            gang = client.submit(["ends.py"], workdir=root, image=refs["python"], workers=2)
            why = gang.wait(60).reason or ""
            assert "python3 did not say which Keras it has" in why, why
            assert "tf-keras is not installed" not in why
            assert 'the image\'s ENTRYPOINT ["python3"] ran with `python3 -c ...`' in why
            # Its requirements are installed by the image's pip, started the same way.
            (root / "requirements.txt").write_text("six\n")
            built = client.submit(
                ["ends.py"], workdir=root, image=refs["python"], requirements=True
            ).wait(60)
            assert 'ENTRYPOINT ["python3"] ran with `python3 -m pip install' in (
                built.reason or ""
            ), built.reason
            (root / "requirements.txt").unlink()
            # In an image without one, a failure is the job's exit code alone.
            plain = client.submit(["ends.py", "exit"], workdir=root, image=minimal_image)
            assert "ENTRYPOINT" not in (plain.wait(60).reason or "ENTRYPOINT")
        assert info.state == JobState.failed and info.end_class == EndClass.app_error
        assert (info.reason or "").startswith(
            "exited with code 2; the image's ENTRYPOINT [\"python3\"] ran with the job's"
            " command as its arguments (python3 ends.py exit)"
        ), info.reason
    finally:
        for ref in refs.values():
            subprocess.run(["podman", "rmi", "--force", "--ignore", ref], capture_output=True)


def test_images_pull_of_an_image_built_on_the_host_says_no_registry_holds_it(agent, minimal_image):
    """`localhost/...` names an image built on the host: `images pull` asks no registry (Podman
    would try one at localhost:443 and answer "connection refused"), and says whether the
    image is here."""
    with agent.client() as client:
        with pytest.raises(GpuhopError) as e:
            client.pull_image(minimal_image)
        assert e.value.status == 400
        assert "built on this host" in e.value.message and "nothing to pull" in e.value.message
        with pytest.raises(GpuhopError) as e:
            client.pull_image("localhost/gpuhop-test/absent:1")
        assert e.value.status == 400
        assert "localhost/gpuhop-test/absent:1 is not on this host" in e.value.message
        assert "localhost:443" not in e.value.message and "connection refused" not in (
            e.value.message
        )
    done = agent.cli("images", "pull", "localhost/gpuhop-test/absent:1")
    assert done.returncode != 0 and "which no registry holds" in done.stderr


def test_a_multi_worker_job_whose_image_lacks_its_keras_is_told_to_install_it_there(
    agent, minimal_image, project
):
    """The image's own python3 is asked which Keras it has; where it has none that runs across
    processes, the job's reason says to install it in the image, not on the host."""
    root = project({"ends.py": ENDS})
    with agent.client() as client:
        job = client.submit(["ends.py", "exit"], workdir=root, image=minimal_image, workers=2)
        info = job.wait(60)
    assert info.state == JobState.failed
    assert "`pip install tf-keras` in the job's image" in (info.reason or ""), info.reason
    assert "on the host" not in (info.reason or "")


def test_an_image_removed_as_its_job_starts_is_named_so(minimal_image, tmp_path):
    """The leader runs a job's container by the id the agent found its image by as the job
    started, and does not look it up again (a Podman start less); where the image went in
    between, Podman's own failure (125, "image not known") is said as that."""
    import subprocess

    from gpuhop.backends.local import container
    from gpuhop.backends.local.podman import Mounts, PodmanSettings, describe

    gone = "f" * 64  # the id of an image no longer in the store
    user = f"{os.getuid()}:{os.getgid()}"
    name = f"gpuhop-test-gone-{os.getpid()}"
    spec = describe(PodmanSettings(), gone, name, user, tmp_path, Mounts(), minimal_image)
    assert container.prepare(spec, None) is None  # not looked up: the agent just did
    args, env, fds = container.argv(spec, {"PATH": os.environ["PATH"]}, ["true"])
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, pass_fds=fds)
    for fd in fds:
        os.close(fd)
    assert done.returncode == 125 and "image not known" in done.stderr, done.stderr
    ended = container.outcome(spec, {"exit_code": 125, "signal": None})
    assert ended["detail"] == (
        f"image {minimal_image} (id ffffffffffff) was removed from this host as the job"
        f" started; pull it there again (podman pull {minimal_image})"
    )
    # A 125 while the image is there is Podman's own failure, said as before.
    here = dict(spec, image=minimal_image)
    assert container.outcome(here, {"exit_code": 125, "signal": None})["detail"] == (
        "exited with code 125: Podman could not run the container (its message is above)"
    )
    # Where the agent could not say which image (none noted), the leader looks for itself.
    unnoted = describe(
        PodmanSettings(), "localhost/gpuhop-test/absent:2", name, user, tmp_path, Mounts()
    )
    assert "is not on this host" in (container.prepare(unnoted, None) or "")


NETWORK = r"""
import json, os
print(json.dumps(sorted(os.listdir("/sys/class/net"))), flush=True)
"""


def test_an_image_job_has_the_host_network_as_a_venv_job_or_a_private_one(
    agent, minimal_image, project
):
    root = project({"net.py": NETWORK})
    before = set(os.listdir("/sys/class/net"))
    with agent.client() as client:
        host = client.submit(["net.py"], workdir=root, image=minimal_image)
        private = client.submit(["net.py"], workdir=root, image=minimal_image, private_network=True)
        for job in (host, private):
            info = job.wait(60)
            assert info.state == JobState.succeeded, (info.reason, b"".join(job.logs()))
        seen = {
            j.id: json.loads(b"".join(j.logs()).decode().splitlines()[-1]) for j in (host, private)
        }
    # The host's own interfaces (others' tests may add or remove some meanwhile: those
    # there before and after are the host's, whatever else comes and goes).
    stable = before & set(os.listdir("/sys/class/net"))
    assert stable - {"lo"} and stable <= set(seen[host.id])
    assert seen[private.id] == ["lo"]


PEERS = r"""
import json, os, socket, time
config = json.loads(os.environ["TF_CONFIG"])
me = config["task"]["index"]
host, port = config["cluster"]["worker"][me].rsplit(":", 1)
server = socket.create_server(("0.0.0.0", int(port)))  # every interface, as TensorFlow's
peer = config["cluster"]["worker"][1 - me].rsplit(":", 1)
while True:
    try:
        socket.create_connection((peer[0], int(peer[1])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.05)
nets = sorted(os.listdir("/sys/class/net"))
print(f"worker {me} of {len(config['cluster']['worker'])} reached its peer; {nets}", flush=True)
server.accept()[0].close()  # the peer's connection: it has reached this one too
"""


def test_workers_in_an_image_reach_each_other_on_their_own_network(agent, minimal_image, project):
    root = project({"peers.py": PEERS})
    with agent.client() as client:
        # A custom training loop's choice (no Keras fit): TF_CONFIG, nothing to import.
        gang = client.submit(
            ["peers.py"],
            workdir=root,
            image=minimal_image,
            workers=2,
            env={"TF_USE_LEGACY_KERAS": "0"},
        )
        info = gang.wait(90)
        log = b"".join(gang.logs()).decode()
        assert info.state == JobState.succeeded, (info.reason, log)
        for i in (0, 1):
            assert f"[worker {i}] worker {i} of 2 reached its peer; ['lo']" in log
        # Keras fit across workers needs tf-keras, which the image lacks: asked of the
        # image's own Python as the job starts, and said.
        fit = client.submit(["peers.py"], workdir=root, image=minimal_image, workers=2)
        info = fit.wait(90)
        assert info.state == JobState.failed
        assert "tf-keras is not installed for the job's Python" in (info.reason or "")
    assert job_containers(agent.paths, gang.id) == []


GANG_ENDS = r"""
import json, os, signal, time
me = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print(f"worker {me} ready", flush=True)
if me == 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(600)  # worker 0: until the leader stops it
"""


def test_a_worker_killed_in_its_container_reads_as_killed(agent, minimal_image, project):
    """Podman reports a container whose job was killed by signal N as 128+N: a gang's reason
    names the worker's signal, as a single container's and a venv worker's do."""
    root = project({"gang_ends.py": GANG_ENDS})
    with agent.client() as client:
        gang = client.submit(
            ["gang_ends.py"],
            workdir=root,
            image=minimal_image,
            workers=2,
            env={"TF_USE_LEGACY_KERAS": "0"},  # TF_CONFIG only: no Keras asked of the image
        )
        info = gang.wait(90)
    assert info.state == JobState.failed and info.end_class == EndClass.killed
    assert (info.exit_code, info.signal) == (None, signal.SIGKILL)
    assert (info.reason or "").startswith("worker 1 was killed by signal 9 (SIGKILL) first;"), (
        info.reason
    )
    assert job_containers(agent.paths, gang.id) == []


def test_a_gang_whose_program_the_image_lacks_says_so(agent, minimal_image, project):
    """Each worker's init prints why it could not start the program (behind the worker's
    prefix in the job's log): the gang's reason says so, as a single container's does."""
    root = project({"gang_ends.py": GANG_ENDS})
    with agent.client() as client:
        gang = client.submit(
            ["not-in-the-image"],
            workdir=root,
            image=minimal_image,
            workers=2,
            env={"TF_USE_LEGACY_KERAS": "0"},
        )
        info = gang.wait(90)
    assert info.state == JobState.failed and info.end_class == EndClass.app_error
    reason = info.reason or ""
    assert reason.startswith("worker "), reason
    assert "; its program could not be started in its image (No such file or directory)" in (
        reason
    ), reason
    assert job_containers(agent.paths, gang.id) == []


GATED = r"""
import os, time
print("ready", flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)
print("went on", flush=True)
"""


def test_an_image_job_outlives_an_agent_restart_and_is_reattached(agent, minimal_image, project):
    root = project({"gated.py": GATED})
    with agent.client() as client:
        job = client.submit(["gated.py"], workdir=root, image=minimal_image)
        wait_until(lambda: b"ready" in b"".join(job.logs()), 60)
    os.kill(agent.pid, signal.SIGKILL)
    wait_until(lambda: read_pid(agent.paths) is None, 10)
    agent.pid = start_background(
        agent.paths, agent_args=agent.args, python_flags=AGENT_PYTHON_FLAGS
    )
    (agent.paths.job_dir(job.id) / "work" / "go").touch()
    with agent.client() as client:
        info = client.job(job.id).wait(60)
        assert info.state == JobState.succeeded
        assert b"went on" in b"".join(client.job(job.id).logs())
    assert job_containers(agent.paths, job.id) == []
