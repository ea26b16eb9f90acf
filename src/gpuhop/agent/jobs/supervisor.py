"""Runs in the agent: each job's attempts through the agent's backend, recorded in the store.

The agent never runs user code itself. For each job it readies the work dir's files (the
tree's shared checkout, or a copy out of the blob store) and asks the backend
(gpuhop.backends) to start the attempt's process group. A thread waits for the backend to
say the attempt ended; the supervisor then records the outcome in
words a user can act on, and queues the next attempt of a job that asked for retries. The
backend starts, watches and stops processes; the states, retries and GPUs are the agent's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from gpuhop.agent.jobs import provenance
from gpuhop.agent.jobs.endings import classify, hint_note
from gpuhop.agent.jobs.energy import EnergyMeter
from gpuhop.agent.jobs.masking import mask_file
from gpuhop.agent.jobs.metricstail import latest_metrics
from gpuhop.agent.jobs.records import as_text
from gpuhop.agent.jobs.store import JobRecord, JobStore
from gpuhop.agent.jobs.workdirs import materialise
from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.checkouts import CheckoutStore
from gpuhop.agent.storage.usage import disk_note
from gpuhop.api import EndClass, JobState, RetryOn
from gpuhop.backends import jobdeps
from gpuhop.backends.base import Attempt, Backend, Ending, Started, StartError
from gpuhop.backends.leader import read_json as _read_json
from gpuhop.backends.ownlines import append_line
from gpuhop.backends.procs import describe_duration, describe_signal
from gpuhop.home import AgentPaths, JobPaths

log = logging.getLogger("gpuhop.agent")

# In a job's dir: why the agent stopped it (see `Supervisor.stop`).
STOPPED = "stopped.json"
# A write to the store that failed (a full disk) is tried again after these many seconds,
# doubling up to the second figure.
RETRY_FIRST = 0.5
RETRY_MAX = 10.0


# In a job's dir: when a job being stopped gets its SIGKILL, so that an agent restarted
# within the grace period still sends it.
KILL_AT = "kill_at.json"
# The grace of a cancel that reached a starting job, where this agent did not see it (it
# came before a restart).
DEFAULT_GRACE = 10.0


class Agent(Protocol):
    """What a supervisor asks of the agent it works for (the AgentContext)."""

    def team(self) -> bool:
        """Whether the agent serves more than its owner now (a TLS listener, or tokens of
        more than one user); such an agent starts no job without a sandbox."""
        ...

    def notify(self, job_id: str, event: str) -> None:
        """A job "started", or ended for good (the event is its final state): for its
        notifications; must not block."""
        ...

    def identity_of(self, job: JobRecord) -> dict[str, Any] | None:
        """The unprivileged identity the job runs as (a team agent's), or None (it runs as
        the agent's user); raises StartError where it must have one and cannot."""
        ...

    def secrets_of(self, job: JobRecord) -> dict[str, str]:
        """The secrets the job names, by the variable each is given as, with their values;
        raises StartError where one is gone."""
        ...

    def secret_values(self, job: JobRecord) -> list[str]:
        """Every value of the job's user's secrets: masked in what the agent keeps of it."""
        ...

    def image_started(self, job: JobRecord) -> str | None:
        """A job in a container image starts: the id of the image it runs in (its use
        noted), or None where the host lacks it (the run path says so)."""
        ...


class Supervisor:
    def __init__(
        self,
        paths: AgentPaths,
        store: JobStore,
        blobs: BlobStore,
        backend: Backend,
        checkouts: CheckoutStore | None,
        agent: Agent,
        on_change: Callable[[], None],
    ):
        """`on_change`: the queue may have room for another job now (one ended or freed
        its GPUs)."""
        self.agent = agent
        self.paths = paths
        # Where the jobs' processes run (gpuhop.backends): this host, or a cluster.
        self.backend = backend
        self.store = store
        self.blobs = blobs
        # Each tree materialised once, for backends that show it to jobs through an overlay.
        self.checkouts = checkouts
        self.on_change = on_change
        self.python = backend.python
        # Each running attempt's GPU energy and time, read by the GPU sampling duty too.
        self.energy = EnergyMeter(
            backend.gpu_host, self.job_paths, elsewhere=backend.where if backend.remote else None
        )
        self._killed_after_grace: set[str] = set()
        # The SIGKILLs promised to stopping jobs, each due after its grace (`_kill_at`).
        self._grace_timers: set[threading.Timer] = set()
        self._grace_lock = threading.Lock()
        # The grace of a cancel that came while its job was starting, by job id.
        self._start_cancels: dict[str, float] = {}

    def job_paths(self, job_id: str) -> JobPaths:
        return JobPaths(self.paths.job_dir(job_id))

    # -- starting -------------------------------------------------------------------------

    def launch(self, job_id: str) -> None:
        """Start a job that the scheduler moved to `starting`. Runs in a worker thread.

        Whatever goes wrong before its process exists (a bad file name, a path too deep, an
        argument no OS takes, a bug) fails the job with the reason and frees its GPUs: a job
        never stays in `starting`, holding them, because its start raised.
        """
        jp = self.job_paths(job_id)
        try:
            job = self.store.get(job_id)
            self._check_isolation()
            deps = jobdeps.read(jp)
            identity = self.agent.identity_of(job)
            if identity is not None:
                deps["identity"] = identity
            # Read as it starts, never written with its deps: a value is on no disk of the job.
            secrets = self.agent.secrets_of(job)
            if secrets:
                deps["secrets"] = secrets
            if job.spec.image is not None:
                # The image it runs is the one its use is noted for, whatever its tag names
                # by the time Podman starts it.
                image_id = self.agent.image_started(job)
                if image_id is not None:
                    deps["image_id"] = image_id
            # A container job's work dir is a copy: Podman binds it, and has no overlay.
            no_view = (
                "a container job's work dir is a copy"
                if job.spec.image
                else self.backend.work_view(owned=identity is not None)
            )
            checkout = materialise(jp, self.blobs, self.checkouts, no_view, job.tree)
            if checkout is not None:
                deps["checkout"] = str(checkout)
            attempt = Attempt(job.id, job.attempt, job.command, job.gpu_ids, job.spec)
            started = self.backend.start(attempt, jp, deps)
        except Exception as e:
            self._fail_start(job_id, jp, e)
            return
        # Its GPUs' first readings, before anyone sees it run.
        self._metered(job_id, lambda: self.energy.start(job.id, job.attempt, job.gpu_ids))
        # A cluster may hold the attempt (Slurm's queue, Ray's placement): it stays
        # `starting`, its process known, until the cluster runs it (`promote`), and its time
        # counts from then.
        since = self.backend.running_since(jp, time.time())
        self._until_recorded(
            f"job {job_id} started",
            lambda: self.store.transition(
                job_id,
                [JobState.starting],
                JobState.starting if since is None else JobState.running,
                pid=started.pid,
                pid_start=started.pid_start,
                started_at=since,
            ),
        )
        job = self.store.get(job_id)
        self._record_host(job, jp)
        if job.cancel_requested:
            # SIGTERM may come before the job's process exists (the leader still sets up its
            # sandbox) and be lost: the SIGKILL after the cancel's grace ends it all the same.
            self._terminate(job, self._start_cancels.pop(job_id, DEFAULT_GRACE))
        # Before the watch: a job that ends at once must not tell of its end first.
        self._event(job_id, "started")
        self._watch(job_id, jp, started)
        self.on_change()

    def _record_host(self, job: JobRecord, jp: JobPaths) -> None:
        """The agent's half of what the job ran on (once per job), after its start: it
        costs the start nothing."""
        try:
            provenance.write_host(
                jp, job.tree, job.gpu_ids, self.backend.gpu_host, self.backend.name
            )
        except OSError as e:
            log.warning("job %s: could not record what it runs on: %s", job.id, e)

    def _metered(self, job_id: str, read: Callable[[], None]) -> None:
        """A reading of a job's GPU energy: its trouble never touches the job."""
        try:
            read()
        except Exception:
            log.exception("reading job %s's GPU energy failed", job_id)

    def promote(self, job: JobRecord) -> None:
        """A started attempt the cluster kept pending: `running` once the cluster runs it,
        from the time it began there."""
        if job.state != JobState.starting or job.pid is None:
            return
        since = self.backend.running_since(self.job_paths(job.id), time.time())
        if since is not None:
            self.store.transition(job.id, [JobState.starting], JobState.running, started_at=since)
            self.on_change()

    def _event(self, job_id: str, event: str) -> None:
        try:
            self.agent.notify(job_id, event)
        except Exception:  # a notification's trouble never touches the job
            log.exception("notifying about job %s failed", job_id)

    def _fail_start(self, job_id: str, jp: JobPaths, e: Exception) -> None:
        self._start_cancels.pop(job_id, None)
        if isinstance(e, StartError | OSError):
            why = str(e)
        else:
            log.error("starting job %s raised", job_id, exc_info=e)
            why = f"{type(e).__name__}: {e}"
        reason = as_text(f"could not start: {why}{disk_note(jp.root, jp.log)}")
        log.warning("job %s %s", job_id, reason)
        self._until_recorded(
            f"job {job_id} failed to start",
            lambda: self.store.transition(
                job_id,
                [JobState.starting],
                JobState.failed,
                reason=reason,
                ended_at=time.time(),
                end_class=EndClass.app_error.value,
            ),
        )
        self._event(job_id, JobState.failed.value)
        self.on_change()

    def _until_recorded(self, what: str, record: Callable[[], object]) -> None:
        """Run `record` (a write to the store) until it succeeds: on a full disk, SQLite
        refuses writes until space returns, and a job's end must not be forgotten."""
        delay = RETRY_FIRST
        failures = 0
        while True:
            try:
                record()
                if failures:
                    log.warning("recorded %s after %d failed tries", what, failures)
                return
            except Exception as e:
                failures += 1
                if failures == 1:
                    log.warning("could not record %s (%s); retrying until it can be", what, e)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)

    def _check_isolation(self) -> None:
        problem = self.backend.isolation()
        if problem is not None and self.agent.team():
            raise StartError(
                "this agent serves a team (a TLS listener, or tokens of more than one user),"
                " and this host cannot give a job its own view of it, so no job starts:"
                f" {problem}"
            )

    # -- watching -------------------------------------------------------------------------

    def _watch(self, job_id: str, jp: JobPaths, started: Started) -> None:
        def wait() -> None:
            try:
                end = self.backend.wait(jp, started)
            except Exception:
                log.exception("waiting for job %s failed", job_id)
                end = Ending(recorded=False)
            self._until_recorded(f"the end of job {job_id}", lambda: self._finish(job_id, end))

        threading.Thread(target=wait, name=f"job-{job_id}", daemon=True).start()

    def _finish(self, job_id: str, end: Ending) -> None:
        """Record how an attempt ended, as the backend reported it."""
        job = self.store.get(job_id)
        jp = self.job_paths(job_id)
        now = end.ended_at if end.ended_at else time.time()
        self._metered(job_id, lambda: self.energy.end(job_id, now))
        if job.started_at is None and job.pid is not None:
            # Ended before promote() saw the cluster run it (or never ran: then no time).
            job = dataclasses.replace(job, started_at=self.backend.running_since(jp, now))
        # How long it ran, " after 2.5s"; none for an attempt the cluster never ran (Slurm's
        # pending job, Ray's unplaced one, one its leader could not submit), not "after 0.0s".
        after = (
            "" if job.started_at is None else f" after {describe_duration(now - job.started_at)}"
        )
        ran = after or " before it started"  # where the words alone do not say it never ran
        exit_code, sig = end.exit_code, end.signal
        stopped = _read_json(jp.root / STOPPED)
        hint = ""  # what a failed job's log says to do (endings.hint_note)
        if job.cancel_requested:
            state = JobState.cancelled
            how = " (killed after the grace period)" if job_id in self._killed_after_grace else ""
            reason = f"cancelled{ran}{how}"
        elif stopped is not None:
            state = JobState(stopped.get("state", JobState.failed.value))
            reason = f"{stopped.get('reason', 'stopped by the agent')}{ran}"
        elif not end.recorded and end.leader_returncode is not None and disk_note(jp.root, jp.log):
            # The leader ended (it is our child) but could not write the status on a full disk.
            state = JobState.failed
            reason = f"ended{after}; its exit status could not be written"
        elif not end.recorded:
            state = JobState.lost
            code = end.leader_returncode
            leader = f" (its leader ended with {code})" if code else ""
            reason = f"the job's process vanished with no exit status{leader}"
        elif sig is not None:
            state = JobState.failed
            how = describe_signal(sig)
            if end.oom_killed:
                how = f"killed by the kernel's OOM killer (out of host memory, signal {sig})"
            reason = f"{how}{after}"
        elif exit_code == 0:
            state = JobState.succeeded
            reason = f"exited with code 0{after}"
        else:
            state = JobState.failed
            hint = hint_note(jp.log)
            reason = f"exited with code {exit_code}{after}{hint}"
        if end.detail:  # a gang's first failed worker, say: its hint as a single job's
            # A leader's words for an attempt that never ran say so ("could not start: ...").
            reason = f"{end.detail}{after}{hint}"
        if state in (JobState.failed, JobState.lost) and stopped is None:
            reason += disk_note(jp.root, jp.log)
        self._killed_after_grace.discard(job_id)
        # The metrics file is the job's own to write (its log is masked as it is written):
        # kept masked from now on, and so is the attempt's last record kept for `show`.
        try:
            mask_file(jp.metrics, self.agent.secret_values(job))
        except OSError as e:
            log.warning("job %s: could not mask its metrics file: %s", job_id, e)
        # Why the agent stopped it (a time limit, a GPU fault), else the backend's own word
        # (a cluster's time limit); a user's cancel is just that.
        why_stopped = stopped.get("class") if stopped is not None else end.end_class
        end_class = classify(
            state,
            exit_code=exit_code,
            sig=sig,
            log=jp.log,
            stopped_class=None if job.cancel_requested else why_stopped,
            oom_killed=end.oom_killed,
        )
        outcome = {
            "exit_code": exit_code,
            "signal": sig,
            "reason": reason,
            "ended_at": now,
            "end_class": end_class.value,
        }
        if job.started_at is not None:
            outcome["started_at"] = job.started_at
        if (
            state in (JobState.failed, JobState.lost)
            and job.attempt <= job.spec.retries
            and RetryOn(job.spec.retry_on).retries(end_class)
            and (stopped is None or stopped.get("retry", False))
        ):
            self._retry(job, jp, state, outcome)
        elif self.store.transition(job_id, [JobState.starting, JobState.running], state, **outcome):
            self._event(job_id, state.value)
        self.on_change()

    def _retry(
        self, job: JobRecord, jp: JobPaths, state: JobState, outcome: dict[str, Any]
    ) -> None:
        """Queue the job's next attempt, which continues where this one left off: in the
        same work dir, /tmp and checkpoint dir (see `materialise`). This attempt's last
        metrics are kept with its record, for `show`."""
        self.tell(
            job.id,
            f"attempt {job.attempt} {state.value}: {outcome['reason']}"
            f" [{outcome['end_class']}]; retrying (attempt {job.attempt + 1} of"
            f" {job.spec.retries + 1})",
        )
        for leftover in (jp.status, jp.leader_pid, jp.root / KILL_AT, jp.root / STOPPED):
            leftover.unlink(missing_ok=True)
        # The files are ready before the job is queued: the scheduler may start it at once.
        self.store.retry(job, state, metrics=self._attempt_metrics(job, jp), **outcome)

    def _attempt_metrics(self, job: JobRecord, jp: JobPaths) -> dict[str, Any] | None:
        """The last metrics record of the attempt that ended: the metrics file's last, unless
        that is the earlier attempt's (this one recorded none)."""
        latest = latest_metrics(jp.metrics)
        earlier = self.store.attempts(job.id)[-1:]
        if latest is not None and earlier and earlier[0]["metrics"] == json.dumps(latest):
            return None
        return latest

    def tell(self, job_id: str, text: str) -> None:
        """Append `gpuhop: TEXT` to the job's log, on a line of its own (the job's output
        may have stopped mid-line). Raises OSError."""
        with open(self.job_paths(job_id).log, "ab") as f:
            append_line(f.fileno(), f"gpuhop: {text}")

    def reattach(self) -> None:
        """After an agent (re)start: adopt jobs whose leaders still run, settle the rest."""
        for job in self.store.list([JobState.starting, JobState.running]):
            try:
                self._reattach(job)
            except Exception:
                # One job's trouble (a full disk, a bad record) must not stop the others.
                log.exception("re-attaching to job %s failed", job.id)

    def _reattach(self, job: JobRecord) -> None:
        jp = self.job_paths(job.id)
        if job.pid is not None:
            started = Started(job.pid, job.pid_start)
        else:
            adopted = self.backend.adopt(jp)
            if adopted is None:
                # The leader never ran: the job never started, so it may start now.
                self.store.transition(job.id, [JobState.starting], JobState.queued, gpu_ids=[])
                return
            started = adopted
            # It began when its leader did (the leader writes its pid file first), not now:
            # its duration and its --timeout count from then, as launch() would have had it.
            try:
                began = jp.leader_pid.stat().st_mtime
            except OSError:
                began = time.time()
            since = self.backend.running_since(jp, began)
            self.store.transition(
                job.id,
                [JobState.starting],
                JobState.starting if since is None else JobState.running,
                pid=started.pid,
                pid_start=started.pid_start,
                started_at=since,
            )
        if self.backend.alive(started):
            log.info("re-attached to job %s (pid %d)", job.id, started.pid)
            self._metered(job.id, lambda: self.energy.resume(job.id, job.attempt, job.gpu_ids))
            self._watch(job.id, jp, started)
            self._rearm(job, jp, started)
            return
        try:
            self._finish(job.id, self.backend.ending(jp, started))
        except Exception:
            log.exception("recording the end of job %s failed; retrying", job.id)
            self._watch(job.id, jp, started)  # its watcher retries until it is recorded

    # -- cancelling -----------------------------------------------------------------------

    def cancel(self, job: JobRecord, grace: float) -> None:
        """Ask a started job to stop: SIGTERM to its group, SIGKILL after `grace` seconds."""
        self._start_cancels[job.id] = grace
        self.store.update(job.id, cancel_requested=1)
        # Read again after the flag: a start recorded since is then seen here, or else
        # launch() sees the flag after recording it (one of the two stops the job).
        job = self.store.get(job.id)
        if job.pid is None:
            return  # still starting: launch() sees the flag once the process exists
        self._start_cancels.pop(job.id, None)
        self._terminate(job, grace)

    def stop(
        self,
        job: JobRecord,
        reason: str,
        grace: float = 5.0,
        end_class: EndClass = EndClass.app_error,
        state: JobState = JobState.failed,
        retry: bool = False,
    ) -> None:
        """Stop a running job for a reason of the agent's own (a cap or a time limit it
        passed): the job ends in `state` (failed, or cancelled) with `reason` and
        `end_class`, and is retried only if `retry` (a GPU's fault: not the job's) and its
        retry rule agrees. The reason is a file in the job's dir, so an agent restarted
        meanwhile still records it. Idempotent."""
        jp = self.job_paths(job.id)
        if job.pid is None or (jp.root / STOPPED).exists():
            return
        why = {"reason": reason, "class": end_class.value, "state": state.value, "retry": retry}
        (jp.root / STOPPED).write_text(json.dumps(why))
        log.warning("job %s %s", job.id, reason)
        self._terminate(job, grace)

    def _terminate(self, job: JobRecord, grace: float) -> None:
        """SIGTERM to the job's group, SIGKILL after `grace` (plus the time a cluster
        backend's leader needs to clean up after its own grace)."""
        assert job.pid is not None
        started = Started(job.pid, job.pid_start)
        jp = self.job_paths(job.id)
        delay = self.backend.stop(jp, started, grace)
        at = time.time() + delay
        earlier = _read_json(jp.root / KILL_AT)
        if earlier is not None:
            at = min(at, float(earlier.get("at", at)))  # a second cancel never delays it
        with contextlib.suppress(OSError):  # a full disk: this agent's timer still runs
            (jp.root / KILL_AT).write_text(json.dumps({"at": at}))
        self._kill_at(job.id, started, max(0.0, at - time.time()))

    def _rearm(self, job: JobRecord, jp: JobPaths, started: Started) -> None:
        """After a restart: the SIGKILL that a previous agent promised a stopping job."""
        kill_at = _read_json(jp.root / KILL_AT)
        if kill_at is None or not (job.cancel_requested or (jp.root / STOPPED).exists()):
            return
        self._kill_at(job.id, started, max(0.0, float(kill_at.get("at", 0)) - time.time()))

    def _kill_at(self, job_id: str, started: Started, delay: float) -> None:
        def due() -> None:
            with self._grace_lock:  # `close` waits for a kill under way
                if timer not in self._grace_timers:
                    return  # the agent is stopping
                self._grace_timers.discard(timer)
                self._kill_after_grace(job_id, started)

        timer = threading.Timer(delay, due)
        timer.daemon = True
        with self._grace_lock:
            self._grace_timers.add(timer)
        timer.start()

    def close(self) -> None:
        """Drop the SIGKILLs still due: the agent is stopping, and the job store with it.
        Each is kept on disk (KILL_AT), and the next agent arms it again (`_rearm`)."""
        with self._grace_lock:
            timers, self._grace_timers = self._grace_timers, set()
        for timer in timers:
            timer.cancel()

    def _kill_after_grace(self, job_id: str, started: Started) -> None:
        job = self.store.get(job_id)
        if job.state.finished or job.pid not in (None, started.pid):
            return  # ended, or a retry (after a GPU fault) runs now: not the one to kill
        self._killed_after_grace.add(job_id)
        self.backend.kill(started)
