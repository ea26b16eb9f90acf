"""Runs in the agent: the running agent's parts wired together (its stores, its backend,
its supervisor and scheduler), passed to every service as `rt`."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from gpuhop.agent.callers import owner_login
from gpuhop.agent.config import Policy
from gpuhop.agent.host import images
from gpuhop.agent.host.gpuhistory import GpuHistory, sample_every
from gpuhop.agent.host.identities import Identities, IdentityError
from gpuhop.agent.host.quarantine import QuarantineStore
from gpuhop.agent.jobs.fetches import Fetches, Room
from gpuhop.agent.jobs.imagepulls import ImagePulls
from gpuhop.agent.jobs.imagewaits import ImageWaits
from gpuhop.agent.jobs.masking import mask_json, mask_text, ordered
from gpuhop.agent.jobs.metricstail import latest_metrics
from gpuhop.agent.jobs.notifier import HostRule, Notifier, payload
from gpuhop.agent.jobs.placement import Limits
from gpuhop.agent.jobs.preparations import Unmet
from gpuhop.agent.jobs.scheduler import Scheduler
from gpuhop.agent.jobs.store import JobRecord, JobStore
from gpuhop.agent.jobs.supervisor import Supervisor
from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.buckets import CREDENTIAL_NAMES, Credentials
from gpuhop.agent.storage.checkouts import CheckoutStore
from gpuhop.agent.storage.claims import ClaimStore
from gpuhop.agent.storage.datasets import DatasetStore
from gpuhop.agent.storage.envs import EnvStore
from gpuhop.agent.storage.imageuses import ImageUses
from gpuhop.agent.storage.objectcache import ObjectCache
from gpuhop.agent.storage.references import blob_users
from gpuhop.agent.storage.secrets import SecretStore
from gpuhop.agent.storage.trees import TreeStore
from gpuhop.agent.storage.usage import DiskMeter
from gpuhop.agent.storage.uses import UseLock
from gpuhop.agent.tokens import TokenStore
from gpuhop.api import JobState, ListenerInfo
from gpuhop.backends.base import StartError
from gpuhop.backends.podman import PodmanSettings
from gpuhop.home import AgentPaths

if TYPE_CHECKING:
    from pathlib import Path

    from gpuhop.backends.base import Backend


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
        # GPUs out of service for a hardware fault (see duties/gpuhealth.py).
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
            backend,
            self.checkouts,
            agent=self,
            on_change=lambda: self.scheduler.wake(),
        )
        self.tokens = TokenStore(paths.tokens_db)
        self.secrets = SecretStore(paths.secrets_db)
        self.claims = ClaimStore(paths.claims_db)
        # The container images gpuhop pulled or ran jobs in (see gpuhop.agent.services.images).
        self.image_uses = ImageUses(paths.images_db)
        # The Podman agent.toml names: the run path's and the image store's.
        self.podman = PodmanSettings(self.policy.podman, self.policy.container_runtime)
        self.image_pulls = ImagePulls(self.image_uses, self.podman, self.team)
        self.meter = DiskMeter(paths, self.blobs, self.policy)
        # One garbage collection at a time (`gpuhop gc` and the timer).
        self.gc_lock = threading.Lock()
        # Submissions hold it shared while they resolve what their job will use, until its
        # row exists; what removes what no queued or running job uses holds it exclusive.
        self.uses = UseLock()
        # The TCP listener, when the daemon opened one.
        self.listener: ListenerInfo | None = None
        # The agent's own self-signed certificate's file, when the listener serves it (not
        # --tls-cert's): what renewing it means differs (see hostchecks.tls_certificate).
        self.own_certificate: Path | None = None
        # Queued jobs' buckets' data, fetched while they wait (see gpuhop.agent.jobs.fetches).
        self.objects = ObjectCache(paths.home / "objects", paths.home / "objects.db", self.blobs)
        self.fetches = Fetches(
            paths,
            self.store,
            self.objects,
            Room(
                limit=lambda: self.policy.object_cache_size,
                check_storage=self.meter.check_storage,
                blob_users=self.blob_users,
            ),
            credentials=lambda job: self.bucket_credentials(job.owner),
            masked=self.masked,
            on_done=self._prepared,
        )
        # Queued jobs' images, pulled while they wait (see gpuhop.agent.jobs.imagewaits).
        self.image_waits = ImageWaits(
            self.store,
            self.image_pulls,
            credentials=self.image_login,
            owner=lambda job: job.owner or owner_login(),
            tls_verify=lambda ref: images.tls_verify(self.policy.insecure_registries, ref),
            on_done=self._prepared,
        )
        # The loop that starts queued jobs (see gpuhop.agent.jobs.scheduler).
        self.scheduler = Scheduler(
            self.store,
            self.supervisor,
            self.gpus,
            where=backend.where,
            limits=self.limits,
            out_of_service=self.quarantine.all,
            notify=self.notify,
            held=self.held,
        )

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

    def secrets_of(self, job: JobRecord) -> dict[str, str]:
        """The secrets `job` names, as its environment takes them (ENVVAR: value), read
        from its user's own as it starts; StartError names one removed since it was queued."""
        if not job.spec.secrets:
            return {}
        owner = job.owner or owner_login()
        values = self.secrets.values(owner, [s.name for s in job.spec.secrets])
        gone = [s.name for s in job.spec.secrets if s.name not in values]
        if gone:
            raise StartError(
                f"the secret {gone[0]} was removed after the job was queued; set it again"
                f" (gpuhop secret set {gone[0]}) and run the job again"
            )
        return {s.env: values[s.name] for s in job.spec.secrets}

    def bucket_credentials(self, owner: str | None) -> Credentials:
        """What a fetch of `owner`'s buckets signs with: their AWS_* secrets; on a
        single-user agent, the user's usual AWS configuration for what they leave out."""
        owner = owner or owner_login()
        return Credentials(owner, self.secrets.values(owner, CREDENTIAL_NAMES), not self.team())

    def blob_users(self) -> set[str]:
        """The blobs that job trees and datasets name (the object cache's eviction leaves
        those on disk)."""
        return blob_users(self.paths.jobs, self.datasets)

    def secret_values(self, job: JobRecord) -> list[str]:
        """Every value of `job`'s user's secrets, longest first: what gpuhop shows of the
        job masks them (see gpuhop.agent.jobs.masking)."""
        return ordered(self.secrets.all_values(job.owner or owner_login()))

    def masked(self, job: JobRecord, text: str) -> str:
        """`text` with every value of `job`'s user's secrets shown as ***."""
        return mask_text(text, self.secret_values(job))

    def image_login(self, job: JobRecord) -> str | None:
        """The registry login (user:password) `job`'s image is pulled with: its user's
        secret `image_secret`, read as the pull starts; None where it names none. Unmet
        where the secret was removed since the job was queued."""
        if job.spec.image_secret is None:
            return None
        name = job.spec.image_secret
        values = self.secrets.values(job.owner or owner_login(), [name])
        if name not in values:
            raise Unmet(
                f"the secret {name} was removed after the job was queued; set it again"
                f" (gpuhop secret set {name}) and run the job again"
            )
        return values[name]

    def image_started(self, job: JobRecord) -> str | None:
        """The id of the image `job` starts in now, its use noted (see ImagePulls)."""
        assert job.spec.image is not None
        return self.image_pulls.job_started(job.owner or owner_login(), job.spec.image)

    def held(self, job: JobRecord) -> str | None:
        """Why a queued job may not start yet though GPUs were free: its data or its image
        is still on its way (each started here where it is not yet); None when neither."""
        notes = [n for n in (self.fetches.note(job), self.image_waits.note(job)) if n]
        return "; ".join(notes) or None

    def _prepared(self, job_id: str, state: JobState) -> None:
        if state is JobState.failed:
            self.notify(job_id, state.value)  # it never started: this is its end
            self.scheduler.wake()
        else:  # the job may start: the pass runs in this thread, as a submit's does
            self.scheduler.start_now()

    def team(self) -> bool:
        """Whether this agent serves more than its owner now: a TCP listener is open, or
        tokens belong to more than one user."""
        return self.listener is not None or len({t.user for t in self.tokens.list()}) > 1

    def notify(self, job_id: str, event: str) -> None:
        """Queue the notifications of a job's start or end (its own webhooks, the agent's)."""
        job = self.store.get(job_id)
        urls = dict.fromkeys([*job.spec.notify, *self.policy.notify])
        if not urls:
            return
        metrics = latest_metrics(self.supervisor.job_paths(job_id).metrics)
        values = self.secret_values(job)
        for url in urls:
            body = mask_json(payload(job, event, url, metrics), values)
            self.notifier.send(url, body, key=job.id, owner=job.owner or "")  # type: ignore[arg-type]

    def limits(self) -> Limits:
        admins = frozenset({owner_login(), *(t.user for t in self.tokens.list() if t.admin)})
        return Limits(user_gpus=self.policy.user_max_gpus, exempt=admins)

    def close(self) -> None:
        self.fetches.close()
        self.image_waits.close()
        self.scheduler.close()
        self.supervisor.close()
        self.backend.close()
        self.notifier.close()
        self.store.close()
        self.tokens.close()
        self.secrets.close()
        self.claims.close()
        self.image_uses.close()
        self.objects.close()
        self.gpu_host.close()
