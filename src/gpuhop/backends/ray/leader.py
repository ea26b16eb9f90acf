"""Runs on the agent's host as the leader of a Ray job's process group: places the job's
workers on the Ray cluster, streams their output back, and records how the job ended.

The Ray backend starts it as the local backend starts its own leader, with the same contract
(gpuhop.backends.leader): `python -m gpuhop.backends.ray.leader STATUS_FILE PID_FILE SPEC`
in a new session, with stdout and stderr going to the job's log. It writes its pid to
PID_FILE first and the job's exit status (exit_code, signal, detail, ended_at) to
STATUS_FILE last, so an agent that restarts meanwhile re-attaches to it as to a leader.

In order: it checks that the cluster answers (a dead address would make `ray.init` hang),
connects as a Ray driver, makes a placement group with one bundle per worker (SPREAD
across nodes, or PACK onto few) and waits for Ray to place it (meanwhile the job is
`starting`, and says why: gpuhop.backends.clusterjob; it runs, and its time counts, from
placement on), makes one actor per bundle
(gpuhop.backends.ray.worker), sends the work dir and the checkpoints through the object
store, gives each worker its TF_CONFIG built from the actors' node addresses and ports, and
starts them. Then it polls them: worker output goes into the job's log (with `[worker I]`
prefixes, and into per-worker logs, for multi-worker jobs) and worker 0's metrics into the
job's metrics file. When a worker fails, the others are stopped (gang failure). SIGTERM
(cancel) stops them all: SIGTERM, then SIGKILL after the grace the agent wrote beside the
spec. At the end worker 0's artifacts and checkpoints come back into the job's dirs, and
the actors and the placement group are removed whatever happened. If the leader itself
is killed, Ray removes them (both die with the driver that made them), and each job
process dies with its actor.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from gpuhop.backends import clusterjob
from gpuhop.backends.local import leader as local_leader
from gpuhop.backends.ownlines import append_line
from gpuhop.backends.ray import transfer
from gpuhop.backends.ray.probe import ProbeError, probe
from gpuhop.runtime.iri import skip_iri_grammar
from gpuhop.version import __version__

POLL_SECONDS = 0.1
# Per poll and worker; a chatty job is read in several polls without sleeping between.
POLL_BYTES = 4 << 20
CALL_TIMEOUT = 120.0
PLACEMENT_NOTE_AFTER = 2.0
PLACEMENT_NOTE_EVERY = 60.0

_stop = threading.Event()


def say(text: str) -> None:
    append_line(1, f"gpuhop: {text}")


def _write(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


class Prefixer:
    """Turns a worker's output into whole lines, each with the worker's prefix."""

    def __init__(self, prefix: str):
        self.prefix = prefix.encode()
        self.partial = b""

    def feed(self, data: bytes, final: bool = False) -> bytes:
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        return b"".join(self.prefix + line + b"\n" for line in lines)


def how(end: dict[str, Any]) -> str:
    """How a worker ended, in the local leader's words; or why its actor was lost."""
    return str(end["lost"]) if end.get("lost") else local_leader.how(end)


class Launch:
    """One attempt of one job on the cluster."""

    def __init__(self, spec: dict[str, Any], root: Path):
        self.spec = spec
        self.root = root  # the job's dir on the agent's host
        self.grace_file = root / "grace"
        self.workers: int = spec["workers"]
        self.actors: list[Any] = []
        self.pg: Any = None

    def run(self) -> dict[str, Any]:
        import ray

        probe(self.spec["address"])  # raises ProbeError, with what to do, if it cannot
        ray.init(
            address=self.spec["address"],
            namespace="gpuhop",
            logging_level=logging.ERROR,
            log_to_driver=False,
            configure_logging=True,
        )
        # ray.init installs handlers of its own that end the process on SIGTERM.
        _handle_signals()
        # This driver is the attempt's Ray job (`ray list jobs`), its workers in the
        # placement group named here: `show` names both from now on.
        ray_job = ray.get_runtime_context().get_job_id()
        clusterjob.write(
            self.root, ray_job, f"Ray job {ray_job}, placement group {self._group_name()}"
        )
        try:
            return self._run()
        finally:
            clusterjob.released(self.root)
            self._clean_up()
            ray.shutdown()

    def _run(self) -> dict[str, Any]:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from gpuhop.backends.ray.worker import JobWorker

        spec = self.spec
        gpus, cpus = spec["gpus_per_worker"], spec["cpus_per_worker"]
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        self.pg = placement_group(
            [bundle] * self.workers,
            strategy=spec["strategy"],
            name=self._group_name(),
        )
        if not self._wait_for_placement(bundle):
            return {"exit_code": None, "signal": signal.SIGTERM}
        # From now on the job runs: its duration and --timeout count (Backend.running_since).
        clusterjob.runs(self.root)
        remote = ray.remote(JobWorker)
        self.actors = [
            remote.options(
                num_cpus=cpus,
                num_gpus=gpus,
                max_restarts=0,
                name=f"gpuhop-{spec['job_id']}-{spec['attempt']}-w{i}",
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=i
                ),
            ).remote(spec["job_id"], spec["attempt"], i)
            for i in range(self.workers)
        ]
        hellos = []
        for i, actor in enumerate(self.actors):
            try:
                hellos.append(ray.get(actor.hello.remote(), timeout=CALL_TIMEOUT))
            except ray.exceptions.RayError as e:
                return _start_failure(
                    f"worker {i} could not start on the Ray cluster ({_first_line(e)}); is"
                    f" gpuhop {__version__} installed in the Python of Ray's workers on every"
                    " node?"
                )
        if _stop.is_set():
            return {"exit_code": None, "signal": signal.SIGTERM}
        for i, h in enumerate(hellos):
            if h["version"] != __version__:
                return _start_failure(
                    f"node {h['host']} has gpuhop {h['version']} and the agent {__version__};"
                    " install the same version on every node"
                )
            where = "running" if self.workers == 1 else f"worker {i}"
            gpu_text = f"GPU {','.join(h['gpus'])}" if h["gpus"] else "no GPU"
            say(f"{where} on {h['host']} ({h['ip']}, Ray node {h['node_id'][:8]}), {gpu_text}")
        if self.workers > 1:
            say(
                "TensorFlow's gRPC ports (no authentication, every interface) are open on these"
                " nodes while the job runs; the Ray cluster must be on a private network"
            )
        files = ray.put(transfer.pack(Path(spec["work"])))
        checkpoints = ray.put(transfer.pack(Path(spec["checkpoints"])))
        cluster = {"worker": [f"{h['ip']}:{h['port']}" for h in hellos]}
        starts = []
        for i, (actor, h) in enumerate(zip(self.actors, hellos, strict=True)):
            task = {"type": "worker", "index": i}
            worker_spec = {
                **spec,
                "gpus": h["gpus"],
                "tf_config": json.dumps({"cluster": cluster, "task": task}),
            }
            starts.append(actor.start.remote(files, checkpoints, worker_spec))
        for i, ref in enumerate(starts):
            try:
                error = ray.get(ref, timeout=CALL_TIMEOUT)
            except ray.exceptions.RayError as e:
                error = _first_line(e)
            if error:
                return _start_failure(f"worker {i}: {error}" if self.workers > 1 else error)
        result = self._supervise()
        self._bring_back()
        return result

    def _group_name(self) -> str:
        return f"gpuhop-{self.spec['job_id']}-{self.spec['attempt']}"

    def _wait_for_placement(self, bundle: dict[str, float]) -> bool:
        """Wait until Ray has placed every worker; False if cancelled meanwhile."""
        import ray

        began = time.monotonic()
        next_note = began + PLACEMENT_NOTE_AFTER
        ready = self.pg.ready()
        workers = f"{self.workers} worker(s) of {_bundle_text(bundle)}"
        workers += f" ({self.spec['strategy'].lower()})"
        busy = "its nodes are busy or too small"
        while not _stop.is_set():
            done, _ = ray.wait([ready], timeout=0.5)
            if done:
                return True
            clusterjob.hold(self.root, f"the Ray cluster has not placed its {workers}: {busy}")
            if time.monotonic() > next_note:
                next_note += PLACEMENT_NOTE_EVERY
                waited = time.monotonic() - began
                say(f"waiting {waited:.0f}s so far for the Ray cluster to place {workers}; {busy}")
        return False

    def _supervise(self) -> dict[str, Any]:
        import ray

        logs = [open(p, "ab") for p in self.spec["worker_logs"]]  # noqa: SIM115
        prefixes = [Prefixer(f"[worker {i}] ") for i in range(self.workers)]
        running = dict(enumerate(self.actors))
        first: tuple[int, dict[str, Any], int] | None = None
        kill_at: float | None = None
        stopping = False
        try:
            while running:
                if _stop.is_set() and not stopping:
                    stopping = True
                    kill_at = time.monotonic() + self._grace()
                    self._signal(running, signal.SIGTERM)
                if kill_at is not None and time.monotonic() > kill_at:
                    self._signal(running, signal.SIGKILL)
                    kill_at = None
                refs = {i: a.poll.remote(POLL_BYTES) for i, a in running.items()}
                busy = False
                for i, ref in refs.items():
                    try:
                        got = ray.get(ref, timeout=CALL_TIMEOUT)
                    except ray.exceptions.RayError as e:
                        lost = f"was lost: its Ray actor died ({_first_line(e)})"
                        got = {"log": b"", "metrics": b"", "end": {"lost": lost, "signal": None}}
                    busy = busy or len(got["log"]) == POLL_BYTES
                    self._output(i, got, logs, prefixes)
                    end = got["end"]
                    if end is None:
                        continue
                    del running[i]
                    failed = end.get("lost") or end["signal"] is not None or end["exit_code"]
                    if failed and first is None and not stopping:
                        first = (i, end, len(running))
                        self._signal(running, signal.SIGTERM)
                        kill_at = time.monotonic() + self.spec["grace"]
                    if self.workers == 1:
                        first = (i, end, 0)
                if not busy:
                    time.sleep(POLL_SECONDS)
        finally:
            for i in range(self.workers if logs else 0):
                _write(prefixes[i].feed(b"", final=True))
            for f in logs:
                f.close()
        if first is None:
            return {"exit_code": None, "signal": signal.SIGTERM} if stopping else {"exit_code": 0}
        index, end, stopped = first
        result = {"exit_code": end.get("exit_code"), "signal": end["signal"]}
        if self.workers > 1:
            detail = f"worker {index} {how(end)} first"
            if stopped:
                detail += f"; {stopped} other worker{'s were' if stopped > 1 else ' was'} stopped"
            result["detail"] = detail
        elif end.get("lost"):
            result["detail"] = f"the job {end['lost']}"
        return result

    def _output(
        self, i: int, got: dict[str, Any], logs: list[Any], prefixes: list[Prefixer]
    ) -> None:
        if got["log"]:
            if logs:
                logs[i].write(got["log"])
                logs[i].flush()
                _write(prefixes[i].feed(got["log"]))
            else:
                _write(got["log"])
        if got["metrics"] and i == 0:
            with open(self.spec["metrics"], "ab") as f:
                f.write(got["metrics"])

    def _signal(self, running: dict[int, Any], sig: int) -> None:
        for actor in running.values():
            actor.signal.remote(sig)

    def _grace(self) -> float:
        """The grace the agent gave this cancel or stop (it writes it before SIGTERM)."""
        try:
            return float(self.grace_file.read_text())
        except (OSError, ValueError):
            return float(self.spec["grace"])

    def _bring_back(self) -> None:
        """Worker 0's artifacts and checkpoints, into the job's dirs on the agent's host."""
        import ray

        try:
            got = ray.get(self.actors[0].collect.remote(), timeout=CALL_TIMEOUT * 5)
            transfer.unpack(got["artifacts"], Path(self.spec["artifacts"]))
            # Worker 0 started from a copy of the checkpoints: its dir is now the truth.
            transfer.unpack(got["checkpoints"], Path(self.spec["checkpoints"]), replace=True)
        except (ray.exceptions.RayError, OSError, ValueError) as e:
            say(f"could not bring back worker 0's artifacts and checkpoints: {_first_line(e)}")

    def _clean_up(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        closing = [a.close.remote() for a in self.actors]
        for ref in closing:
            with contextlib.suppress(ray.exceptions.RayError):  # a dead actor has none
                ray.get(ref, timeout=30)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.pg is not None:
            remove_placement_group(self.pg)


def _handle_signals() -> None:
    """SIGTERM, SIGINT and SIGHUP (a cancel) stop the job; the leader cleans up."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: _stop.set())


def _start_failure(why: str) -> dict[str, Any]:
    say(f"could not start: {why}")
    return {"exit_code": 1, "signal": None, "detail": f"could not start: {why}"}


def _bundle_text(bundle: dict[str, float]) -> str:
    gpus = bundle.get("GPU", 0)
    return f"{bundle['CPU']:g} CPU" + (f" and {gpus:g} GPU(s)" if gpus else "") + " each"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[-1] if text else error.__class__.__name__


def _write_atomic(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m gpuhop.backends.ray.leader STATUS PID_FILE SPEC", file=sys.stderr)
        return 2
    skip_iri_grammar()
    status_path, pid_path, spec_path = argv
    _write_atomic(pid_path, {"pid": os.getpid()})
    _handle_signals()
    spec = json.loads(Path(spec_path).read_text())
    try:
        result = Launch(spec, Path(spec_path).parent).run()
    except ProbeError as e:
        result = _start_failure(str(e))
    except Exception as e:
        traceback.print_exc()
        result = {"exit_code": 1, "signal": None, "detail": f"the Ray backend failed: {e}"}
    result["ended_at"] = time.time()
    _write_atomic(status_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
