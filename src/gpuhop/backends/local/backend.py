"""Runs in the agent: the local backend, which runs each job's attempt on the agent's own
host under a leader (`leader.py` beside this file) that leads its process group.

Sets the job's environment contract (`jobenv`), describes a multi-worker job's gang and what the job
needs besides its files (its Python environment, its read-only datasets) for the leader, and
starts the leader in a new session with stdout and stderr going straight to the job's log
(gpuhop.backends.leader). The leader imports the standard library only and writes the
attempt's end to the job's status file, so a restarted agent still learns how it ended.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuhop.api import ErrorCode
from gpuhop.api.spec import JobSpec
from gpuhop.backends import jobdeps, kerasmode
from gpuhop.backends.base import Attempt, Ending, GpuHost, Refused, Started, StartError
from gpuhop.backends.jobdeps import python as job_python
from gpuhop.backends.leader import LeaderBackend, read_json
from gpuhop.backends.local import cgroups, podman
from gpuhop.backends.local.commands import resolve_command
from gpuhop.backends.local.forkserver import SERVER as LEADER_SERVER
from gpuhop.backends.local.forkserver import ForkServer, ServerGone, check_os_text
from gpuhop.backends.local.jobenv import job_environment
from gpuhop.backends.local.jobfiles import VAR_TMP, give, own_files
from gpuhop.backends.local.sandbox import HOW_TO_ALLOW
from gpuhop.backends.procs import alive
from gpuhop.home import AgentPaths, JobPaths
from gpuhop.runtime import hook

log = logging.getLogger("gpuhop.agent")

SANDBOX = str(Path(__file__).with_name("sandbox.py"))
WORKVIEW = str(Path(__file__).with_name("workview.py"))
# An unprivileged uid no account has (the top of the identities' default range, see
# gpuhop.agent.host.identities), as which the overlay of an idmapped checkout is tried.
PROBE_UID = 2_000_099_999
# In a job's dir: what its leader runs, for the leader server; the leader reads it and removes
# it. The name is the one it had when the leader was called the shim, as every on-disk name.
LEADER_REQUEST = "shim-request.json"
# How often a job whose leader the server started is checked for an end the server never told.
END_CHECK_SECONDS = 5.0


def _remove_tree(path: Path) -> None:
    """Remove a job's tree, including read-only dirs it made."""
    for dirpath, _dirs, _files in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(dirpath, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def _probe(python: str, helper: str, *args: str) -> str | None:
    """Run `helper --probe [ARGS]`: None if it passed, else why not."""
    try:
        probe = subprocess.run(
            [python, "-I", "-S", helper, "--probe", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"the probe {Path(helper).name} did not run ({e})"
    if probe.returncode == 0:
        return None
    why = probe.stderr.strip().splitlines()[-1:] or [f"exit code {probe.returncode}"]
    return why[0]


class LocalBackend(LeaderBackend):
    name = "local"
    identities = True

    def __init__(
        self,
        paths: AgentPaths,
        gpu_host: GpuHost,
        python: str,
        containers: podman.PodmanSettings | None = None,
        ready_containers: bool = True,
    ):
        """`paths`: the agent's state dir, whose stored copies a sandboxed job must not
        write; `python` runs the leader, and a job's `.py` script unless it has its own;
        `containers`: the Podman that runs jobs in container images (`--image`);
        `ready_containers`: whether an image job's next ones find a container started ahead
        (agent.toml's ready_containers: gpuhop.backends.local.ready)."""
        super().__init__(gpu_host, python)
        self.paths = paths
        self.containers = containers or podman.PodmanSettings()
        # Jobs' leaders are forked by a warm server (a fresh interpreter each where it fails).
        self._forks = ForkServer(python)
        self.ready_containers = ready_containers
        # Cgroups an earlier run left (an end that came while the kernel still refused).
        cgroups.sweep(paths.jobs)

    def describe(self) -> str:
        return f"running jobs on this host ({len(self.gpu_host.gpus)} GPU(s))"

    @functools.cached_property
    def _isolation(self) -> str | None:
        why = _probe(self.python, SANDBOX)
        return None if why is None else f"{why}; {HOW_TO_ALLOW}"

    def isolation(self) -> str | None:
        """None when every job runs in its own view of this host (sandbox.py); else why
        not, and what to allow. Asked of the host once."""
        return self._isolation

    @functools.cached_property
    def _work_view(self) -> str | None:
        if self.isolation() is not None:
            return "jobs run without a sandbox here, and the overlay lives in one"
        return _probe(self.python, WORKVIEW)

    @functools.cached_property
    def _owned_view(self) -> str | None:
        if self.work_view() is not None:
            return self.work_view()
        if os.geteuid() != 0:
            return "only a root agent gives jobs identities of their own"
        return _probe(self.python, WORKVIEW, str(PROBE_UID))

    def work_view(self, owned: bool = False) -> str | None:
        """None when each job sees its tree's checkout through an overlay of its own
        (workview.py); else why it gets a copy. With `owned`, for a job with an identity of
        its own, which sees the checkout idmapped as that identity's. Asked of the host
        once each."""
        return self._owned_view if owned else self._work_view

    def check_submit(self, spec: JobSpec) -> None:
        """Every kind of job runs here; a multi-worker one in a mode that works for its Keras;
        one in a container image where Podman is installed. An image's packages are asked
        as its job starts (a Keras the image lacks fails it then, saying so)."""
        if spec.image is None:
            kerasmode.check_submit(spec, self.python)
            return
        if podman.find(self.containers) is None:
            raise Refused(ErrorCode.bad_request, podman.missing(self.containers))
        if spec.workers > 1:
            try:
                kerasmode.decide(spec.env, lambda m: True)
            except kerasmode.KerasRefusal as e:
                raise Refused(ErrorCode.bad_request, str(e)) from None

    def end_the_rest(self, jp: JobPaths) -> str | None:
        """A sandboxed job's processes (`setsid` ones too) all live in its PID namespace,
        which ends with its first process, the leader's child: the kernel kills the rest and
        that process is gone only once they all are. So kill it and wait until it is gone.
        (A SIGKILL to the group can end the leader before its child has finished.)"""
        leader = read_json(jp.leader_pid) or {}
        names = leader.get("containers")
        if isinstance(names, list) and names and not jp.status.exists():
            self._remove_containers([str(n) for n in names])  # the leader was killed first
        init, init_start = leader.get("init"), leader.get("init_start")
        if not isinstance(init, int) or init_start is None:
            return None  # not sandboxed, or unknown: never signal a pid we cannot vouch for
        while alive(init, str(init_start)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(init, signal.SIGKILL)
            time.sleep(0.02)
        return None

    def _remove_containers(self, names: list[str]) -> None:
        """Remove a container job's containers, which a killed `podman run` leaves running."""
        program = podman.find(self.containers)
        if program is None:
            return
        runtime = podman.runtime(self.containers)
        argv = [program, *(["--runtime", runtime] if runtime else [])]
        try:
            subprocess.run(
                [*argv, "rm", "--force", "--ignore", "--time", "0", *names],
                capture_output=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("could not remove the containers %s: %s", " ".join(names), e)

    def leader(
        self, attempt: Attempt, jp: JobPaths, deps: dict[str, Any]
    ) -> tuple[list[str], dict[str, str]]:
        """A fresh interpreter for the leader, where the warm server could not start it: it
        reads its request from a file as the server's leaders do (`leaderserver --become`),
        the job's environment among it. That environment is never the interpreter's own, nor
        its cgroup shell's: they run as root on a team agent, and a user's variable there
        (LD_PRELOAD, say) would run their code as root. Theirs is the agent's PATH alone."""
        args, env, cgroup = self._invocation(attempt, jp, deps)
        check_os_text(args, env)
        request = jp.root / LEADER_REQUEST
        fd = os.open(request, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with open(fd, "w") as f:
            json.dump({"argv": args, "env": env, "cwd": str(jp.work), "specs": {}}, f)
        leader = [self.python, "-I", "-S", LEADER_SERVER, "--become", str(request)]
        own = {"PATH": os.environ.get("PATH", os.defpath)}
        return (leader if cgroup is None else cgroups.wrap(cgroup, leader)), own

    def _invocation(
        self,
        attempt: Attempt,
        jp: JobPaths,
        deps: dict[str, Any],
        cgroup: Callable[[JobPaths, str], Path | None] = cgroups.make,
        specs: dict[str, Any] | None = None,
    ) -> tuple[list[str], dict[str, str], Path | None]:
        """The leader's arguments and environment, and the attempt's cgroup (if one was made,
        or for `cgroups.plan`, will be). With `specs`, the sandbox's spec goes there, not
        to a file."""
        identity = deps.get("identity")
        passed = tuple(identity["pass"]) if identity else None
        image = attempt.spec.image
        if image is not None and passed is None:
            passed = ()  # the agent's own variables stay out of the image, but the allow-list's
        env = job_environment(attempt, jp, gpu_total_mb=self._gpu_total_mb(attempt), passed=passed)
        # The job's secrets (read by the agent as it starts): in its environment only, and
        # masked in its output by the leader (`--mask` names the variables, never a value).
        secrets = deps.get("secrets") or {}
        env.update(secrets)
        if deps.get("data_dir"):  # its buckets' data, each at NAME in it (read-only)
            env["GPUHOP_DATA"] = str(jp.work / deps["data_dir"])
        if identity:
            # Its own home (pip's, Keras's and Hugging Face's caches), not the agent's.
            env.update(HOME=identity["home"], USER=identity["user"], LOGNAME=identity["user"])
        python = job_python(deps, self.python)
        # `python` and `pip` in the job's shell commands are the job's own interpreter's.
        env["PATH"] = os.pathsep.join(
            p for p in (os.path.dirname(python), env.get("PATH", os.defpath)) if p
        )
        jp.tmp.mkdir(mode=0o700, exist_ok=True)
        jp.control.mkdir(mode=0o700, exist_ok=True)
        jp.provenance.touch()
        if identity:
            (jp.root / VAR_TMP).mkdir(mode=0o700, exist_ok=True)
        # The sandbox binds it over /tmp; without one, TMPDIR is all that points there. A
        # TMPDIR the user set (-e TMPDIR=...) is theirs.
        if "TMPDIR" not in attempt.spec.env:
            env["TMPDIR"] = "/tmp" if self._sandboxed(deps) else str(jp.tmp)
        # What the job will see in its work dir: its checkout, under what the agent put there.
        files = (
            jp.work if (jp.work / attempt.command[0]).exists() else deps.get("checkout", jp.work)
        )
        if image is not None:
            argv = podman.command(attempt.command, jp.work)
            gang = []
            if attempt.spec.workers > 1:
                # Its Keras is the image's: asked of the image's python3, in a container.
                probe = podman.probe_prefix(self.containers, image)
                gang = self._write_gang(attempt, jp, env, "python3", deps, probe)
            home = Path(identity["home"]) if identity else self._image_home()
            gang += podman.container_args(self.containers, attempt, jp, deps, env, specs, home)
            alone = attempt.spec.workers == 1 and not attempt.spec.private_network
            if specs is not None and alone and not deps.get("env") and self.ready_containers:
                # The next job like it finds a container started ahead (ready.py).
                ready = podman.ready_spec(
                    specs["container"], env, self.paths.jobs, self.paths.ready
                )
                if ready is not None:
                    specs["ready"] = ready
            if deps.get("env"):  # --requirements on top of the image (the leader builds it)
                env_spec = dict(deps["env"], requirements=str(jp.root / "requirements.txt"))
                (jp.root / "env.json").write_text(json.dumps(env_spec))
                gang += ["--env", str(jp.root / "env.json")]
        else:
            argv = resolve_command(
                attempt.command, Path(files), env.get("PATH", os.defpath), python
            )
            if argv[0].startswith(f"{files}/"):  # a program in the checkout: from the view
                argv[0] = f"{jp.work}{argv[0][len(str(files)) :]}"
            gang = (
                self._write_gang(attempt, jp, env, python, deps) if attempt.spec.workers > 1 else []
            )
            gang += self._isolation_args(deps, jp, attempt.spec.workers, specs)
        if attempt.spec.private_network or attempt.spec.workers > 1:
            gang += ["--relay", str(jp.relay)]
        if secrets:
            gang += ["--mask", ",".join(secrets)]
        args = [str(jp.status), str(jp.leader_pid), *gang, "--", *argv]
        return args, env, cgroup(jp, f"{attempt.job_id}-{attempt.number}")

    def _image_home(self) -> Path:
        """HOME of this (single-user) agent's jobs in a container image: not its user's own
        home, which holds the state dir (and Python packages of the host's, which the
        image's Python would import from there), but one the agent makes in the state dir,
        as a team agent's identities have, kept across the jobs (their caches)."""
        home = self.paths.user_home(os.getuid())
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        return home

    def start(self, attempt: Attempt, jp: JobPaths, deps: dict[str, Any]) -> Started:
        try:
            return self._spawn(attempt, jp, deps) or super().start(attempt, jp, deps)
        except BaseException:
            cgroups.oom_kills(jp)  # removes the attempt's cgroup, if it was made
            raise

    def _spawn(self, attempt: Attempt, jp: JobPaths, deps: dict[str, Any]) -> Started | None:
        """Start the leader through the warm leader server; None where it cannot (the caller
        then starts a fresh interpreter for it)."""
        try:
            # The server makes the cgroup, or gives its waiting leader's cgroup that name.
            specs: dict[str, Any] = {}  # handed over in the request: one file fewer
            args, env, cgroup = self._invocation(attempt, jp, deps, cgroups.plan, specs)
            check_os_text(args, env)
            request = jp.root / LEADER_REQUEST
            pid, start = self._forks.spawn(args, env, jp.work, jp.log, cgroup, request, specs)
        except ServerGone as e:
            log.warning("job %s: %s; starting its leader directly", attempt.job_id, e)
            cgroups.oom_kills(jp)  # made again by the direct start
            return None
        except (StartError, OSError):
            raise
        except Exception as e:  # as LeaderBackend.start: the job's fault, said as such
            raise StartError(f"{type(e).__name__}: {e}") from e
        return Started(pid, start)

    def wait(self, jp: JobPaths, started: Started) -> Ending:
        end = self._forks.ended(started.pid)
        if end is None:
            return super().wait(jp, started)
        code = None
        while True:
            try:
                code = end.result(timeout=END_CHECK_SECONDS)
                break
            except concurrent.futures.TimeoutError:
                # The server tells each end; should that word ever be lost, a leader that is
                # gone must not leave its job running forever: watch it as after a restart.
                if not self.alive(started):
                    break
        self._forks.forget(started.pid)
        if code is None:  # the server went away first: watch the leader as after a restart
            return super().wait(jp, started)
        return self._ending(jp, started, code)

    def close(self) -> None:
        self._forks.close()
        cgroups.sweep(self.paths.jobs)

    def _ending(self, jp: JobPaths, started: Started | None, returncode: int | None) -> Ending:
        end = super()._ending(jp, started, returncode)
        # The job's /tmp stays, with the rest of its dir (a retry continues with it, `pull`
        # and `serve` find what it saved there), until retention prunes the job's files.
        _remove_tree(jp.root / VAR_TMP)
        # Read once the job's processes are all gone (the sweep above waits for them).
        return dataclasses.replace(end, oom_killed=True) if cgroups.oom_kills(jp) else end

    def _gpu_total_mb(self, attempt: Attempt) -> int | None:
        """The memory of a share job's GPU (None for other jobs, or if unknown)."""
        if attempt.spec.gpu_memory_mb is None or not attempt.gpu_ids:
            return None
        return next(
            (g.memory_mb for g in self.gpu_host.gpus if g.index == attempt.gpu_ids[0]), None
        )

    def _sandboxed(self, deps: dict[str, Any]) -> bool:
        return self.isolation() is None or bool(jobdeps.mounts(deps))

    def _write_gang(
        self,
        attempt: Attempt,
        jp: JobPaths,
        env: dict[str, str],
        python: str,
        deps: dict,
        probe: tuple[str, ...] | None = None,
    ) -> list[str]:
        """Describe a multi-worker job's workers for the leader; return the leader's arguments.

        Each worker gets its slice of the job's GPUs and its own log; the leader adds what
        each worker is told of its peers (TF_CONFIG, or Keras 3's distribution variables,
        by the job's mode: see kerasmode) once it has the ports of the job's private network.
        """
        found: dict[str, bool] = {}
        try:
            prefix = self._probe_prefix(deps, jp) if probe is None else probe
            found = kerasmode.packages(python, prefix, attempt.spec.env.get("PYTHONPATH"))
            where = "on the host" if probe is None else "in the job's image"
            mode = kerasmode.decide(attempt.spec.env, lambda m: found.get(m, False), where)
        except kerasmode.KerasRefusal as e:
            if probe is not None and not found:  # no answer: not known to lack tf-keras
                raise StartError(podman.unanswered(self.containers, probe[-1])) from None
            raise StartError(str(e)) from None
        env.update({k: v for k, v in mode.env.items() if k not in attempt.spec.env})
        per = len(attempt.gpu_ids) // attempt.spec.workers
        workers = []
        for i in range(attempt.spec.workers):
            gpus = attempt.gpu_ids[i * per : (i + 1) * per]
            workers.append(
                {
                    "env": {
                        "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
                        "GPUHOP_WORKER_INDEX": str(i),
                    },
                    "log": str(jp.worker_log(i)),
                }
            )
        spec = {
            "workers": workers,
            "grace": 10,
            "timeout": attempt.spec.worker_timeout,
            "mode": mode.mode,
        }
        jp.gang.write_text(json.dumps(spec))
        return ["--gang", str(jp.gang)]

    def _isolation_args(
        self, deps: dict[str, Any], jp: JobPaths, workers: int, specs: dict[str, Any] | None
    ) -> list[str]:
        """The leader's `--env` and `--sandbox` arguments for these deps; makes the mount
        points of its datasets and other read-only dirs (`jobdeps.mounts`). Every job gets a
        sandbox where this host allows one; a job with such mounts gets one anyway (and
        fails, saying why, where the host allows none)."""
        args: list[str] = []
        if deps.get("env"):
            spec = dict(deps["env"], requirements=str(jp.root / "requirements.txt"))
            (jp.root / "env.json").write_text(json.dumps(spec))
            args += ["--env", str(jp.root / "env.json")]
        if not self._sandboxed(deps):
            return args  # a single-user agent's choice; see gpuhop doctor
        binds = []
        for mount in jobdeps.mounts(deps):
            target = jp.work / mount["mount"]
            target.mkdir(parents=True, exist_ok=True)
            binds.append({"source": mount["source"], "target": str(target)})
        identity = deps.get("identity")
        hide = self._covers() if identity else []
        spec = {
            "home": str(self.paths.home),
            "work": str(jp.work),
            "lower": deps.get("checkout"),
            "keep": self._view(deps, jp, workers, hide),
            "binds": binds,
            "tmp": str(jp.tmp),
        }
        if identity:
            spec.update(
                identity={k: identity[k] for k in ("user", "uid", "gid")},
                hide=hide,
                private=[{"path": "/var/tmp", "source": str(jp.root / VAR_TMP)}],
            )
            if spec["lower"]:  # its checkout, seen as its own (workview.py)
                spec["lower_owner"] = {"uid": identity["uid"], "gid": identity["gid"]}
        if specs is not None:
            specs["sandbox"] = spec
            return args
        (jp.root / "sandbox.json").write_text(json.dumps(spec))
        return [*args, "--sandbox", str(jp.root / "sandbox.json")]

    def _view(
        self, deps: dict[str, Any], jp: JobPaths, workers: int, hide: list[str]
    ) -> list[dict[str, Any]]:
        """What the job sees of the state dir (and of what else `hide` covers): its own
        files (made here if missing, so that each can be bound), its environment and what
        else it may read. For a job with an identity of its own, its own files are made
        that identity's, and so is its home."""
        identity = deps.get("identity")
        own = own_files(jp, workers, identity)
        keep: list[dict[str, Any]] = [{"path": str(p)} for p in own]
        readable = [*deps.get("readonly", [])]
        if deps.get("env"):
            readable.append(deps["env"]["dir"])
            if identity:
                # Built in the job's sandbox, by the job's identity, from its requirements.
                env_dir = Path(deps["env"]["dir"])
                env_dir.mkdir(parents=True, exist_ok=True)
                if not (env_dir / "gpuhop-env.json").exists():
                    give(identity, [env_dir])
                readable.append(str(jp.root / "requirements.txt"))
        readable += self._installs(hide)
        return keep + [{"path": p, "readonly": True} for p in readable]

    def _installs(self, hide: list[str]) -> list[str]:
        """gpuhop's own Python and package, where they lie in the state dir (`remote
        bootstrap` puts its venv there), under /tmp (a checkout there, which the job's own
        /tmp hides) or under `hide`: the job's interpreter and its start-up hook come from
        them. Also every dir on the agent's own sys.path (the job's interpreter is the
        agent's, or a venv on top of it): a `.pth` file may add one there, as `remote
        bootstrap`'s venv does for the host's TensorFlow; and the base interpreter of a
        venv (root's pyenv, under a hidden /root)."""
        install = Path(self.python).parent.parent
        package = Path(hook.__file__).resolve().parents[2]  # src/ or site-packages/
        on_path = [
            Path(p)
            for p in sys.path
            if Path(p).name in ("site-packages", "dist-packages") and os.path.isdir(p)
        ]
        base = Path(sys.base_prefix).resolve()
        covered = [self.paths.home, Path("/tmp"), *map(Path, hide)]
        return [
            str(path)
            for path in dict.fromkeys((install, package, base, *on_path))
            if any(path.is_relative_to(p) for p in covered)
            and not any(path.is_relative_to(p) for p in (install, package, base) if p != path)
        ]

    def _covers(self) -> list[str]:
        install = Path(self.python).parent.parent
        return _covers([self.paths.home, install, Path(sys.base_prefix)])

    def _probe_prefix(self, deps: dict[str, Any], jp: JobPaths) -> tuple[str, ...]:
        """For a job with an identity of its own: what runs a probe of its interpreter (which
        may be a venv its user built, with .pth files of theirs) in a sandbox of its own,
        as that identity, seeing the state dir no more than the job would. Else ()."""
        identity = deps.get("identity")
        if not identity:
            return ()
        hide = self._covers()
        readable = [str(jp.work), *self._installs(hide)]
        if deps.get("env"):
            readable.append(deps["env"]["dir"])
        spec = {
            "home": str(self.paths.home),
            "work": str(jp.work),
            "keep": [{"path": p, "readonly": True} for p in readable],
            "binds": [],
            "identity": {k: identity[k] for k in ("user", "uid", "gid")},
            "hide": hide,
        }
        return (self.python, "-I", "-S", SANDBOX, "--run", json.dumps(spec), "--")


def _covers(reached: list[Path]) -> list[str]:
    """What a job with an identity of its own has covered (an empty read-only tmpfs, with
    what it may see bound back): the agent's user's home (root's /root holds its SSH keys,
    shell history and credentials), unless it is `/`; and the first dir on the way to each
    of `reached` (the state dir, the interpreter) that others may not pass, so that its own
    files and the interpreter can be reached through the cover's open dirs."""
    import pwd

    covers = []
    with contextlib.suppress(KeyError):
        home = os.path.realpath(pwd.getpwuid(os.geteuid()).pw_dir)
        if home != "/":
            covers.append(home)
    for path in reached:
        real = Path(os.path.realpath(path))
        if any(real.is_relative_to(c) for c in covers):
            continue
        for parent in reversed([real, *real.parents][:-1]):  # from the top down, not `/`
            with contextlib.suppress(OSError):
                if not parent.stat().st_mode & stat.S_IXOTH:
                    covers.append(str(parent))
                    break
    return covers
