"""Runs on the user's machine: the Python SDK's `Client`. The CLI is a thin layer over it.

from gpuhop import Client
with Client() as client:  # or client.close() when done: it holds a connection
    job = client.submit(["train.py", "--epochs", "3"], gpus=1)
    for chunk in job.logs(follow=True):
        print(chunk.decode(), end="")
    job.pull("out/")

`Client` is a facade: it builds a `Session` (the connection, see `session`) and hands it
to the module of each feature; none of them imports this one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Siblings by their full names, never through the package, whose __init__ imports this.
import gpuhop.client.host as host
import gpuhop.client.jobs as jobs
import gpuhop.client.notebook as notebooks
import gpuhop.client.transport.endpoints as endpoints
from gpuhop.client.job import Job, get
from gpuhop.client.session import Session
from gpuhop.client.transport.base import Endpoint
from gpuhop.home import AgentPaths, default_home, user_dir

# The job options a model server takes (`serve`): its GPUs, its place in the queue, its
# environment and the image it runs in (or none).
SERVER_OPTIONS = frozenset(
    {"gpus", "gpu_memory", "gpu_memory_mb", "priority", "env", "image", "no_image", "image_secret"}
)

if TYPE_CHECKING:
    import httpx

    # Loaded inside the calls that use them: `gpuhop ps` needs none of them.
    import gpuhop.client.serving as serving
    import gpuhop.client.sweeps as sweeps
    from gpuhop.api import (
        AgentInfo,
        DoctorCheck,
        GpuInfo,
        JobInfo,
        JobState,
        SecretInfo,
        TokenCreated,
        TokenInfo,
        UiLoginCode,
    )
    from gpuhop.api.agent import ClusterInfo
    from gpuhop.api.images import ImageInfo
    from gpuhop.api.spec import JobSpec
    from gpuhop.api.upkeep import DiskUsage, GcReport
    from gpuhop.client.dashboard import Dashboard
    from gpuhop.client.data import Datasets, Envs
    from gpuhop.client.submitted import SyncStats
    from gpuhop.client.sync.upload import Progress
    from gpuhop.client.sync.workdir import FileEntry


def client_cache_dir() -> Path:
    env = os.environ.get("GPUHOP_CACHE_DIR")
    if env:
        return Path(env)
    return user_dir("cache")


class Client:
    """A connection to one gpuhop agent.

    `remote` names a configured remote (`gpuhop remote add`); without it, $GPUHOP_REMOTE or
    the default remote is used, and with none of those the local agent of `home` (started
    on demand unless `autostart=False`). `transport` replaces the connection (tests).
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | None = None,
        *,
        remote: str | None = None,
        autostart: bool = True,
        transport: httpx.BaseTransport | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ):
        self.paths = AgentPaths(Path(home).absolute() if home else default_home())
        if transport is not None:
            endpoint = Endpoint(description="the gpuhop agent")
        else:
            endpoint = endpoints.choose(self.paths, remote, home is not None, autostart)
        self.session = Session(
            endpoint, Path(cache_dir) if cache_dir else client_cache_dir(), transport
        )
        """The connection every request of this client goes through."""

    @property
    def endpoint(self) -> Endpoint:
        return self.session.endpoint

    @property
    def cache_dir(self) -> Path:
        return self.session.cache_dir

    @property
    def last_sync(self) -> SyncStats | None:
        """What the last submit's sync did."""
        return self.session.last_sync

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    # -- agent --------------------------------------------------------------------------------

    def info(self) -> AgentInfo:
        return host.info(self.session)

    def gpus(self) -> list[GpuInfo]:
        """The host's GPUs: memory used and load now, and the jobs holding each."""
        return host.gpus(self.session)

    def gpus_json(self) -> list[dict[str, Any]]:
        """`gpus`, as the agent's JSON."""
        return host.gpus_json(self.session)

    def cluster(self) -> ClusterInfo:
        """On an agent with the Slurm backend: the partition's nodes (GRES, state) and the
        user's Slurm jobs, with the gpuhop job each runs. GpuhopError (unsupported) on an
        agent whose jobs run on its own host."""
        return host.cluster(self.session)

    def release_gpu(self, index: int) -> GpuInfo:
        """Put GPU `index`, quarantined for a hardware fault, back in service (admins only)."""
        return host.release_gpu(self.session, index)

    def doctor(self, fresh: bool = False, probe: bool = True) -> list[DoctorCheck]:
        """Preflight checks of the GPU host (driver, CUDA, TensorFlow build, disk), and the
        credentials a bucket's fetch would use for you. Its
        TensorFlow probe is reused for a minute; `fresh` (admins only) runs a new one.
        `probe=False`: at once, only the checks that need no TensorFlow probe."""
        return host.doctor(self.session, fresh, probe)

    def usage(self) -> DiskUsage:
        """The agent's disk use (storage: blobs, trees, datasets; job dirs) and quotas."""
        return host.usage(self.session)

    def gc(self, dry_run: bool = False) -> GcReport:
        """Garbage collection and retention on the agent now (admins only); with `dry_run`,
        only what it would remove. Anything a queued or running job needs stays."""
        return host.gc(self.session, dry_run)

    # -- container images (see gpuhop.client.images) -------------------------------------------

    def images(self) -> list[ImageInfo]:
        """The GPU host's container images you may see (an admin: every one; a user: those
        their own pulls and jobs used), with size and last use."""
        import gpuhop.client.images as images

        return images.list_images(self.session)

    def pull_image(self, reference: str, secret: str | None = None) -> ImageInfo:
        """Pull `reference` onto the GPU host; `secret` names your secret holding the
        registry's `user:password` where the image is private."""
        import gpuhop.client.images as images

        return images.pull(self.session, reference, secret)

    # -- the web dashboard (see gpuhop.client.dashboard) ---------------------------------------

    def ui_login_code(self) -> UiLoginCode:
        """A one-time code that logs a browser in to the agent's dashboard as this client's
        user: once, within a minute, and only through this client's credentials."""
        import gpuhop.client.tokens as tokens

        return tokens.login_code(self.session)

    def dashboard(self, port: int = 0) -> Dashboard:
        """The agent's dashboard, forwarded to http://127.0.0.1:`port`/ui/ here (0: any free
        port) until closed; `login_url()` gives the link to open."""
        from gpuhop.client.dashboard import Dashboard  # starlette and uvicorn: on demand

        return Dashboard(self.session, port)

    # -- tokens (admins; for the TCP listener) ------------------------------------------------

    def create_token(self, user: str, admin: bool = False) -> TokenCreated:
        """A new bearer token for `user`. The token is in the answer and nowhere else."""
        import gpuhop.client.tokens as tokens

        return tokens.create(self.session, user, admin)

    def tokens(self) -> list[TokenInfo]:
        import gpuhop.client.tokens as tokens

        return tokens.list_tokens(self.session)

    def revoke_token(self, token_id: str) -> TokenInfo:
        """Revoke a token by id; requests carrying it are refused from now on."""
        import gpuhop.client.tokens as tokens

        return tokens.revoke(self.session, token_id)

    # -- secrets ------------------------------------------------------------------------------

    def set_secret(self, name: str, value: str) -> SecretInfo:
        """Set (or replace) your secret `name` (an environment variable's name) to `value`.
        A job gets it only when it names it (`secrets=["NAME"]` or `["NAME=ENVVAR"]`), and
        gpuhop shows `***` wherever the value would appear in the job's text."""
        import gpuhop.client.secrets as secrets

        return secrets.set_secret(self.session, name, value)

    def secrets(self) -> list[SecretInfo]:
        """Your secrets: names and when each was set. No call returns a value."""
        import gpuhop.client.secrets as secrets

        return secrets.list_secrets(self.session)

    def remove_secret(self, name: str) -> None:
        """Remove your secret `name`."""
        import gpuhop.client.secrets as secrets

        secrets.remove(self.session, name)

    # -- jobs ---------------------------------------------------------------------------------

    def submit(
        self,
        command: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        spec: JobSpec | None = None,
        *,
        workdir: str | os.PathLike[str] = ".",
        on_hash: Progress | None = None,
        on_upload: Callable[[int, int], None] | None = None,
        **options: Any,
    ) -> Job:
        """Sync `workdir` and queue `command` there. Returns at once with a `Job` handle.

        `command` is a script (`train.py`, run with the host's Python) or a program on the
        host, with its arguments; a string is split like a shell would, and paths (a
        `Path`) may stand for strings. What the job asks
        for is `spec` (a `JobSpec`, taken as it is), with `options` set on it by keyword:
        JobSpec's fields, or these names for them (None leaves one at its default; an
        unknown keyword raises a TypeError, which is a GpuhopError too):

        `gpus`: whole GPUs. With `retries`, a failed attempt is queued again with the same
        checkpoint dir. With `workers`, that many processes run it under
        MultiWorkerMirroredStrategy, each with `gpus_per_worker` GPUs and its own TF_CONFIG
        (`worker_timeout`: seconds a worker waits for its peers). `gpu_memory` ("6GiB",
        "6144M", or an int of MB; the field `gpu_memory_mb`) asks for a share of one GPU
        instead of whole GPUs; the job's TensorFlow is capped at it. `name`: a name to find
        the job by; `env`: its environment variables (a dict).

        `data` mounts datasets read-only in the work dir: "NAME[:VERSION]=MOUNT" each.
        `data_sources` (or "s3://..." entries of `data`) are buckets' prefixes,
        "s3://BUCKET/PREFIX[:NAME]" each: the agent's host fetches them with your AWS_*
        secrets (`set_secret`) while the job waits, and the job reads each at
        `$GPUHOP_DATA/NAME` (read-only; NAME by default the prefix's last part).
        `secrets` gives the job your secrets (`set_secret`): "NAME" (as the variable NAME) or
        "NAME=ENVVAR" each; only their names travel, and their values are masked in its log.
        `requirements` is a requirements file for the job's own venv (built once per set on
        the host, and seeing the host's packages); by default `requirements.txt` in
        `workdir` if there is one (without a `spec`), and False for none. `python` runs the
        job with another interpreter on the host. `image` ("REGISTRY/NAME:TAG") runs it
        inside that container image on the agent's host instead, through Podman, with the
        image's own `python3` (pulled onto the host while the job waits where the host
        lacks it, with your secret `image_secret` holding the registry's user:password
        where given; the local backend only; the work dir's requirements.txt is then not
        sent; `requirements` given with it are installed on top of the image by its own
        pip, once per image and set). `no_image` runs it with the host's Python where the
        agent would run it in its default image (agent.toml `image`; an older agent refuses
        it). `private_network` runs it in a network namespace of
        its own, whose ports only `forward` reaches (an older agent refuses it). `pack`
        puts the workers on as few nodes as possible on an agent with the Ray backend
        (default: spread across nodes; an older agent refuses it).

        `priority` (-100..100, default 0): higher starts first, ties by age; above 0 is an
        admin's call on a team agent. `after` (jobs, or their ids or names): the job waits
        in the queue until they end, and is cancelled if one does not succeed, unless
        `after_any`. `timeout` ("6h", "90m", "30s" or seconds; the field `time_limit`):
        SIGTERM when it passes, SIGKILL 10 s later; the job ends with class `timeout`.
        `retry_on`: "infra" (the default) retries only attempts the machine ended (lost,
        oom-host, killed, gpu-fault), "any" also the job's own failures (app-error,
        oom-gpu). `notify`: webhook URLs the agent POSTs the job's start and end to (JSON;
        a Slack incoming webhook gets a `text`). `mixed_gpus`: several GPUs may be of
        different models (by default the job waits for GPUs of one model and topology
        group).
        """
        return jobs.submit(
            self.session,
            command,
            jobs.spec_of(workdir, spec, options),
            workdir=workdir,
            on_hash=on_hash,
            on_upload=on_upload,
        )

    def sweep(
        self,
        command: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        params: Mapping[str, sweeps.Values] | None = None,
        spec: JobSpec | None = None,
        *,
        array: int | None = None,
        workdir: str | os.PathLike[str] = ".",
        **options: Any,
    ) -> sweeps.Sweep:
        """Queue one job per combination of `params` (and per index of an `array` of N,
        with GPUHOP_ARRAY_INDEX set), `{key}` in `command` replaced by each run's value.
        A parameter's values are strings or numbers (`{"lr": [0.1, 0.01], "opt": "adam"}`:
        one value alone is a one-run list).

        All runs share one synced tree. The agent runs at most `max_parallel` of them at
        once. Each run is named `NAME[key=value,...]`. `spec` and `options` are `submit`'s
        (gpus, env, notify, max_parallel, name, ..., and on_hash and on_upload), for every
        run. Returns the `Sweep`; `Client.sweep_runs(sweep.id)` lists its runs.
        """
        import gpuhop.client.sweeps as sweeps

        on_hash, on_upload = options.pop("on_hash", None), options.pop("on_upload", None)
        return sweeps.submit(
            self.session,
            command,
            params or {},
            jobs.spec_of(workdir, spec, options),
            array=array,
            workdir=workdir,
            on_hash=on_hash,
            on_upload=on_upload,
        )

    def sweep_runs(self, sweep: str) -> list[JobInfo]:
        """The runs of a sweep, by its id (or name: the newest sweep of that name)."""
        return jobs.list_jobs(self.session, limit=10_000, sweep=sweep)

    def cancel_sweep(self, sweep: str, grace: float = 10.0) -> list[JobInfo]:
        """Cancel every run of a sweep that has not ended (SIGTERM, then SIGKILL after
        `grace` seconds); every run, as it is then."""
        return jobs.cancel_sweep(self.session, sweep, grace)

    def upload(
        self, files: list[FileEntry], on_upload: Callable[[int, int], None] | None = None
    ) -> tuple[int, int]:
        """Send the files the agent lacks. Returns (files sent, bytes sent)."""
        from gpuhop.client.sync.upload import send_files

        return send_files(self.session, files, on_upload)

    @property
    def data(self) -> Datasets:
        """Datasets on the agent: push, list, versions, files, remove."""
        from gpuhop.client.data import Datasets  # not on the paths of `ps`, `run`, `logs`

        return Datasets(self.session)

    @property
    def envs(self) -> Envs:
        """The Python environments the agent built for jobs: list, remove."""
        from gpuhop.client.data import Envs

        return Envs(self.session)

    # -- model servers (see gpuhop.client.serving) ----------------------------------------

    def serve(
        self,
        source: str | os.PathLike[str] | Job,
        *,
        name: str,
        max_batch_size: int = 32,
        batch_timeout_ms: float = 2.0,
        wait: bool = True,
        timeout: float = 600.0,
        replace: bool = False,
        **options: Any,
    ) -> serving.Model:
        """Serve a SavedModel on the GPU host under `name`, TF Serving's REST API style.

        `source` is a local SavedModel directory (uploaded like a work dir), or a job
        ("JOB" or "JOB:PATH", or a `Job`) whose artifacts hold it: without PATH, the only
        SavedModel there; its files stay on the host. Requests are batched up to
        `max_batch_size` rows (1: no batching), waiting at most `batch_timeout_ms`. With
        `wait`, returns once the server answers (GpuhopError if its job ends first). With
        `replace`, it then cancels your model servers of that name from before it (a new
        version served in their place: requests by the name went to them until it answered).
        `options`, as `submit` takes them: `gpus` (whole GPUs), or `gpu_memory` (a share
        of one GPU, "6GiB"), `priority`, `env` (the server's environment variables), and
        `image` (a container image to serve from, with its own python3, which must have
        TensorFlow, starlette and uvicorn) with `image_secret` (your secret to pull it with),
        or `no_image` (the agent's own Python, also where the agent's default is an image).
        """
        import gpuhop.client.serving as serving
        from gpuhop.api.spec import JobSpec
        from gpuhop.client.errors import GpuhopError, UnknownOption

        unknown = options.keys() - SERVER_OPTIONS
        if unknown:
            raise UnknownOption(sorted(unknown)[0])
        if replace and not wait:
            raise GpuhopError(
                "replace cancels the servers before this one once it answers, so it waits for"
                " that: leave wait on (or call Model.replace_namesakes() once it is ready)",
                code="bad_request",
            )
        served = serving.serve(
            self.session,
            source,
            name=name,
            spec=jobs.spec_of(".", JobSpec(), options),
            max_batch_size=max_batch_size,
            batch_timeout_ms=batch_timeout_ms,
            wait=wait,
            timeout=timeout,
        )
        if replace:
            served.replace_namesakes()
        return served

    def model(self, ref: str) -> serving.Model:
        """A handle on a model server job, by its name (as given to `serve`) or job id."""
        import gpuhop.client.serving as serving

        return serving.model(self.session, ref)

    # -- notebooks (see gpuhop.client.notebook) ------------------------------------------------

    def start_notebook(
        self,
        spec: JobSpec | None = None,
        *,
        workdir: str | os.PathLike[str] = ".",
        idle: int = notebooks.DEFAULT_IDLE,
        **options: Any,
    ) -> notebooks.Notebook:
        """JupyterLab on the GPU host as a job in `workdir` (synced), holding its GPUs.
        Kernels idle for `idle` seconds stop, and then the server (0: never). `spec` and
        `options` (gpus, gpu_memory, name, env, requirements, python, ...) are as for
        `submit`. Returns at once; `wait_ready()`, then `forward()`, and `url(fwd.url)` is
        the link with the token."""
        return notebooks.start(
            self.session, jobs.spec_of(workdir, spec, options), workdir=workdir, idle=idle
        )

    def notebook(self, ref: str | None = None) -> notebooks.Notebook | None:
        """The notebook job `ref` names, or your newest queued or running one (None: none)."""
        return notebooks.find(self.session, ref)

    def job(self, ref: str) -> Job:
        """A handle on an existing job, by id, unique id prefix, or name."""
        return get(self.session, ref)

    def jobs(
        self, states: Sequence[JobState | str] | JobState | str | None = None, limit: int = 200
    ) -> list[JobInfo]:
        """The newest jobs (at most `limit`) you may see; only those in `states` (one state,
        or several) where given."""
        return jobs.list_jobs(self.session, states, limit)

    def jobs_json(
        self,
        states: Sequence[JobState | str] | JobState | str | None = None,
        limit: int = 200,
        fields: Sequence[str] | str | None = None,
    ) -> list[dict[str, Any]]:
        """`jobs`, as the agent's JSON (no model built: what `gpuhop ps` reads); only
        those of `fields` (JobInfo's names) that are not null, where they are given."""
        return jobs.list_json(self.session, states, limit, fields=fields)
