"""The model server answering as TF Serving does, with a real SavedModel on the CPU, served
as a real job with batching on (the default) and asked through the agent's proxy.

The model has the outputs that the batcher must not touch: a [3] list of labels next to
one row per example, a scalar total, and text in an output named `..._bytes`. Expected
answers and messages are TF Serving's (tensorflow_serving/util/json_tensor.cc and its
json_tensor_test.cc, model_servers/http_rest_api_handler_test.cc, g3doc/api_rest.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gpuhop.client import Client, Model
from tests.conftest import Agent
from tests.e2e.test_forward_cli import Running

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

SAVE = """
import sys
import tensorflow as tf

class Odd(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def default(self, x):
        return {"y": x * 2.0, "labels": tf.constant(["cat", "dog", "owl"])}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def total(self, x):
        return {"total": tf.reduce_sum(x)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="s")])
    def echo(self, s):
        return {"echo_bytes": s, "text": s}

m = Odd()
tf.saved_model.save(
    m, sys.argv[1], signatures={"serving_default": m.default, "total": m.total, "echo": m.echo}
)
"""
PATH = "/v1/models/odd:predict"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model, saved by real TensorFlow (in a process of its own, as a user would)."""
    model_dir = tmp_path_factory.mktemp("odd") / "odd_savedmodel"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    subprocess.run([sys.executable, "-c", SAVE, str(model_dir)], env=env, check=True, timeout=120)
    return model_dir


@pytest.fixture(scope="module")
def odd(shared_agent: Agent, saved: Path) -> Iterator[Model]:
    """The model served with batches of 4 that wait up to 50 ms."""
    with shared_agent.client() as client:
        model = client.serve(saved, name="odd", max_batch_size=4, batch_timeout_ms=50)
        yield model
        model.job.cancel(grace=5)
        model.job.wait(timeout=30)


def predict(model: Model, body: object) -> tuple[int, object]:
    answer = model.request("POST", PATH, json=body)
    return answer.status_code, answer.json()


def test_a_scalar_output_answers_and_the_server_goes_on(odd):
    # Before: the batcher sliced the scalar, raised, and every later request hung.
    assert predict(odd, {"signature_name": "total", "inputs": [1.0, 2.5]}) == (
        200,
        {"outputs": 3.5},
    )
    # TF Serving's refusal of a scalar in the row format (MakeRowFormatJsonFromTensors).
    assert predict(odd, {"signature_name": "total", "instances": [1.0, 2.5]}) == (
        400,
        {"error": "Tensor name: total has no shape information "},
    )
    status, body = predict(odd, {"inputs": [1.0]})
    assert status == 200 and body["outputs"]["y"] == [2.0]


def test_concurrent_totals_are_never_batched_together(odd, shared_agent):
    def one(i: int) -> object:
        with Client(shared_agent.home, autostart=False, cache_dir=shared_agent.cache) as c:
            return c.model("odd").predict(inputs=[float(i)], signature="total")["outputs"]

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(one, range(4))) == [0.0, 1.0, 2.0, 3.0]


def test_labels_without_a_batch_dimension_in_both_formats(odd):
    # Columnar: every output whole, as TF Serving gives them (before: cut to 1 label).
    assert predict(odd, {"inputs": [1.5]}) == (
        200,
        {"outputs": {"labels": ["cat", "dog", "owl"], "y": [3.0]}},
    )
    # Row: TF Serving's refusal (before: 200 with a made-up pairing).
    assert predict(odd, {"instances": [1.5]}) == (
        400,
        {"error": "Tensor name: y has inconsistent batch size: 1 expecting: 3"},
    )
    # Three rows make the pairing real: then it is TF Serving's answer.
    status, body = predict(odd, {"instances": [1.0, 2.0, 3.0]})
    assert status == 200 and body["predictions"][2] == {"labels": "owl", "y": 6.0}


def test_bytes_outputs_are_base64_in_both_formats(odd):
    """api_rest.md "Output of binary values" and "Encoding binary values"."""
    request = {"signature_name": "echo", "instances": [{"b64": "aW1hZ2UgYnl0ZXM="}, "seaside"]}
    assert predict(odd, request) == (
        200,
        {
            "predictions": [
                {"echo_bytes": {"b64": "aW1hZ2UgYnl0ZXM="}, "text": "image bytes"},
                {"echo_bytes": {"b64": "c2Vhc2lkZQ=="}, "text": "seaside"},
            ]
        },
    )
    assert predict(odd, {"signature_name": "echo", "inputs": ["seaside"]}) == (
        200,
        {"outputs": {"echo_bytes": [{"b64": "c2Vhc2lkZQ=="}], "text": ["seaside"]}},
    )


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error"),
    [
        # http_rest_api_handler_test.cc PredictRequestErrors
        ("POST", PATH, b"", 400, "JSON Parse error: The document is empty"),
        ("POST", PATH, b"instances = [1, 2]", 400, "JSON Parse error: Invalid value. at offset: 0"),
        (
            "POST",
            PATH,
            b'{ "instances": ["x", "y"] }',
            400,
            "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT:"
            ' JSON Value: "x" Type: String is not of expected type: float',
        ),
        (
            "POST",
            "/v1/models/odd/labels/Version_Nonexistent:predict",
            b'{ "instances": ["x", "y"] }',
            400,
            "Unrecognized servable version label: Version_Nonexistent",
        ),
        # PredictModelNameVersionErrors: 404s; api_rest.md's example words
        (
            "POST",
            "/v1/models/half:predict",
            b'{"instances": [1.0,5.0]}',
            404,
            "Servable not found for request: Latest(half)",
        ),
        (
            "POST",
            "/v1/models/odd/versions/50:predict",
            b'{"instances": [1]}',
            404,
            "Servable not found for request: Specific(odd, 50)",
        ),
        # UnsupportedApiCalls
        ("GET", "/v1/foo", b"", 400, "Malformed request: GET /v1/foo"),
        ("GET", "/v1/models", b"", 400, "Missing model name in request."),
        (
            "GET",
            "/v1/models/odd:predict",
            b"",
            400,
            "Malformed request: GET /v1/models/odd:predict",
        ),
        (
            "POST",
            "/v1/models/odd/metadata",
            b"",
            400,
            "Malformed request: POST /v1/models/odd/metadata",
        ),
        (
            "POST",
            f"/v1/models/odd/versions/{2**64 - 1}:regress",
            b"",
            400,
            f"Failed to convert version: {2**64 - 1} to numeric.",
        ),
        # Numbers rapidjson finds too big for a double (before: 500s, with tracebacks)
        (
            "POST",
            PATH,
            b'{"inputs": [1' + b"0" * 400 + b"]}",
            400,
            "JSON Parse error: Number too big to be stored in double.",
        ),
        (
            "POST",
            PATH,
            b'{"inputs": [1, -1' + b"0" * 5000 + b"]}",
            400,
            "JSON Parse error: Number too big to be stored in double. at offset: 15",
        ),
        # Past the largest double, where Python's parser reads infinity (before: a 200)
        (
            "POST",
            PATH,
            b'{"inputs": [1.0, 1e999]}',
            400,
            "JSON Parse error: Number too big to be stored in double. at offset: 17",
        ),
        # More dimensions than numpy takes (before: a 500, with a traceback)
        (
            "POST",
            PATH,
            b'{"inputs": ' + b"[" * 70 + b"1.0" + b"]" * 70 + b"}",
            400,
            "a value of 70 dimensions (lists in lists); gpuhop's model server takes at most 32",
        ),
        # GetStatus of a model or version that is not there (get_model_status_impl.cc)
        ("GET", "/v1/models/half", b"", 404, "Could not find any versions of model half"),
        ("GET", "/v1/models/odd/versions/7", b"", 404, "Could not find version 7 of model odd"),
        (
            "GET",
            "/v1/models/half/metadata",
            b"",
            404,
            "Servable not found for request: Latest(half)",
        ),
    ],
)
def test_tf_servings_words_through_the_agent(odd, method, path, body, status, error):
    answer = odd.request(method, path, content=body)
    assert (answer.status_code, answer.json()) == (status, {"error": error})


def test_the_job_log_stays_quiet_about_refused_requests(odd):
    log = b"".join(odd.job.logs()).decode(errors="replace")
    assert "ready on http://127.0.0.1" in log and "Traceback" not in log


def test_forward_without_a_port_reaches_the_model_server(odd, shared_agent):
    """`gpuhop forward MODEL`: the server's port, whatever it is (here on a free local port;
    by default on 8501, TF Serving's), answering TF Serving's REST API."""
    running = Running(shared_agent, "forward", "odd", "--local-port", "0")
    try:
        url = running.url()
        answer = httpx.post(f"{url}/v1/models/odd:predict", json={"inputs": [1.0]})
        assert answer.json() == {"outputs": {"labels": ["cat", "dog", "owl"], "y": [2.0]}}
        running.proc.send_signal(signal.SIGINT)
        assert running.finish() == 0, running.stderr
    finally:
        running.kill()
    assert f"port {odd.info.port} (Ctrl-C to stop)" in running.stderr


def test_serve_with_port_here_forwards_once_ready(shared_agent, saved):
    running = Running(shared_agent, "serve", str(saved), "--name", "odd-here", "--port-here", "0")
    try:
        url = running.url()
        answer = httpx.post(f"{url}/v1/models/odd-here:predict", json={"inputs": [2.0]})
        assert answer.json()["outputs"]["y"] == [4.0]
        running.proc.send_signal(signal.SIGINT)
        assert running.finish() == 0, running.stderr
    finally:
        running.kill()
        with shared_agent.client() as client:
            job = client.model("odd-here").job
            job.cancel(grace=5)
            job.wait(timeout=30)
    assert "model odd-here ready in job" in running.stderr
