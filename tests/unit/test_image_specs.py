"""Jobs in container images (`--image`), as far as no Podman is needed: which references
the wire takes, which combinations a spec refuses, what the command line sends, and the
refusal of the backends that cannot run an image (Ray, Slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuhop.agent.config import PolicyError, load
from gpuhop.api import ServeRequest, SubmitRequest
from gpuhop.api.spec import JobSpec, check_image
from gpuhop.backends.base import Refused
from gpuhop.backends.ray.backend import RayBackend
from gpuhop.backends.slurm.backend import SlurmBackend
from gpuhop.cli import jobopts


@pytest.mark.parametrize(
    "ref",
    [
        "python:3.11",
        "localhost/gpuhop-test/minimal:1",
        "nvcr.io/nvidia/tensorflow:24.01-tf2-py3",
        "registry.example.com:5000/team/train_image__x:v1.2",
        "tensorflow/tensorflow@sha256:" + "a" * 64,
    ],
)
def test_image_references_as_podman_takes_them(ref):
    assert check_image(ref) == ref
    assert SubmitRequest(command=["x"], image=ref).spec().image == ref


@pytest.mark.parametrize(
    "ref", ["team/Upper", "a b", "--privileged", "name:", "a;rm", "x@sha256:12", "a" * 256, ""]
)
def test_what_is_no_image_reference_is_refused_naming_it(ref):
    with pytest.raises(ValidationError, match="image"):
        SubmitRequest(command=["x"], image=ref)


def test_an_image_takes_no_host_interpreter_but_requirements_on_top():
    spec = JobSpec(image="python:3.11", python="/usr/bin/python3", requirements="numpy\n")
    found = spec.problems(jobopts.OPTION_NAMES)
    assert found == [
        "--image runs the job with the image's own python3; --python names an interpreter"
        " on the host: give one of them",
    ]
    with pytest.raises(ValidationError, match="python3"):
        SubmitRequest(command=["x"], image="python:3.11", python="/usr/bin/python3")
    on_top = SubmitRequest(command=["x"], image="python:3.11", requirements="numpy\n").spec()
    assert on_top.requirements == "numpy\n"
    assert JobSpec.from_json(JobSpec(image="python:3.11").to_json()).image == "python:3.11"
    assert JobSpec(image="python:3.11").to_wire() == {"image": "python:3.11"}


def test_no_image_travels_in_the_spec_of_a_job_and_of_a_model_server():
    """`--no-image` (the host's Python where the agent's default is an image) is a field of
    the one spec: on the wire, in the store, in a model server's request; with --image it
    is refused in the same words by the command line, the SDK and the agent."""
    both = JobSpec(image="python:3.11", no_image=True)
    assert both.problems(jobopts.OPTION_NAMES) == [
        "--image runs the job in that image; --no-image runs it with the host's Python:"
        " give one of them"
    ]
    with pytest.raises(ValidationError, match="no_image runs it with the host's Python"):
        SubmitRequest(command=["x"], image="python:3.11", no_image=True)
    with pytest.raises(ValidationError, match="no_image runs it with the host's Python"):
        ServeRequest(name="m", tree="a" * 64, image="python:3.11", no_image=True)
    spec = JobSpec(no_image=True)
    assert spec.to_wire() == {"no_image": True}
    assert JobSpec.from_json(spec.to_json()).no_image is True
    assert SubmitRequest(command=["x"], **spec.to_wire()).spec().no_image is True
    assert ServeRequest(name="m", tree="a" * 64, no_image=True).spec().no_image is True
    assert jobopts.spec_of({"no_image": True, "image": None}).no_image is True


def test_the_command_line_sends_no_requirements_txt_with_an_image(tmp_path, monkeypatch):
    (tmp_path / "requirements.txt").write_text("numpy\n")
    monkeypatch.chdir(tmp_path)
    venv = jobopts.spec_of({"requirements": None, "no_requirements": False, "image": None})
    assert venv.requirements == "numpy\n" and venv.image is None
    image = jobopts.spec_of({"requirements": None, "no_requirements": False, "image": "py:3"})
    assert image.requirements is None and image.image == "py:3"
    # Asked for by name, it goes on top of the image.
    named = jobopts.spec_of({"requirements": Path("requirements.txt"), "image": "py:3"})
    assert named.requirements == "numpy\n" and named.image == "py:3"
    with pytest.raises(SystemExit):
        jobopts.spec_of({"image": "Not An Image"})


@pytest.mark.parametrize("backend", [RayBackend, SlurmBackend])
def test_ray_and_slurm_refuse_an_image_saying_why(backend):
    # The refusal reads nothing of a connected cluster: a backend object without one.
    with pytest.raises(Refused, match="container images \\(--image\\) run on the local backend"):
        backend.check_submit(object.__new__(backend), JobSpec(image="python:3.11"))


def test_agent_toml_names_a_default_image_and_the_podman_to_run_it(tmp_path):
    (tmp_path / "agent.toml").write_text(
        'image = "nvcr.io/nvidia/tensorflow:24.01-tf2-py3"\npodman = "/opt/podman/bin/podman"\n'
        'container_runtime = "runc"\n'
    )
    policy = load(tmp_path)
    assert policy.image == "nvcr.io/nvidia/tensorflow:24.01-tf2-py3"
    assert (policy.podman, policy.container_runtime) == ("/opt/podman/bin/podman", "runc")
    (tmp_path / "agent.toml").write_text('image = "Not An Image"\n')
    with pytest.raises(PolicyError, match="image = 'Not An Image': 'Not An Image' is not an"):
        load(tmp_path)
