"""Runs on the user's machine: model servers on the GPU host, through the agent.

    model = client.serve("3fa9c1d2", name="digits")       # the SavedModel in a job's artifacts
    model = client.serve("out/digits_savedmodel", name="digits")   # or a local one, uploaded
    model.predict(instances=[[0.0] * 64])                 # {"predictions": [[...]]}
    client.model("digits").metadata()

Every request goes through the agent's `/v1/serve/JOB/...` proxy with this client's
connection and credentials (Unix socket, SSH tunnel, or TLS and token); `Model.forward()`
makes the server's port reachable here instead, for tools that speak TF Serving's REST API.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gpuhop.api.states import JobState
from gpuhop.client.errors import GpuhopError, invalid
from gpuhop.client.job import Job, get
from gpuhop.client.session import Connected, Session, session_of
from gpuhop.client.submitted import tree_of
from gpuhop.client.sync.upload import scan, send_files, send_tree
from gpuhop.client.transport.unixhttp import Timeout

if TYPE_CHECKING:
    from gpuhop.api import ServingInfo
    from gpuhop.api.spec import JobSpec
    from gpuhop.client.forward import Forward
    from gpuhop.client.session import Response

SAVED_MODEL_PB = "saved_model.pb"
# A predict may wait on a busy GPU; the agent gives up on a silent server after 300 s.
PREDICT_TIMEOUT = Timeout(330.0, connect=5.0)


class Model:
    """A model server job on the agent, found by its job ref (its name, as given to
    `serve`, or its id). `info` is as last fetched."""

    def __init__(self, client: Session | Connected, info: ServingInfo):
        self.session = session_of(client)  # a Client, or the session it talks through
        self.info = info

    def __repr__(self) -> str:
        return f"Model({self.name!r}, job={self.info.job!r}, ready={self.info.ready})"

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def job(self) -> Job:
        return get(self.session, self.info.job)

    def refresh(self) -> ServingInfo:
        self.info = _info(self.session, self.info.job)
        return self.info

    def wait_ready(self, timeout: float = 600.0) -> ServingInfo:
        """Block until the server answers; raise GpuhopError (with the end of its log) if
        its job ends first, TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while not self.refresh().ready:
            if self.info.state.finished:
                tail = b"".join(self.job.logs()).decode(errors="replace").splitlines()[-15:]
                raise GpuhopError(
                    f"the model server (job {self.info.job}) {self.info.state.value}"
                    f" before it was ready: {self.info.reason}\n" + "\n".join(tail),
                    code="conflict",
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"model {self.name} not ready after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        return self.info

    def replace_namesakes(self, grace: float = 10.0) -> list[str]:
        """Once this server answers (`wait_ready`), cancel the model servers of its name
        and owner queued or running since before it (the versions it replaces: requests by
        the name went to the newest of them that answered until now), each with `grace`
        seconds to finish what it is answering; their job ids. Jobs of that name that are
        no model servers, and those started after this one, are left alone."""
        from datetime import datetime

        from gpuhop.client.jobs import list_json

        self.wait_ready()
        mine = self.job.info
        alive = [JobState.queued, JobState.starting, JobState.running]
        fields = ["id", "name", "owner", "created_at"]
        cancelled = []
        for row in list_json(self.session, alive, 10_000, fields=fields):
            if (
                row["id"] == mine.id
                or row.get("name") != mine.name
                or row.get("owner") != mine.owner
                or datetime.fromisoformat(row["created_at"]) > mine.created_at
            ):
                continue
            try:
                _info(self.session, row["id"])  # a model server: else "not a model server"
            except GpuhopError:
                continue
            get(self.session, row["id"]).cancel_json(grace)
            cancelled.append(row["id"])
        return cancelled

    def request(self, method: str, path: str, **kwargs: Any) -> Response:
        """Any request to the server, e.g. ("GET", "/v1/models/digits"): the raw answer,
        whatever its status. Raises GpuhopError only when the agent cannot be reached."""
        url = f"/v1/serve/{quote(self.info.job, safe='')}/{path.lstrip('/')}"
        kwargs.setdefault("timeout", PREDICT_TIMEOUT)
        return self.session.send(method, url, **kwargs)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        check(response)
        return response.json()

    def status(self) -> dict[str, Any]:
        """TF Serving's model status: {"model_version_status": [...]}."""
        return dict(self._call("GET", f"/v1/models/{quote(self.name)}"))

    def metadata(self) -> dict[str, Any]:
        """TF Serving's metadata: every signature's inputs and outputs, dtypes and shapes."""
        return dict(self._call("GET", f"/v1/models/{quote(self.name)}/metadata"))

    def stats(self) -> dict[str, Any]:
        """What the server's batcher did: requests, model calls, requests per call."""
        return dict(self._call("GET", "/gpuhop/stats"))

    def predict(
        self,
        body: dict[str, Any] | None = None,
        *,
        instances: Any = None,
        inputs: Any = None,
        signature: str | None = None,
    ) -> dict[str, Any]:
        """A :predict request: a whole TF Serving body, or `instances` (row format, answered
        with "predictions") or `inputs` (columnar, answered with "outputs"). Lists, nested
        lists and numpy arrays are taken. Raises GpuhopError with the server's message."""
        request = dict(body or {})
        if instances is not None:
            request["instances"] = _plain(instances)
        if inputs is not None:
            request["inputs"] = _plain(inputs)
        if signature is not None:
            request["signature_name"] = signature
        return dict(self._call("POST", f"/v1/models/{quote(self.name)}:predict", json=request))

    def forward(self, local_port: int = 0, host: str = "127.0.0.1") -> Forward:
        """The server's port here (0: any free one): `forward.url + "/v1/models/NAME"`."""
        info = self.wait_ready()
        assert info.port is not None
        return self.job.forward(info.port, local_port, host)


def check(response: Response) -> None:
    """Raise GpuhopError for an error answer: TF Serving's {"error"} or the agent's."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        message = f"the model server answered {response.status_code}: {response.text[:500]}"
        raise GpuhopError(message, status=response.status_code)
    code = body.get("code") or ("not_found" if response.status_code == 404 else "bad_request")
    message = str(body.get("error") or body.get("message") or response.text[:500])
    raise GpuhopError(message, code=str(code), status=response.status_code)


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def _info(session: Session, ref: str) -> ServingInfo:
    response = session.request("GET", f"/v1/serve/{quote(ref, safe='')}")
    from gpuhop.api import ServingInfo

    return ServingInfo.model_validate(response.json())


def model(session: Session, ref: str) -> Model:
    """A handle on a model server job; see `Client.model`."""
    return Model(session, _info(session, ref))


def serve(
    session: Session,
    source: str | os.PathLike[str] | Job,
    *,
    name: str,
    spec: JobSpec | None = None,
    max_batch_size: int = 32,
    batch_timeout_ms: float = 2.0,
    wait: bool = True,
    timeout: float = 600.0,
) -> Model:
    """Start a model server job; see `Client.serve`. Of `spec`, the server takes its GPUs
    (whole, or a share of one), its priority, its environment and its image."""
    from pydantic import ValidationError

    from gpuhop.api import JobInfo, ServeRequest

    fields: dict[str, Any] = {
        "name": name,
        "max_batch_size": max_batch_size,
        "batch_timeout_ms": batch_timeout_ms,
    }
    if spec is not None:
        fields.update(gpus=spec.gpus, gpu_memory_mb=spec.gpu_memory_mb, priority=spec.priority)
        if spec.env:
            fields["env"] = dict(spec.env)
        for key in ("image", "image_secret"):
            if getattr(spec, key) is not None:
                fields[key] = getattr(spec, key)
        if spec.no_image:
            fields["no_image"] = True
    local = None if isinstance(source, Job) else Path(source)
    if isinstance(source, Job):
        fields["source_job"] = source.id
    elif local is not None and local.is_dir():
        if not (local / SAVED_MODEL_PB).is_file():
            raise GpuhopError(
                f"{local} is not a SavedModel directory (it has no {SAVED_MODEL_PB})",
                code="bad_request",
            )
        result = scan(session, local.absolute(), None)
        tree_bytes, fields["tree"] = tree_of(result.files)
    else:
        ref, _, path = str(source).partition(":")
        if "/" in ref or not ref:
            raise GpuhopError(
                f"{source}: no such directory here, and not a JOB[:PATH]", code="bad_request"
            )
        fields["source_job"], fields["path"] = ref, path or None
    try:
        # Fields at their defaults are left out: an older agent takes what asks nothing new.
        body = ServeRequest(**fields).model_dump(mode="json", exclude_defaults=True)
    except ValidationError as e:
        raise invalid("the model server was not started", e) from None
    try:
        response = session.request("POST", "/v1/serve", json=body)
    except GpuhopError as e:
        if e.code != "missing_tree" or "tree" not in fields:
            raise
        send_files(session, result.files)
        send_tree(session, tree_bytes, result.files, None)
        response = session.request("POST", "/v1/serve", json=body)
    job = JobInfo.model_validate(response.json())
    served = model(session, job.id)
    if wait:
        served.wait_ready(timeout)
    return served
