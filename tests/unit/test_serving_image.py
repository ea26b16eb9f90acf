"""A model server in a container image, as far as no agent is needed: the request's image
fields, and the words a server that lacks its packages gets in its failure reason (the
agent's own words; the job only picks which of the server's packages)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuhop.agent.jobs.endings import hint_note
from gpuhop.api import ServeRequest
from gpuhop.serving import needs

TREE = "0" * 64


def test_a_serve_request_takes_an_image_as_a_job_does():
    spec = ServeRequest(name="m", tree=TREE, image="localhost/x:1", image_secret="REG").spec()
    assert (spec.image, spec.image_secret, spec.private_network) == ("localhost/x:1", "REG", True)
    for bad in ({"image": "Not A Ref"}, {"image": "x", "image_secret": "a b"}):
        with pytest.raises(ValidationError, match="image"):
            ServeRequest(name="m", tree=TREE, **bad)
    with pytest.raises(ValidationError, match="give both"):
        ServeRequest(name="m", tree=TREE, image_secret="REG")


def test_only_the_servers_own_line_names_what_to_install(tmp_path):
    log = tmp_path / "log"
    log.write_text(f"gpuhop-serving: ...\n{needs.line(['starlette', 'uvicorn'])}\n")
    assert hint_note(log) == (
        "; the model server's Python lacks starlette, uvicorn: install starlette uvicorn where"
        " it runs (for gpuhop serve --image, in the image: pip install starlette uvicorn)"
    )
    for other in ("starlette, os", "evil; rm -rf /", "", "starlette,uvicorn"):
        log.write_text(needs.PREFIX + other + "\n")
        assert hint_note(log) == "", other
