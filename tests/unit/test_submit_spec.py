"""The SDK's keywords made a JobSpec (gpuhop.client.jobs.spec_of), and the request a submit
sends for them: what the client sent before the spec for the same keywords, less only
fields at the agent's defaults, so an agent reads the very same request."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuhop.api.models import DataMount, SubmitRequest
from gpuhop.api.queue import parse_duration
from gpuhop.api.sizes import parse_mb
from gpuhop.api.spec import JobSpec, Mount
from gpuhop.client import GpuhopError, Job
from gpuhop.client import JobSpec as Exported
from gpuhop.client.jobs import check, spec_of
from gpuhop.client.submitted import requirements_text


def test_jobspec_is_exported_by_the_client() -> None:
    assert Exported is JobSpec


def test_the_sdks_names_and_forms_make_the_fields(tmp_path: Path) -> None:
    (tmp_path / "reqs.txt").write_text("numpy\n")
    job = Job(SimpleNamespace(session=None), {"id": "f00dfeed", "state": "queued"})  # type: ignore[arg-type]
    spec = spec_of(
        tmp_path,
        None,
        {
            "gpu_memory": "6GiB",
            "timeout": "6h",
            "requirements": tmp_path / "reqs.txt",
            "data": ["mnist:2=data", Mount("raw", None, "in")],
            "after": [job, "b"],
            "notify": ["https://example.com/hook"],
            "env": {"A": "1"},
            "retries": 2,
            "name": None,  # None: the default
        },
    )
    assert spec == JobSpec(
        gpu_memory_mb=6144,
        time_limit=21600.0,
        requirements="numpy\n",
        data=(Mount("mnist", 2, "data"), Mount("raw", None, "in")),
        after=("f00dfeed", "b"),
        notify=("https://example.com/hook",),
        env={"A": "1"},
        retries=2,
    )
    assert spec_of(tmp_path, None, {"gpu_memory_mb": 512, "time_limit": 30}) == JobSpec(
        gpu_memory_mb=512, time_limit=30.0
    )
    assert spec_of(tmp_path, None, {"after": "one"}).after == ("one",)
    assert spec_of(tmp_path, None, {"after": job}).after == ("f00dfeed",)


def test_a_spec_is_taken_as_it_is_and_options_change_it(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("pandas\n")
    assert spec_of(tmp_path, None, {}).requirements == "pandas\n"  # the work dir's
    assert spec_of(tmp_path, None, {"requirements": False}).requirements is None
    given = JobSpec(gpus=2, priority=3)
    assert spec_of(tmp_path, given, {}) == given  # its requirements: none
    assert spec_of(tmp_path, given, {"gpus": 1}) == JobSpec(gpus=1, priority=3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gpu_memory": "6XB"}, "gpu_memory: cannot read '6XB' as a size"),
        ({"timeout": "soon"}, "timeout: 'soon' is not a duration"),
        ({"data": ["kept"]}, "data: takes NAME[:VERSION]=MOUNT, got 'kept'"),
        ({"requirements": True}, "there is no requirements.txt in"),
    ],
)
def test_a_bad_value_is_refused_by_name(tmp_path, options, message) -> None:
    with pytest.raises(GpuhopError) as refused:
        spec_of(tmp_path, None, options)
    assert refused.value.code == "bad_request" and message in refused.value.message


def test_an_unknown_keyword_is_a_type_error_too(tmp_path) -> None:
    for name in ("gpu", "replace", "problems"):  # the spec's methods are no options either
        with pytest.raises(TypeError) as refused:
            spec_of(tmp_path, None, {name: 1})
        assert isinstance(refused.value, GpuhopError)
        assert refused.value.message == f"{name!r} is not a job option"


def test_the_rules_between_fields_use_the_sdks_names() -> None:
    with pytest.raises(GpuhopError) as refused:
        check(JobSpec(gpus=2, gpu_memory_mb=1024))
    assert refused.value.message == (
        "gpu_memory gives the job a share of one GPU; it cannot be combined with gpus 2"
        " (use gpus 2 alone for whole GPUs)"
    )
    check(JobSpec(gpus=1, gpu_memory_mb=1024))


def before_the_spec(root: Path, **o: Any) -> dict[str, Any]:
    """The fields the client sent for `o` before the spec (its `jobs.submit`, verbatim but
    for the names of its helpers), command and tree left out."""
    deps = [o.get("after", ())] if isinstance(o.get("after", ()), str) else o.get("after", [])
    timeout = o.get("timeout")
    fields: dict[str, Any] = dict(
        name=o.get("name"),
        gpus=o.get("gpus", 0),
        env=dict(o.get("env") or {}),
        priority=o.get("priority", 0),
        retries=o.get("retries", 0),
        workers=o.get("workers", 1),
        gpus_per_worker=o.get("gpus_per_worker", 0),
        worker_timeout=o.get("worker_timeout", 300),
        gpu_memory_mb=None if o.get("gpu_memory") is None else parse_mb(o["gpu_memory"]),
        data=[
            DataMount(name=m.name, version=m.version, mount=m.mount).model_dump(mode="json")
            for m in map(Mount.parse, o.get("data", ()))
        ],
        requirements=requirements_text(o.get("requirements"), root),
        python=o.get("python"),
        private_network=o.get("private_network", False) or None,
        pack=o.get("pack", False) or None,
        after=list(deps),
        after_any=o.get("after_any", False),
        timeout=None if timeout is None else parse_duration(timeout),
        retry_on=o.get("retry_on", "infra"),
        notify=list(o.get("notify", ())) or None,
        mixed_gpus=o.get("mixed_gpus", False) or None,
        sweep=o.get("sweep"),
        max_parallel=o.get("max_parallel"),
    )
    body = {key: value for key, value in fields.items() if value is not None}
    for key, unset in (("data", []), ("after", []), ("after_any", False), ("retry_on", "infra")):
        if body[key] == unset:
            del body[key]
    return body


CASES: list[dict[str, Any]] = [
    {},
    {"gpus": 1},
    {"gpu_memory": "6GiB", "name": "share"},
    {"workers": 2, "gpus_per_worker": 1, "worker_timeout": 60, "pack": True},
    {"env": {"A": "1"}, "priority": -5, "retries": 3, "retry_on": "any", "timeout": "90m"},
    {"after": ["a", "b"], "after_any": True, "notify": ["https://example.com/h"]},
    {"data": ["mnist:2=data", "raw=in"], "python": "/usr/bin/python3", "mixed_gpus": True},
    {"private_network": True, "requirements": False, "sweep": "s-1", "max_parallel": 2},
    {"gpus": 0, "priority": 0, "env": {}, "workers": 1, "after_any": False},  # the defaults
]


@pytest.mark.parametrize("options", CASES)
def test_the_wire_is_what_it_was_less_the_agents_defaults(tmp_path, options) -> None:
    (tmp_path / "requirements.txt").write_text("numpy\n")
    before = before_the_spec(tmp_path, **options)
    now = spec_of(tmp_path, None, options).to_wire()
    # Nothing is sent that was not, and what is sent is as it was...
    assert {key: before[key] for key in now} == now
    # ... and what is no longer sent is the agent's default, always was: the same request.
    for key in before.keys() - now.keys():
        assert (
            SubmitRequest.model_fields[key].get_default(call_default_factory=True) == (before[key])
        ), key
    command = {"command": ["x.py"], "tree": None}
    assert SubmitRequest(**command, **before) == SubmitRequest(**command, **now)
