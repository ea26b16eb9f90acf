"""Runs on the user's machine: the Python SDK. The CLI is a thin layer over it.

from gpuhop import Client
job = Client().submit(["train.py", "--epochs", "3"], gpus=1)
for chunk in job.logs(follow=True):
    print(chunk.decode(), end="")
job.pull("out/")
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from pydantic import ValidationError

from gpuhop.api import (
    AgentInfo,
    BlobCheckResult,
    DoctorCheck,
    GpuInfo,
    JobInfo,
    JobState,
    SubmitRequest,
    TokenCreated,
    TokenInfo,
    TokenRequest,
    UiLoginCode,
)
from gpuhop.api.upkeep import DiskUsage, GcReport
from gpuhop.client import endpoints
from gpuhop.client.data import Datasets, Envs, parse_mount
from gpuhop.client.errors import GpuhopError, invalid
from gpuhop.client.job import Job, _quote, check
from gpuhop.client.spec import (
    SyncStats,
    requirements_text,
    script_in_workdir,
    share_mb,
    tree_of,
)
from gpuhop.client.sync import FileEntry, ScanResult, SyncError, scan
from gpuhop.client.transport import Endpoint
from gpuhop.client.upload import UPLOAD_BATCH_BYTES, batches, frames
from gpuhop.home import AgentPaths, default_home

if TYPE_CHECKING:
    from gpuhop.client.dashboard import Dashboard
    from gpuhop.client.serving import Model

# `doctor` imports TensorFlow on the host, which can take a while on a cold GPU host.
DOCTOR_TIMEOUT = 240.0

Progress = Callable[[int], None]


def client_cache_dir() -> Path:
    env = os.environ.get("GPUHOP_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("gpuhop"))


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
        self.cache_dir = Path(cache_dir) if cache_dir else client_cache_dir()
        if transport is not None:
            self.endpoint = Endpoint(description="the gpuhop agent")
        else:
            self.endpoint = endpoints.choose(self.paths, remote, home is not None, autostart)
        self._http = httpx.Client(
            transport=transport or self.endpoint.transport(),
            base_url=self.endpoint.base_url,
            headers=self.endpoint.headers,
            timeout=httpx.Timeout(60.0, connect=5.0),
        )
        self.last_sync: SyncStats | None = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- plumbing -----------------------------------------------------------------------------

    def _request(self, method: str, url: str, **kwargs: object) -> httpx.Response:
        try:
            response = self._http.request(method, url, **kwargs)  # type: ignore[arg-type]
        except httpx.TransportError as e:
            raise self._unreachable(e) from None
        self._check(response)
        return response

    def _unreachable(self, e: httpx.TransportError) -> GpuhopError:
        """The error for a request that did not get through, as precise as can be found."""
        explained = self.endpoint.explain(e)
        return GpuhopError(
            explained or f"cannot reach {self.endpoint.description}: {e}", code="unreachable"
        )

    def _check(self, response: httpx.Response) -> None:
        """`check`, with a 401 (TCP listener: no valid token) said in words to act on."""
        try:
            check(response)
        except GpuhopError as e:
            if e.status != 401:
                raise
            raise GpuhopError(
                f"the agent refused the token for {self.endpoint.description} (missing,"
                f" wrong or revoked): {e.message}",
                code="unauthorized",
                status=401,
            ) from None

    # -- agent --------------------------------------------------------------------------------

    def info(self) -> AgentInfo:
        return AgentInfo.model_validate(self._request("GET", "/v1/agent").json())

    def gpus(self) -> list[GpuInfo]:
        """The host's GPUs: memory used and load now, and the jobs holding each."""
        return [GpuInfo.model_validate(g) for g in self._request("GET", "/v1/agent/gpus").json()]

    def doctor(self) -> list[DoctorCheck]:
        """Preflight checks of the GPU host (driver, CUDA, TensorFlow build, disk)."""
        response = self._request(
            "GET", "/v1/agent/doctor", timeout=httpx.Timeout(DOCTOR_TIMEOUT, connect=5.0)
        )
        return [DoctorCheck.model_validate(c) for c in response.json()]

    def usage(self) -> DiskUsage:
        """The agent's disk use (storage: blobs, trees, datasets; job dirs) and quotas."""
        return DiskUsage.model_validate(self._request("GET", "/v1/agent/usage").json())

    def gc(self, dry_run: bool = False) -> GcReport:
        """Garbage collection and retention on the agent now (admins only); with `dry_run`,
        only what it would remove. Anything a queued or running job needs stays."""
        response = self._request(
            "POST", "/v1/agent/gc", params={"dry_run": dry_run}, timeout=DOCTOR_TIMEOUT
        )
        return GcReport.model_validate(response.json())

    # -- the web dashboard (see gpuhop.client.dashboard) ---------------------------------------

    def ui_login_code(self) -> UiLoginCode:
        """A one-time code that logs a browser in to the agent's dashboard as this client's
        user: once, within a minute, and only through this client's credentials."""
        try:
            response = self._request("POST", "/v1/ui/login-codes")
        except GpuhopError as e:
            if e.status != 404:
                raise
            raise GpuhopError(
                f"{self.endpoint.description} is older than the dashboard; update gpuhop"
                " there (gpuhop remote bootstrap)",
                code="not_found",
                status=404,
            ) from None
        return UiLoginCode.model_validate(response.json())

    def dashboard(self, port: int = 0) -> Dashboard:
        """The agent's dashboard, forwarded to http://127.0.0.1:`port`/ui/ here (0: any free
        port) until closed; `login_url()` gives the link to open."""
        from gpuhop.client.dashboard import Dashboard

        return Dashboard(self, port)

    # -- tokens (admins; for the TCP listener) ------------------------------------------------

    def create_token(self, user: str, admin: bool = False) -> TokenCreated:
        """A new bearer token for `user`. The token is in the answer and nowhere else."""
        body = TokenRequest(user=user, admin=admin).model_dump(mode="json")
        return TokenCreated.model_validate(self._request("POST", "/v1/tokens", json=body).json())

    def tokens(self) -> list[TokenInfo]:
        return [TokenInfo.model_validate(t) for t in self._request("GET", "/v1/tokens").json()]

    def revoke_token(self, token_id: str) -> TokenInfo:
        """Revoke a token by id; requests carrying it are refused from now on."""
        response = self._request("DELETE", f"/v1/tokens/{_quote(token_id)}")
        return TokenInfo.model_validate(response.json())

    # -- jobs ---------------------------------------------------------------------------------

    def submit(
        self,
        command: str | Sequence[str],
        *,
        workdir: str | os.PathLike[str] = ".",
        gpus: int = 0,
        name: str | None = None,
        env: dict[str, str] | None = None,
        priority: int = 0,
        retries: int = 0,
        workers: int = 1,
        gpus_per_worker: int = 0,
        worker_timeout: int = 300,
        gpu_memory: str | int | None = None,
        on_hash: Progress | None = None,
        on_upload: Callable[[int, int], None] | None = None,
        data: Sequence[str] = (),
        requirements: str | os.PathLike[str] | bool | None = None,
        python: str | None = None,
        private_network: bool = False,
        pack: bool = False,
    ) -> Job:
        """Sync `workdir` and queue `command` there. Returns at once with a `Job` handle.

        `command` is a script (`train.py`, run with the host's Python) or a program on the
        host, with its arguments; a string is split like a shell would. With `retries`, a
        failed attempt is queued again with the same checkpoint dir. With `workers`, that
        many processes run it under MultiWorkerMirroredStrategy, each with
        `gpus_per_worker` GPUs and its own TF_CONFIG. `gpu_memory` ("6GiB", "6144M", or an
        int of MB) asks for a share of one GPU instead of whole GPUs; the job's TensorFlow
        is capped at it.

        `data` mounts datasets read-only in the work dir: "NAME[:VERSION]=MOUNT" each.
        `requirements` is a requirements file for the job's own venv (built once per set on
        the host, and seeing the host's packages); by default `requirements.txt` in
        `workdir` if there is one, and False for none. `python` runs the job with another
        interpreter on the host. `private_network` runs it in a network namespace of its
        own, whose ports only `forward` reaches (an older agent refuses it). `pack` puts the
        workers on as few nodes as possible on an agent with the Ray backend (default:
        spread across nodes; an older agent refuses it).
        """
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise GpuhopError("no command given", code="bad_request")
        gpu_memory_mb = share_mb(gpu_memory, gpus)
        root = Path(workdir).absolute()
        argv[0] = script_in_workdir(argv[0], root)
        result = self._scan(root, on_hash)
        if argv[0].endswith(".py") and argv[0] not in {f.path for f in result.files}:
            raise GpuhopError(
                f"{argv[0]} is excluded from the sync by .gitignore, .gpuhopignore or gpuhop's"
                " defaults; un-ignore it (a '!' line in .gpuhopignore) to run it",
                code="bad_request",
            )
        tree_bytes, tree = tree_of(result.files)
        # Fields left at None are not sent, so an older agent still takes a plain request.
        try:
            body = SubmitRequest(
                command=argv,
                tree=tree,
                name=name,
                gpus=gpus,
                env=dict(env or {}),
                priority=priority,
                retries=retries,
                workers=workers,
                gpus_per_worker=gpus_per_worker,
                worker_timeout=worker_timeout,
                gpu_memory_mb=gpu_memory_mb,
                data=[parse_mount(m) for m in data],
                requirements=requirements_text(requirements, root),
                python=python,
                private_network=private_network or None,
                pack=pack or None,
            ).model_dump(mode="json", exclude_none=True)
        except ValidationError as e:
            raise invalid("the job was not submitted", e) from None
        if not body["data"]:
            del body["data"]  # an older agent takes a request without it
        sent = (0, 0)
        try:
            response = self._request("POST", "/v1/jobs", json=body)
        except GpuhopError as e:
            if e.code != "missing_tree":
                raise
            # A new or changed tree: send the files the agent lacks, then the tree, then
            # ask again. An unchanged tree skips all of this.
            sent = self.upload(result.files, on_upload)
            self._send_tree(tree_bytes, result.files, on_upload)
            response = self._request("POST", "/v1/jobs", json=body)
        self.last_sync = SyncStats(result, *sent)
        return Job(self, JobInfo.model_validate(response.json()))

    def _send_tree(
        self,
        tree_bytes: bytes,
        files: list[FileEntry],
        on_upload: Callable[[int, int], None] | None,
    ) -> None:
        headers = {"content-type": "application/json"}
        try:
            self._request("POST", "/v1/trees", content=tree_bytes, headers=headers)
        except GpuhopError as e:
            if e.code != "missing_blobs":
                raise
            # Blobs vanished since they were checked (garbage collection): once more.
            self.upload(files, on_upload)
            self._request("POST", "/v1/trees", content=tree_bytes, headers=headers)

    def _scan(self, root: Path, on_hash: Progress | None) -> ScanResult:
        try:
            return scan(root, self.cache_dir, on_hash)
        except SyncError as e:
            raise GpuhopError(str(e), code="bad_request") from None

    def upload(
        self, files: list[FileEntry], on_upload: Callable[[int, int], None] | None = None
    ) -> tuple[int, int]:
        """Send the files the agent lacks. Returns (files sent, bytes sent)."""
        by_digest = {f.digest: f for f in files}
        check_body = {"digests": list(by_digest)}
        result = BlobCheckResult.model_validate(
            self._request("POST", "/v1/blobs/missing", json=check_body).json()
        )
        todo = [by_digest[d] for d in result.missing]
        total = sum(f.size for f in todo)
        sent = 0
        for batch in batches(todo, UPLOAD_BATCH_BYTES):

            def progress(n: int) -> None:
                nonlocal sent
                sent += n
                if on_upload is not None:
                    on_upload(sent, total)

            try:
                self._request(
                    "POST",
                    "/v1/blobs/upload",
                    content=frames(batch, progress),
                    timeout=httpx.Timeout(600.0, connect=5.0),
                )
            except GpuhopError as e:
                if e.code == "bad_blob":
                    raise GpuhopError(
                        f"{e.message} (a file changed while it was being sent? run again)",
                        code=e.code,
                        status=e.status,
                    ) from None
                raise
        return len(todo), total

    @property
    def data(self) -> Datasets:
        """Datasets on the agent: push, list, versions, files, remove."""
        return Datasets(self)

    @property
    def envs(self) -> Envs:
        """The Python environments the agent built for jobs: list, remove."""
        return Envs(self)

    # -- model servers (see gpuhop.client.serving) ----------------------------------------

    def serve(
        self,
        source: str | os.PathLike[str] | Job,
        *,
        name: str,
        gpus: int = 0,
        max_batch_size: int = 32,
        batch_timeout_ms: float = 2.0,
        wait: bool = True,
        timeout: float = 600.0,
    ) -> Model:
        """Serve a SavedModel on the GPU host under `name`, TF Serving's REST API style.

        `source` is a local SavedModel directory (uploaded like a work dir), or a job
        ("JOB" or "JOB:PATH", or a `Job`) whose artifacts hold it: without PATH, the only
        SavedModel there; its files stay on the host. Requests are batched up to
        `max_batch_size` rows (1: no batching), waiting at most `batch_timeout_ms`. With
        `wait`, returns once the server answers (GpuhopError if its job ends first).
        """
        from gpuhop.client.serving import serve

        return serve(
            self,
            source,
            name=name,
            gpus=gpus,
            max_batch_size=max_batch_size,
            batch_timeout_ms=batch_timeout_ms,
            wait=wait,
            timeout=timeout,
        )

    def model(self, ref: str) -> Model:
        """A handle on a model server job, by its name (as given to `serve`) or job id."""
        from gpuhop.client.serving import model

        return model(self, ref)

    def job(self, ref: str) -> Job:
        """A handle on an existing job, by id, unique id prefix, or name."""
        return Job(self, self._job_info(ref))

    def _job_info(self, ref: str) -> JobInfo:
        return JobInfo.model_validate(self._request("GET", f"/v1/jobs/{_quote(ref)}").json())

    def jobs(
        self, states: Sequence[JobState | str] | None = None, limit: int = 200
    ) -> list[JobInfo]:
        params: list[tuple[str, str | int]] = [("limit", limit)]
        params += [("state", JobState(s).value) for s in states or ()]
        return [
            JobInfo.model_validate(j)
            for j in self._request("GET", "/v1/jobs", params=params).json()
        ]
