"""Fixtures shared by the integration and end-to-end tests: real agents on real sockets.

Every agent a test starts lives in its own temp state dir and is stopped at teardown by
pid, after every job it still runs has been killed by process group.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import HealthCheck, settings

from gpuhop.api import ListenerInfo
from gpuhop.client import Client
from gpuhop.client.embedded import start_background, stop
from gpuhop.home import AgentPaths, read_pid

# The container images the tests build (tests/images.py), one fixture of each for the whole
# session in each process: defined here once, not in each module that asks (which built
# the image again, and left the first build behind untagged).
pytest_plugins = ["tests.images"]

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

# The agents under test turn warnings into errors, as pytest does for the tests themselves
# (pyproject's filterwarnings), and what they log is read after every test
# (`Agent.check_log`): a traceback or a warning no test declared fails the test.
AGENT_PYTHON_FLAGS = ("-W", "error")
# ... and for the agents a command under test starts itself (`gpuhop agent start`, a remote's
# bootstrap, a command that finds none running): client/embedded.py reads it.
AGENT_FLAGS_ENV = {"GPUHOP_AGENT_PYTHON_FLAGS": " ".join(AGENT_PYTHON_FLAGS)}

# Hypothesis's clocks (an example's deadline, the health check on slow input generation)
# fail a test for how busy the machine is, not for what the test checks: off, as any timed
# assertion would be. (A test that sets its own `suppress_health_check` adds to this list.)
settings.register_profile("gpuhop", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpuhop")

# An entry of an agent's log (a line with a timestamp, and the lines below it up to the next
# one) that says something went wrong that nobody handled: a traceback (`log.exception`, or
# an error that escaped to uvicorn or asyncio), an exception in a destructor, a warning.
LOG_ALARM = re.compile(
    r"Traceback \(most recent call last\)|Exception ignored|Task exception was never retrieved"
    r"|\w+Warning: | (?:ERROR|CRITICAL) (?:uvicorn|asyncio)"
)
LOG_ENTRY_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", re.MULTILINE)

# The agents running now, and what the current test said its agents may log (the regexes of
# its `agent_log` marker); both kept by `_agent_logs_checked`.
_running: list[Agent] = []
_expected_in_log: tuple[str, ...] = ()


def unexpected_log_entries(text: str, expected: tuple[str, ...] = ()) -> list[str]:
    """The entries of an agent's log `text` that alarm (`LOG_ALARM`) and that none of the
    `expected` regexes finds."""
    starts = [m.start() for m in LOG_ENTRY_START.finditer(text)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    entries = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    return [
        entry.rstrip()
        for entry in entries
        if LOG_ALARM.search(entry) and not any(re.search(p, entry) for p in expected)
    ]


# A job has a /tmp of its own, so the files a test shares with its jobs (gates, pids,
# markers in tmp_path) must lie outside /tmp: pytest's temp dirs go under /var/tmp (pytest
# keeps the last 3 runs' there, as it does under /tmp). Set before pytest first asks.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", "/var/tmp")

# Ctrl-C reaches the commands these tests start as it does on a user's terminal, also where
# the suite itself was started with SIGINT ignored (a shell's `cmd &` without job control
# does that, and every child inherits it: Python then never raises KeyboardInterrupt).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# CI (`.ci/run`) sets this: a real component the suite expects (Slurm, sshd, Chromium, Ray)
# that is missing fails the tests that need it, instead of skipping them quietly.
REQUIRE_ALL = "GPUHOP_TESTS_REQUIRE_ALL"


def missing(what: str) -> NoReturn:
    """Skip the calling test (or, at module level, its module) because `what`, a real
    component it needs, is not installed; fail it instead where $GPUHOP_TESTS_REQUIRE_ALL=1.
    Skips for other reasons (not root, no GPU) stay skips."""
    if os.environ.get(REQUIRE_ALL) == "1":
        pytest.fail(f"{what}, and ${REQUIRE_ALL}=1 says it must be here", pytrace=False)
    pytest.skip(what, allow_module_level=True)


# JAX is installed beside the test venv, not in it (scripts/setup-venv says why: TensorFlow
# imports it wherever it can, at a cost in every TensorFlow process).
JAX_DIR = Path(sys.prefix) / "jax"


def jax_path() -> str:
    """The directory holding JAX, for the PYTHONPATH of a job or process that needs it (as a
    user's job brings its own: `-e PYTHONPATH=...`); `missing` where it is not there."""
    if not (JAX_DIR / "jax" / "__init__.py").is_file():
        missing(f"JAX is not installed in {JAX_DIR} (scripts/setup-venv puts it there)")
    return str(JAX_DIR)


def jax_env() -> tuple[str, str]:
    """`run`'s option that puts JAX on a job's PYTHONPATH."""
    return ("-e", f"PYTHONPATH={jax_path()}")


@functools.cache
def has_nvidia_gpu() -> bool:
    """Whether this machine has a real NVIDIA GPU that the driver answers for."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        listed = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the screenshots tests kept (`record_property("screenshot", path)`), so a CI log
    says where to look."""
    shots = [
        (report.nodeid, value)
        for reports in terminalreporter.stats.values()
        for report in reports
        for key, value in getattr(report, "user_properties", ())
        if key == "screenshot" and getattr(report, "when", "call") == "call"
    ]
    if _left_behind:
        terminalreporter.section("images the sessions left")
        for line in _left_behind:
            terminalreporter.write_line(line)
    if shots:
        terminalreporter.section("screenshots")
        for nodeid, path in shots:
            terminalreporter.write_line(f"{path}  ({nodeid})")


# pytest-xdist (`make test` runs `-n 4`) hands out whole modules, so a module's agents and
# servers start once, in one worker; and the tests that start one heavy thing run in one
# worker, one module after another: a real Ray cluster (the Ray backend's tests, and the
# backend contract suite's Ray part: two at once overload a 2-core machine, where Ray's raylet
# then misses its fixed 30 s to register), or a real Slurm cluster (the Slurm backend's tests
# and the contract suite's Slurm part). The contract suite's local part is a unit of its own:
# the Ray group is the longest of all, and nothing else should wait behind it. So is its
# local-image part (Podman, no cluster: it may run beside any other unit).
_SERIAL_GROUPS = {"ray_backend": "ray", "slurm_backend": "slurm"}
_CONTRACT = "tests/backends/"
_BACKEND_PARAM = re.compile(r"\[(local-image|local|ray|slurm)[\]-]")


def _work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or its suite's serial group."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if path.startswith(_CONTRACT) and (param := _BACKEND_PARAM.search(nodeid)):
        if param[1] == "local":
            return path
        return f"{path}[local-image]" if param[1] == "local-image" else param[1]
    if len(parts) > 2 and parts[0] == "tests":
        return _SERIAL_GROUPS.get(parts[1], path)
    return path


# How long each unit of work took in a whole run (`make test-durations` writes it): the
# scheduler hands out the longest first, so no worker is left with a long module at the end
# while the others stand idle. A unit it does not list counts its tests at the median pace.
DURATIONS = Path(__file__).with_name("durations.json")


def _expected_seconds(collection: list[str]) -> dict[str, float]:
    """Each work unit of `collection` and the seconds it is expected to take."""
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    counts: dict[str, int] = {}
    for nodeid in collection:
        unit = _work_unit(nodeid)
        counts[unit] = counts.get(unit, 0) + 1
    paces = sorted(known[u] / n for u, n in counts.items() if u in known)
    pace = paces[len(paces) // 2] if paces else 1.0
    return {unit: known.get(unit, n * pace) for unit, n in counts.items()}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's LoadScopeScheduling with `_work_unit` as the scope, its units handed out in
    the order of the collection, which `pytest_collection_modifyitems` sorted longest first
    (`DURATIONS`); each worker takes the next as it finishes. (xdist's own `--dist loadgroup`
    marks do nothing on pytest 9, which no longer reads an item's `_nodeid` that xdist
    rewrites; its own order is by number of tests, which put a module of three minute-long
    tests last.)

    The order is made where the tests are collected, in every worker alike, not here: xdist
    asks a worker for a test by its index in that worker's own collection, so a scheduler
    that reordered its copy of the collection would send indexes that name other tests, and
    each unit's tests would be strewn over all workers (as they were, for a while: a module's
    fixtures started in three workers, and the Ray group's clusters in two at once)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False  # the collection's order is the order
    return ByWorkUnit(config, log)


def _longest_first(items: list[pytest.Item]) -> None:
    """Sort `items` in place by their work unit's expected seconds, longest first; each
    unit's tests together and in the order pytest gave them (its parameters grouped so that
    module fixtures start once)."""
    seconds = _expected_seconds([item.nodeid for item in items])
    units = {id(item): _work_unit(item.nodeid) for item in items}
    items.sort(key=lambda item: (-seconds[units[id(item)]], units[id(item)]))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--write-durations",
        action="store_true",
        help=f"write each work unit's seconds in this run to {DURATIONS.name} (the scheduler's"
        " order; `make test-durations`)",
    )


_unit_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up each work unit's setup, call and teardown (in xdist's controller, every
    worker's reports)."""
    unit = _work_unit(report.nodeid)
    _unit_seconds[unit] = _unit_seconds.get(unit, 0.0) + report.duration


_left_behind: list[str] = []


@pytest.hookimpl(trylast=True)  # after the runner's, which tears down what an interrupted run left
def pytest_sessionfinish(session: pytest.Session) -> None:
    built = sys.modules.get("tests.images")
    if built is not None:  # this process's images, now that its agents have stopped
        built.remove_built()
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller sums up
    from tests import images

    _left_behind.extend(images.sweep_left_behind())
    if session.config.getoption("--write-durations"):
        ordered = dict(sorted((u, round(s, 1)) for u, s in _unit_seconds.items()))
        DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Once this process is done with the Ray tests (their module fixtures, agents included,
    torn down first), stop the Ray clusters its modules shared (tests/ray_backend/conftest.py).
    Not while the next test is in the same module: the contract suite's Ray agent, a module
    fixture of one parameter, is torn down only as its Slurm part sets up, and it waits for
    the cluster to be empty first."""
    try:
        return (yield)
    finally:
        ray_fixtures = sys.modules.get("tests.ray_backend.conftest")
        if ray_fixtures is not None and (
            nextitem is None
            or (_work_unit(nextitem.nodeid) != "ray" and nextitem.path != item.path)
        ):
            ray_fixtures.stop_kept_clusters()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest units of work first (`_longest_first`); tests marked `gpu` need a real
    NVIDIA GPU, and without one they are skipped, not failed."""
    _longest_first(items)
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_tests and not has_nvidia_gpu():
        skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (nvidia-smi lists none here)")
        for item in gpu_tests:
            item.add_marker(skip)


def wait_until(
    predicate: Callable[[], object], timeout: float = 30.0, interval: float | None = None
):
    """Poll `predicate` until it returns something truthy; fail the test after `timeout`.
    Every `interval` seconds where given; else 20 ms apart at first, then further apart, up
    to 0.1 s (a look may start a process or ask an agent: 50 a second for the length of a
    training cost the suite CPU it is short of, and most waits end within the first few)."""
    deadline = time.monotonic() + timeout
    pause = 0.02 if interval is None else interval
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s: {predicate}")
        time.sleep(pause)
        if interval is None:
            pause = min(pause * 1.25, 0.1)


@dataclass
class Agent:
    """A real agent process on a Unix socket in a temp state dir."""

    home: Path
    cache: Path
    fake_gpus: int | None
    pid: int = 0
    args: tuple[str, ...] = ()
    """More `python -m gpuhop.agent` arguments, e.g. ("--listen", "127.0.0.1:0")."""
    log_checked: int = 0
    """How far `check_log` has read `agent.log`."""

    @property
    def paths(self) -> AgentPaths:
        return AgentPaths(self.home)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHOP_")}
        # Hermetic: no remote the user configured (a default one) applies to the tests.
        env.update(
            GPUHOP_HOME=str(self.home),
            GPUHOP_CACHE_DIR=str(self.cache),
            GPUHOP_CONFIG_DIR=str(self.home.parent / "config"),
            **AGENT_FLAGS_ENV,
        )
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        return env

    def start(self) -> Agent:
        self.pid = start_background(
            self.paths,
            fake_gpus=self.fake_gpus,
            agent_args=self.args,
            python_flags=AGENT_PYTHON_FLAGS,
            # A user's 30 s, but a whole run beside other work once took longer to start one.
            timeout=120,
        )
        return self.watched()

    def watched(self) -> Agent:
        """This agent, its log read after every test from now on (`check_log`): for an
        agent a test started itself, its output going to `paths.logfile`."""
        if self not in _running:
            _running.append(self)
        return self

    def check_log(self) -> None:
        """Fail the test where this agent logged, since the last check, a traceback or a
        warning that the test did not declare (`@pytest.mark.agent_log(REGEX, ...)`)."""
        log = self.paths.logfile
        if not log.exists():
            return
        with log.open("rb") as f:
            if f.seek(0, os.SEEK_END) < self.log_checked:
                self.log_checked = 0  # rotated (`agent.log.1`) since the last check
            f.seek(self.log_checked)
            data = f.read()
        self.log_checked += len(data)
        if unexpected := unexpected_log_entries(data.decode(errors="replace"), _expected_in_log):
            pytest.fail(
                f"the agent in {self.home} logged what no test expected (a test that provokes"
                " it says so with @pytest.mark.agent_log(REGEX)):\n\n" + "\n\n".join(unexpected),
                pytrace=False,
            )

    @property
    def listener(self) -> ListenerInfo:
        """The agent's TCP listener as it reported it (started with --listen)."""
        return ListenerInfo.model_validate_json(self.paths.listen_file.read_bytes())

    def client(self) -> Client:
        return Client(self.home, autostart=False, cache_dir=self.cache)

    def cli(
        self,
        *args: str,
        cwd: Path | None = None,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        **kwargs,
    ) -> subprocess.CompletedProcess[str]:
        """Run `gpuhop ARGS...` as a user would, in `cwd`, against this agent (or with `env`);
        its output as text unless `text=False`."""
        kwargs.setdefault("text", True)
        return subprocess.run(
            [sys.executable, "-m", "gpuhop", *args],
            cwd=cwd,
            env=self.env if env is None else env,
            capture_output=True,
            timeout=timeout,
            **kwargs,
        )

    def kill_jobs(self) -> None:
        """Kill what is left of every job this agent started (by process group, and by
        its memory cgroup where it has one: that holds a job whose leader has not yet written
        its pid), and remove those cgroups."""

        jobs = self.paths.jobs
        if not jobs.is_dir():
            return
        for pidfile in jobs.glob("*/shim.pid"):
            with contextlib.suppress(OSError, ValueError, ProcessLookupError, PermissionError):
                os.killpg(int(json.loads(pidfile.read_text())["pid"]), signal.SIGKILL)
        for made in jobs.glob("*/cgroup.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                cgroup = Path(json.loads(made.read_text())["path"])
                deadline = time.monotonic() + 10
                while (procs := (cgroup / "cgroup.procs").read_text().split()) and (
                    time.monotonic() < deadline
                ):
                    for pid in procs:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(int(pid), signal.SIGKILL)
                    time.sleep(0.02)
                cgroup.rmdir()

    def shutdown(self) -> None:
        self.kill_jobs()
        stop(self.paths, timeout=10)
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ValueError):
            _running.remove(self)
        assert read_pid(self.paths) is None
        self.check_log()  # what it logged on its way out too


@pytest.fixture(autouse=True)
def _agent_logs_checked(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, read what every running agent logged during it (`Agent.check_log`);
    agents the test started are read once more as they stop. A test that provokes a
    traceback or a warning on purpose declares it: `@pytest.mark.agent_log(REGEX, ...)`."""
    global _expected_in_log
    _expected_in_log = tuple(
        pattern for marker in request.node.iter_markers("agent_log") for pattern in marker.args
    )
    try:
        yield
        for agent in list(_running):
            agent.check_log()
    finally:
        _expected_in_log = ()


@pytest.fixture(autouse=True, scope="session")
def _hermetic_config(tmp_path_factory: pytest.TempPathFactory) -> None:
    """No remote the user configured (a default one, $GPUHOP_REMOTE) leaks into the tests."""
    os.environ["GPUHOP_CONFIG_DIR"] = str(tmp_path_factory.mktemp("user-config"))
    os.environ.pop("GPUHOP_REMOTE", None)
    os.environ.pop("GPUHOP_TOKEN", None)
    os.environ.update(AGENT_FLAGS_ENV)


@pytest.fixture
def make_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Agent]]:
    """Start fresh agents for one test; all are stopped at its end."""
    started: list[Agent] = []

    def make(
        fake_gpus: int | None = None, args: tuple[str, ...] = (), config: str | None = None
    ) -> Agent:
        """`config`: its agent.toml."""
        root = Path(tmp_path_factory.mktemp("agent"))
        if config is not None:
            (root / "home").mkdir()
            (root / "home" / "agent.toml").write_text(config)
        agent = Agent(root / "home", root / "cache", fake_gpus, args=args)
        started.append(agent)
        return agent.start()

    yield make
    with contextlib.ExitStack() as stopping:  # every agent stops, whichever one's log fails
        for agent in started:
            stopping.callback(agent.shutdown)


@pytest.fixture(scope="session")
def shared_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """One agent (no GPUs) for the tests that need nothing special; stopped at the end."""
    root = Path(tmp_path_factory.mktemp("shared-agent"))
    agent = Agent(root / "home", root / "cache", None).start()
    yield agent
    agent.shutdown()


@pytest.fixture
def project(tmp_path: Path) -> Callable[..., Path]:
    """Write a small project: project({"train.py": "print(1)"}) -> its directory."""

    def make(files: dict[str, str]) -> Path:
        root = tmp_path / "project"
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        root.mkdir(exist_ok=True)
        return root

    return make
