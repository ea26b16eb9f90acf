"""Which multi-worker mode a job's Keras gets, and what each worker is told of its peers."""

from __future__ import annotations

import json

import pytest

from gpuhop.backends.kerasmode import KERAS_JAX, TF, KerasRefusal, decide
from gpuhop.backends.local.gangenv import worker_env

EVERYTHING = {"tensorflow", "tf_keras", "keras", "jax"}


def has(*modules: str):
    return lambda m: m in modules


@pytest.mark.parametrize(
    ("env", "mode", "job_env"),
    [
        ({}, TF, {"TF_USE_LEGACY_KERAS": "1"}),  # as before: tf-keras where the host has it
        ({"GPUHOP_KERAS": "tf-keras"}, TF, {"TF_USE_LEGACY_KERAS": "1"}),
        ({"TF_USE_LEGACY_KERAS": "1"}, TF, {"TF_USE_LEGACY_KERAS": "1"}),
        ({"KERAS_BACKEND": "jax"}, KERAS_JAX, {"KERAS_BACKEND": "jax"}),
        ({"GPUHOP_KERAS": "keras3", "KERAS_BACKEND": "JAX"}, KERAS_JAX, {"KERAS_BACKEND": "jax"}),
        ({"TF_USE_LEGACY_KERAS": "0"}, TF, {}),  # Keras 3 for a custom loop: the job's call
    ],
)
def test_modes_that_work(env, mode, job_env):
    chosen = decide(env, has(*EVERYTHING))
    assert (chosen.mode, chosen.env) == (mode, job_env)


def test_a_host_with_keras_and_jax_but_no_tensorflow_gets_keras_distribution():
    chosen = decide({}, has("keras", "jax"))
    assert (chosen.mode, chosen.env) == (KERAS_JAX, {"KERAS_BACKEND": "jax"})


@pytest.mark.parametrize(
    ("env", "found", "words"),
    [
        ({"GPUHOP_KERAS": "keras3"}, EVERYTHING, "-e KERAS_BACKEND=jax"),
        ({"KERAS_BACKEND": "tensorflow"}, EVERYTHING, "Keras 3 fit on the TensorFlow backend"),
        ({"KERAS_BACKEND": "torch"}, EVERYTHING, "the torch backend across processes"),
        ({"GPUHOP_KERAS": "tf-keras", "KERAS_BACKEND": "jax"}, EVERYTHING, "TensorFlow only"),
        ({}, {"tensorflow", "keras", "jax"}, "`pip install tf-keras` on the host"),
        ({"KERAS_BACKEND": "jax"}, {"keras"}, "`pip install jax` on the host"),
        ({"GPUHOP_KERAS": "keras2"}, EVERYTHING, "tf-keras or keras3, not 'keras2'"),
    ],
)
def test_what_cannot_work_is_refused_with_the_fix(env, found, words):
    with pytest.raises(KerasRefusal) as refused:
        decide(env, has(*found))
    assert words in str(refused.value)
    assert "\n" not in str(refused.value)


def test_each_worker_is_told_of_its_peers_in_its_mode():
    tf = [json.loads(worker_env("tf", [1000, 1001], i)["TF_CONFIG"]) for i in (0, 1)]
    assert tf[1] == {
        "cluster": {"worker": ["127.0.0.1:1000", "127.0.0.1:1001"]},
        "task": {"type": "worker", "index": 1},
    }
    assert worker_env("keras-jax", [1000, 1001, 1002], 2) == {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:1000",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "3",
        "KERAS_DISTRIBUTION_PROCESS_ID": "2",
        # What torch.distributed's env:// reads, in every mode.
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1000",
        "RANK": "2",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
    }
