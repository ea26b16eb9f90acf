"""A job's secrets in its settings (by name only) and in its output (masked by its leader's
pump: gpuhop.backends.local.mask), as pure logic."""

from __future__ import annotations

import json
import os

import pytest

from gpuhop.agent.jobs.masking import mask_file, mask_json, ordered
from gpuhop.api import SubmitRequest
from gpuhop.api.spec import JobSpec, SecretUse
from gpuhop.backends.local import mask
from gpuhop.backends.local.mask import Masker, finish, masked_values, start


def fed(values: list[str], pieces: list[bytes]) -> bytes:
    masker = Masker(masked_values(values))
    return b"".join(masker.feed(p) for p in pieces) + masker.flush()


def test_a_value_is_masked_whole_and_split_across_any_two_writes():
    value = "tok-0123456789"
    text = f"a {value} b {value}\n".encode()
    assert fed([value], [text]) == b"a *** b ***\n"
    for cut in range(1, len(text)):
        assert fed([value], [text[:cut], text[cut:]]) == b"a *** b ***\n", cut
    # A byte at a time, too; and a beginning that never finishes is written as it was.
    assert fed([value], [bytes([b]) for b in text]) == b"a *** b ***\n"
    assert fed([value], [b"x tok-01", b"2 y"]) == b"x tok-012 y"
    assert fed([value], [b"ends with tok-012"]) == b"ends with tok-012"


def test_the_longer_value_wins_and_a_key_file_is_masked_line_by_line():
    assert fed(["abcd", "abcdefgh"], [b"abcdefgh abcd\n"]) == b"*** ***\n"
    key = "-----BEGIN KEY-----\nAAAAsecretline\n-----END KEY-----"
    assert fed([key], [b"line AAAAsecretline\n"]) == b"line ***\n"
    assert fed([""], [b"nothing to mask\n"]) == b"nothing to mask\n"


def test_the_pump_copies_a_pipe_masked_until_its_writers_are_gone(tmp_path):
    log = tmp_path / "output.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    pid, pipe = start(["hunter22"], fd)
    os.close(fd)
    os.write(pipe, b"pass hunt")
    os.write(pipe, b"er22 ok\n")
    os.close(pipe)
    finish(pid)
    assert log.read_bytes() == b"pass *** ok\n"


def test_a_pump_told_to_drain_at_once_still_copies_what_the_pipe_holds(tmp_path, monkeypatch):
    # The job's writers still hold the pipe, and the leader tells the pump to drain before
    # the pump has run at all (DRAIN_SECONDS of 0 here; a busy machine there).
    monkeypatch.setattr(mask, "DRAIN_SECONDS", 0.0)
    log = tmp_path / "output.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    pid, pipe = start(["hunter22"], fd)
    os.close(fd)
    os.write(pipe, b"pass hunter22 ok\n")
    finish(pid)
    os.close(pipe)
    assert log.read_bytes() == b"pass *** ok\n"


def test_a_spec_carries_its_secrets_by_name_only():
    spec = JobSpec(secrets=(SecretUse.parse("HF_TOKEN"), SecretUse.parse("KEY=AWS_KEY")))
    wire = spec.to_wire()
    assert wire == {
        "secrets": [{"name": "HF_TOKEN", "env": "HF_TOKEN"}, {"name": "KEY", "env": "AWS_KEY"}]
    }
    assert SubmitRequest(command=["x.py"], **wire).spec() == spec
    assert JobSpec.from_json(spec.non_default()) == spec


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "takes NAME or NAME=ENVVAR"),
        ("A=", "takes NAME or NAME=ENVVAR"),
        ("1A", "'1A' is not a valid environment variable name"),
        ("A=B-C", "'B-C' is not a valid environment variable name"),
    ],
)
def test_a_malformed_secret_option_says_what_is_wrong(text: str, why: str):
    with pytest.raises(ValueError, match=why):
        SecretUse.parse(text)


def test_a_secret_given_twice_as_one_variable_or_reserved_is_refused():
    twice = JobSpec(secrets=(SecretUse("A", "X"), SecretUse("B", "X")))
    assert twice.problems() == ["secrets gives two secrets as X"]
    with pytest.raises(ValueError, match="GPUHOP_JOB_ID is set by gpuhop"):
        SubmitRequest(command=["x.py"], secrets=[{"name": "A", "env": "GPUHOP_JOB_ID"}])


def test_metrics_records_and_the_kept_file_are_masked_however_the_value_is_spelled(tmp_path):
    value, digits = 'tok-\u00e9"x', "918273645"
    values = ordered([value, digits, ""])
    record = {"note": f"a {value}", value: 1.5, "pin": int(digits), "ok": True, "n": [0.5]}
    assert mask_json(record, values) == {
        "note": "a ***",
        "***": 1.5,
        "pin": "***",
        "ok": True,
        "n": [0.5],
    }
    path = tmp_path / "metrics.jsonl"
    lines = [
        json.dumps({"step": 1, "note": value}),  # escaped: \u00e9 and \"
        json.dumps({"step": 2, "note": value}, ensure_ascii=False),
        json.dumps({"step": 3, "loss": 0.5}),
        f"not json {value}",
    ]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o640)
    assert mask_file(path, values)
    kept = path.read_text().splitlines()
    assert [json.loads(line) for line in kept[:3]] == [
        {"step": 1, "note": "***"},
        {"step": 2, "note": "***"},
        {"step": 3, "loss": 0.5},
    ]
    assert kept[2] == lines[2] and kept[3] == "not json ***"  # a clean line as it was
    assert path.stat().st_mode & 0o777 == 0o640 and sorted(os.listdir(tmp_path)) == [path.name]
    assert not mask_file(path, values)  # nothing left to mask: not written again
