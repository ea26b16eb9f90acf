"""Runs in the agent: the agent's parts wired together, and the loop that starts queued jobs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gpuhop.agent.callers import owner_login
from gpuhop.agent.host.gpuhistory import GpuHistory, sample_every
from gpuhop.agent.host.identities import Identities, IdentityError
from gpuhop.agent.jobs.after import judge
from gpuhop.agent.jobs.metricstail import latest_metrics
from gpuhop.agent.jobs.notifier import HostRule, Notifier, payload
from gpuhop.agent.jobs.placement import Limits, Pending, could_ever_fit, plan
from gpuhop.agent.jobs.store import JobRecord, JobStore
from gpuhop.agent.jobs.supervisor import Supervisor
from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.checkouts import CheckoutStore
from gpuhop.agent.storage.claims import ClaimStore
from gpuhop.agent.storage.datasets import DatasetStore
from gpuhop.agent.storage.envs import EnvStore
from gpuhop.agent.storage.policy import Policy
from gpuhop.agent.storage.quarantine import QuarantineStore
from gpuhop.agent.storage.tokens import TokenStore
from gpuhop.agent.storage.trees import TreeStore
from gpuhop.agent.storage.usage import DiskMeter
from gpuhop.api import EndClass, JobState, ListenerInfo, format_mb
from gpuhop.backends.base import StartError
from gpuhop.home import AgentPaths

if TYPE_CHECKING:
    from gpuhop.backends.base import Backend

log = logging.getLogger("gpuhop.agent")

# The scheduler also runs on this interval when nothing wakes it, as a safety net.
SCHEDULE_INTERVAL = 1.0


class AgentContext:
    def __init__(
        self,
        paths: AgentPaths,
        backend: Backend,
        policy: Policy | None = None,
    ):
        """`backend` runs the jobs (here, or on a Ray cluster) and offers its GPUs."""
        paths.ensure()
        self.paths = paths
        self.policy = policy or Policy()
        self.backend = backend
        gpu_host = backend.gpu_host
        self.gpu_host = gpu_host
        # The GPUs as found at start; their live readings come from gpu_host.usage().
        self.gpus = gpu_host.gpus
        self.fake_gpus = gpu_host.fake
        # The last hour of their readings, sampled by a duty (the dashboard's GPU page, the
        # idle guard: which samples often enough to see a few readings in its window).
        self.gpu_history = GpuHistory(sample_every(self.policy.idle_gpu_minutes))
        # GPUs out of service for a hardware fault (see services/gpuhealth.py).
        self.quarantine = QuarantineStore(paths.quarantine)
        self.pid = os.getpid()
        self.store = JobStore(paths.db)
        self.blobs = BlobStore(paths.blobs, paths.tmp)
        self.trees = TreeStore(paths.trees, paths.tmp, self.blobs)
        self.datasets = DatasetStore(paths.home / "datasets", self.blobs)
        self.envs = EnvStore(paths.home / "envs")
        self.identities = Identities(
            paths.home, self.policy.job_uid_base, dict(self.policy.job_accounts)
        )
        self.notify_rule = HostRule(self.policy.notify_allowed_hosts)
        self.notifier = Notifier(self.notify_rule, timeout=self.policy.notify_timeout_seconds)
        self.checkouts = CheckoutStore(paths.home / "checkouts", paths.tmp, self.blobs)
        self.supervisor = Supervisor(
            paths,
            self.store,
            self.blobs,
            on_change=self.wake,
            backend=backend,
            team=self.team,
            on_event=self.notify,
            checkouts=self.checkouts,
            identity=self.identity_of,
        )
        # Why each queued job that waits on a limit (not on busy GPUs) waits; see `plan`.
        self.waiting: dict[str, str] = {}
        self.tokens = TokenStore(paths.tokens_db)
        self.claims = ClaimStore(paths.claims_db)
        self.meter = DiskMeter(paths, self.blobs, self.policy)
        # One garbage collection at a time (`gpuhop gc` and the timer).
        self.gc_lock = threading.Lock()
        # Set once the scheduler has re-attached to the jobs of a previous agent.
        self.reattached = asyncio.Event()
        # The TCP listener, when the daemon opened one.
        self.listener: ListenerInfo | None = None
        self._launcher = ThreadPoolExecutor(max_workers=4, thread_name_prefix="launch")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        # One scheduler pass at a time, from whichever thread asks (see `_passes`); set
        # once the previous agent's jobs are re-attached, before any pass may run.
        self._pass_lock = threading.Lock()
        self._pass_due = False
        self._passes_open = False

    def identity_of(self, job: JobRecord) -> dict[str, Any] | None:
        """The identity `job` runs as: on a team agent whose backend gives jobs identities
        of their own (this host's), one per user (gpuhop.agent.host.identities); else None,
        and the job runs as the agent's user. Raises StartError where a team agent cannot
        give one (it does not run as root)."""
        if not self.team():
            return None
        if not self.supervisor.backend.identities:
            if os.geteuid() == 0:
                raise StartError(
                    "this agent serves a team and runs as root, and its jobs run on the"
                    " cluster as its user, so every user's job would run as root there: no"
                    " job starts. Run a cluster agent as an unprivileged account of its own"
                )
            return None
        if os.geteuid() != 0:
            raise StartError(
                "this agent serves a team but does not run as root, so it cannot run each"
                " user's jobs as an unprivileged identity of their own, and starts no job:"
                " run the team agent as root (gpuhop agent start --listen ... as root; jobs"
                " then never run as root nor as the agent's user), or serve one user only"
            )
        try:
            identity = self.identities.of(job.owner or owner_login())
        except IdentityError as e:
            raise StartError(str(e)) from None
        return {**identity.as_spec(), "pass": list(self.policy.job_env_pass)}

    def team(self) -> bool:
        """Whether this agent serves more than its owner now: a TCP listener is open, or
        tokens belong to more than one user."""
        return self.listener is not None or len({t.user for t in self.tokens.list()}) > 1

    def wake(self) -> None:
        """Ask the scheduler to look at the queue now. Safe from any thread."""
        loop, event = self._loop, self._event
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def start_now(self) -> None:
        """Start the queued jobs that fit, in the calling thread (a submit's route): the
        job's start waits for no turn of the event loop. Passes never overlap (two at once
        could give one GPU to two jobs): one asked for while another runs is run by that
        one, after it. A pass that raises leaves the job to the scheduler's loop."""
        if not self._passes_open:
            self.wake()
            return
        try:
            self._passes()
        except Exception:
            log.exception("scheduling from a request failed; the scheduler's loop retries")
            self.wake()

    def _passes(self) -> None:
        """Run `schedule_once` until no pass is due, unless another thread is in one: that
        thread then runs the pass due. Never waits for the lock (the event loop calls it)."""
        self._pass_due = True
        # Checked again after the release: a pass asked for between the holder's last
        # check and its release is run here, not lost.
        while self._pass_due:
            if not self._pass_lock.acquire(blocking=False):
                return
            try:
                while self._pass_due:
                    self._pass_due = False
                    self.schedule_once()
            finally:
                self._pass_lock.release()

    def notify(self, job_id: str, event: str) -> None:
        """Queue the notifications of a job's start or end (its own webhooks, the agent's)."""
        job = self.store.get(job_id)
        urls = dict.fromkeys([*job.spec.notify, *self.policy.notify])
        if not urls:
            return
        metrics = latest_metrics(self.supervisor.job_paths(job_id).metrics)
        for url in urls:
            self.notifier.send(url, payload(job, event, url, metrics), key=job.id)

    def limits(self) -> Limits:
        admins = frozenset({owner_login(), *(t.user for t in self.tokens.list() if t.admin)})
        return Limits(user_gpus=self.policy.user_max_gpus, exempt=admins)

    def schedule_once(self) -> int:
        """Start every queued job that fits now. Returns how many were started."""
        queued = [j for j in self.store.queued() if self._dependencies_allow(j)]
        if not queued:
            self.waiting = {}
            return 0
        memory = {g.index: g.memory_mb for g in self.gpus}
        # On a cluster (GPUs with a node) the cluster places jobs: every GPU counts as alike.
        kinds = {g.index: g.kind for g in self.gpus if g.node is None}
        pending = [
            Pending(
                j.id,
                j.spec.gpus,
                j.spec.priority,
                j.created_at,
                j.spec.gpu_memory_mb,
                owner=j.owner,
                sweep=j.spec.sweep,
                max_parallel=j.spec.max_parallel,
                mixed_gpus=j.spec.mixed_gpus,
            )
            for j in queued
        ]
        self._fail_misfits(pending, memory, kinds)
        started = 0
        waiting: dict[str, str] = {}
        placements = plan(
            pending,
            memory,
            self.store.holdings(),
            kinds=kinds,
            limits=self.limits(),
            waiting=waiting,
            out_of_service=self.quarantine.all(),
        )
        self.waiting = waiting
        for placement in placements:
            # Allocation and the move to `starting` are one guarded UPDATE.
            if self.store.transition(
                placement.job_id,
                [JobState.queued],
                JobState.starting,
                gpu_ids=list(placement.gpu_ids),
            ):
                self._launcher.submit(self._launch, placement.job_id)
                started += 1
        return started

    def _dependencies_allow(self, job: JobRecord) -> bool:
        """Whether the jobs it runs after let it start now; an after-ok job whose dependency
        did not succeed is cancelled here, saying which. A job that waits is not pending, so
        it holds up no GPU job behind it."""
        if not job.spec.after:
            return True
        verdict = judge(job.spec.after, job.spec.after_any, self.store.states(job.spec.after))
        if verdict.cancel_reason is not None and self.store.transition(
            job.id,
            [JobState.queued],
            JobState.cancelled,
            reason=verdict.cancel_reason,
            ended_at=time.time(),
            end_class=EndClass.cancelled.value,
        ):
            log.info("job %s %s", job.id, verdict.cancel_reason)
            self.notify(job.id, JobState.cancelled.value)
            self.wake()  # the jobs that run after this one learn it now
        return verdict.ready

    def _fail_misfits(
        self, pending: list[Pending], memory: dict[int, int], kinds: dict[int, str]
    ) -> None:
        """Fail the queued jobs that this host can never run (it restarted with fewer GPUs)."""
        for job in pending:
            if could_ever_fit(job, memory, kinds):
                continue
            asks = (
                f"{format_mb(job.gpu_memory_mb)} of one GPU's memory"
                if job.gpu_memory_mb is not None
                else f"{job.gpus} GPU(s)"
            )
            where = self.backend.where
            reason = (
                f"could not start: it asks for {asks}; {where} now has {len(memory)} GPU(s)"
                f" with up to {format_mb(max(memory.values(), default=0))} each"
            )
            if self.store.transition(
                job.job_id,
                [JobState.queued],
                JobState.failed,
                reason=reason,
                ended_at=time.time(),
                end_class=EndClass.app_error.value,
            ):
                log.warning("job %s %s", job.job_id, reason)

    def _launch(self, job_id: str) -> None:
        try:
            self.supervisor.launch(job_id)
        except Exception:  # a bug here must not take the agent down
            log.exception("launching job %s failed", job_id)

    async def run_scheduler(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        await asyncio.to_thread(self.supervisor.reattach)
        self.reattached.set()
        self._passes_open = True
        while True:
            try:
                self._passes()
            except Exception:
                log.exception("scheduling failed; trying again in %.0fs", SCHEDULE_INTERVAL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=SCHEDULE_INTERVAL)
            self._event.clear()

    def close(self) -> None:
        self._launcher.shutdown(wait=True)
        self.backend.close()
        self.notifier.close()
        self.store.close()
        self.tokens.close()
        self.claims.close()
        self.gpu_host.close()
