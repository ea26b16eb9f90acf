"""The bucket example as a user runs it, with real TensorFlow and a real S3 API server
(moto's, on loopback): drawn digits put in a bucket as PNG files by examples/bucket/upload.py,
then `gpuhop run --data s3://...:digits --secret ... examples/bucket/train.py`, unchanged:
Keras reads the fetched prefix with `image_dataset_from_directory` and its epochs reach
`show`; the next job with that prefix fetches nothing, and a secret it prints is masked."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from tests.conftest import EXAMPLES
from tests.integration.test_bucket_data import (  # the server fixture and the signed-in user
    S3,
    s3,  # noqa: F401
    signed_in,  # noqa: F401
)

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

IMAGES = "gpuhop-images"
COUNT = 200

# The example, unchanged, with the secrets it was given printed: the log must mask them.
LEAK = 'import os\nprint("key", os.environ["AWS_SECRET_ACCESS_KEY"])\n'


def _upload():
    spec = importlib.util.spec_from_file_location("upload", EXAMPLES / "bucket" / "upload.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keras_trains_on_images_fetched_from_a_bucket_and_the_next_run_fetches_nothing(
    signed_in,  # noqa: F811
    s3: S3,  # noqa: F811
    project,
):
    client = s3.client()
    client.create_bucket(Bucket=IMAGES)
    keys = _upload().upload(client, f"s3://{IMAGES}/digits", COUNT)
    client.close()
    assert len(keys) == COUNT and keys[0].endswith(".png")
    train = (EXAMPLES / "bucket" / "train.py").read_text()
    root = project({"train.py": train, "leak.py": LEAK})
    secrets = ["--secret", "AWS_ACCESS_KEY_ID", "--secret", "AWS_SECRET_ACCESS_KEY"]
    data = ["--data", f"s3://{IMAGES}/digits:digits"]
    mark = s3.mark()
    run = signed_in.cli(
        "run", "--name", "bucket-keras", *data, *secrets, "train.py", "--epochs", "2",
        cwd=root, timeout=280,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "classes 0 1 2 3 4 5 6 7 8 9" in run.stdout
    assert f"Found {COUNT} files belonging to 10 classes" in run.stdout
    gets = [r for r in s3.requests(mark) if r.startswith(f"GET /{IMAGES}/digits/")]
    assert len(gets) == COUNT  # each image once
    info = json.loads(signed_in.cli("show", "--json", "bucket-keras").stdout)
    assert info["latest_metrics"]["epochs"] == 2
    assert {"accuracy", "val_accuracy"} <= info["latest_metrics"].keys()

    # The next job with that prefix fetches nothing; the secret it prints is masked.
    mark = s3.mark()
    leak = signed_in.cli("run", "--name", "bucket-again", *data, *secrets, "leak.py", cwd=root)
    assert leak.returncode == 0, leak.stderr
    assert [r for r in s3.requests(mark) if r.startswith(f"GET /{IMAGES}/digits/")] == []
    assert re.search(r"^key \*\*\*$", leak.stdout, re.M), leak.stdout
    assert s3.secret not in leak.stdout + leak.stderr
    shown = " ".join(signed_in.cli("show", "bucket-again").stdout.split())
    assert f"digits: s3://{IMAGES}/digits/, {COUNT} objects" in shown and "all cached" in shown
