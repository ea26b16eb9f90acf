"""The API's first gate: which paths, names, environments and manifest entries get in."""

from __future__ import annotations

import os
import random

import pytest
from pydantic import ValidationError

from gpuhop.api import BlobCheck, JobInfo, ManifestEntry, SubmitRequest, Tree, validate_relpath
from gpuhop.api.models import MAX_PATH_BYTES, MAX_PATH_DEPTH
from gpuhop.api.spec import WIRE_NAMES, JobSpec, Mount

DIGEST = "0123456789abcdef" * 4


# -- validate_relpath -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/abs",
        "/",
        "a/../b",
        "..",
        "../a",
        "a/..",
        "a//b",
        "./a",
        "a/./b",
        ".",
        "a/",
        "a\\b",
        "..\\a",
        "a\x00b",
        "a" * 4097,
    ],
)
def test_validate_relpath_rejects(path: str):
    with pytest.raises(ValueError):
        validate_relpath(path)


@pytest.mark.parametrize(
    "path", ["a", "a/b.py", ".gitignore", "a/.hidden/c", "...", "a..b/..c", "sp ace/é.py"]
)
def test_validate_relpath_accepts_and_returns_the_path(path: str):
    assert validate_relpath(path) == path


def test_validate_relpath_accepts_the_longest_and_deepest_allowed_paths():
    longest = "/".join(["a" * 255] * 11) + "/" + "b" * 253 + "/cc"
    assert len(longest) == MAX_PATH_BYTES
    assert validate_relpath(longest) == longest
    deepest = "/".join(["a"] * MAX_PATH_DEPTH)
    assert validate_relpath(deepest) == deepest


@pytest.mark.parametrize(
    "path",
    [
        "a/" * 2047 + "aa",  # 2048 levels: making its dirs passes Python's recursion limit
        "/".join(["a"] * (MAX_PATH_DEPTH + 1)),
        "a" * 256,
        "é" * 1537,  # 3074 bytes in UTF-8
    ],
)
def test_validate_relpath_refuses_paths_too_deep_or_too_long(path):
    with pytest.raises(ValueError, match=r"deep|longer"):
        validate_relpath(path)


def test_every_accepted_path_stays_inside_the_root():
    # Property check without hypothesis: many random paths built from the pieces that make
    # paths dangerous; whatever is accepted must land inside the root once normalised.
    rng = random.Random(1234)
    pieces = ["a", "b", ".", "..", "...", "/", "/", "\\", "\x00", "~", " ", ".a", "a."]
    root = "/srv/gpuhop/jobs/x/work"
    accepted = rejected = 0
    for _ in range(20_000):
        path = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        try:
            validate_relpath(path)
        except ValueError:
            rejected += 1
            continue
        accepted += 1
        landed = os.path.normpath(os.path.join(root, path))
        assert landed.startswith(root + "/"), (path, landed)
        assert ".." not in path.split("/")
    # Neither side of the property may be empty, or the check proves nothing.
    assert accepted > 1000
    assert rejected > 1000


# -- SubmitRequest ----------------------------------------------------------------------------


def submit(**fields: object) -> SubmitRequest:
    return SubmitRequest.model_validate({"command": ["train.py"], **fields})


def test_minimal_submit_gets_defaults():
    req = submit()
    assert req.command == ["train.py"]
    assert (req.name, req.gpus, req.priority, req.env, req.tree) == (None, 0, 0, {}, None)


def test_submit_rejects_unknown_fields():
    # A typo such as `gpu` must fail loudly, not silently run on the CPU.
    with pytest.raises(ValidationError, match="gpu"):
        submit(gpu=1)


@pytest.mark.parametrize(
    "name", ["a", "run-1.2_x", "A" * 128, "0lead", "lr-search[lr=0.1,batch=32]", "s[index=3]"]
)
def test_submit_accepts_good_names(name: str):
    assert submit(name=name).name == name


@pytest.mark.parametrize(
    "name", ["", "-x", ".x", "_x", "a" * 129, "a b", "a/b", "é", "a\x00", "a:b", "[x]"]
)
def test_submit_rejects_bad_names(name: str):
    with pytest.raises(ValidationError, match="name"):
        submit(name=name)


@pytest.mark.parametrize(
    "key", ["GPUHOP_X", "GPUHOP_JOB_ID", "GPUHOP_", "CUDA_VISIBLE_DEVICES", "TF_CONFIG"]
)
def test_submit_rejects_variables_gpuhop_sets(key: str):
    with pytest.raises(ValidationError) as exc:
        submit(env={"OK": "1", key: "x"})
    assert key in str(exc.value)
    assert "set by gpuhop" in str(exc.value)


@pytest.mark.parametrize("key", ["", "1X", "A-B", "A=B", "A B", "A.B", "É"])
def test_submit_rejects_invalid_variable_names(key: str):
    with pytest.raises(ValidationError, match="not valid"):
        submit(env={key: "x"})


def test_submit_accepts_ordinary_variables():
    env = {"MY_VAR": "1", "_private": "", "lower": "a=b c", "TF_CPP_MIN_LOG_LEVEL": "2"}
    assert submit(env=env).env == env


def test_submit_rejects_nul_in_a_variable_value():
    with pytest.raises(ValidationError, match="NUL"):
        submit(env={"A": "x\x00y"})


@pytest.mark.parametrize("command", [[], [""], ["python", "a\x00b"], "train.py"])
def test_submit_rejects_bad_commands(command: object):
    with pytest.raises(ValidationError):
        submit(command=command)


@pytest.mark.parametrize(("field", "value"), [("gpus", -1), ("priority", 101), ("priority", -101)])
def test_submit_rejects_out_of_range_numbers(field: str, value: int):
    with pytest.raises(ValidationError, match=field):
        submit(**{field: value})


def test_tree_checks_every_entry():
    good = {"path": "a.py", "digest": DIGEST, "size": 1}
    bad = {"path": "../etc/passwd", "digest": DIGEST, "size": 1}
    assert Tree(entries=[good]).entries[0].path == "a.py"
    with pytest.raises(ValidationError, match=r"entries\.1\.path"):
        Tree(entries=[good, bad])


def test_submit_names_its_tree_by_digest():
    assert submit(tree=DIGEST).tree == DIGEST
    with pytest.raises(ValidationError, match="tree"):
        submit(tree="not-a-digest")


# -- ManifestEntry and BlobCheck ---------------------------------------------------------------


def test_manifest_entry_accepts_a_good_entry():
    entry = ManifestEntry(path="src/a.py", digest=DIGEST, size=0, executable=True)
    assert (entry.path, entry.digest, entry.size, entry.executable) == (
        "src/a.py",
        DIGEST,
        0,
        True,
    )


@pytest.mark.parametrize(
    "digest", [DIGEST.upper(), DIGEST[:-1], DIGEST + "0", "g" * 64, "", " " + DIGEST[1:]]
)
def test_manifest_entry_rejects_bad_digests(digest: str):
    with pytest.raises(ValidationError, match="digest"):
        ManifestEntry(path="a", digest=digest, size=1)


def test_manifest_entry_rejects_negative_size():
    with pytest.raises(ValidationError, match="size"):
        ManifestEntry(path="a", digest=DIGEST, size=-1)


def test_manifest_entry_rejects_unsafe_paths_and_unknown_fields():
    with pytest.raises(ValidationError, match="path"):
        ManifestEntry(path="a/../../b", digest=DIGEST, size=1)
    with pytest.raises(ValidationError, match="mode"):
        ManifestEntry.model_validate({"path": "a", "digest": DIGEST, "size": 1, "mode": 0o777})


def test_blob_check_rejects_a_bad_digest_among_good_ones():
    assert BlobCheck(digests=[DIGEST]).digests == [DIGEST]
    with pytest.raises(ValidationError, match="sha256"):
        BlobCheck(digests=[DIGEST, "nothex"])


# -- Known bug: `$` in the validation regexes also matches before a trailing newline ----------


def test_digest_with_trailing_newline_is_rejected():
    with pytest.raises(ValidationError):
        ManifestEntry(path="a", digest=DIGEST + "\n", size=1)


def test_name_with_trailing_newline_is_rejected():
    with pytest.raises(ValidationError):
        submit(name="job\n")


def test_env_name_with_trailing_newline_is_rejected():
    with pytest.raises(ValidationError):
        submit(env={"TF_CONFIG\n": "{}"})


# -- GPU memory shares ------------------------------------------------------------------------


def test_a_share_means_one_gpu():
    req = submit(gpu_memory_mb=4096)
    assert (req.gpus, req.gpu_memory_mb) == (1, 4096)
    assert submit(gpus=1, gpu_memory_mb=4096).gpus == 1


def test_a_share_cannot_come_with_several_gpus():
    with pytest.raises(ValidationError, match="share of one GPU; it cannot be combined"):
        submit(gpus=2, gpu_memory_mb=4096)


@pytest.mark.parametrize("value", [0, -1, 2**40, "6GiB"])
def test_a_share_is_a_positive_number_of_mb(value: object):
    with pytest.raises(ValidationError, match="gpu_memory_mb"):
        submit(gpu_memory_mb=value)


def test_the_hook_verbosity_is_the_one_gpuhop_variable_a_user_may_set():
    assert submit(env={"GPUHOP_HOOK_VERBOSE": "1"}).env == {"GPUHOP_HOOK_VERBOSE": "1"}
    with pytest.raises(ValidationError, match="set by gpuhop"):
        submit(env={"GPUHOP_GPU_MEMORY_MB": "1"})


# -- SubmitRequest and JobSpec ----------------------------------------------------------------


def test_every_spec_field_is_a_submit_field_by_its_wire_name():
    # The wire stays flat and as it was: a field added to JobSpec that no SubmitRequest
    # field carries would never reach the agent.
    wire = {WIRE_NAMES.get(name, name) for name in JobSpec._fields}
    assert wire <= set(SubmitRequest.model_fields)
    assert set(SubmitRequest.model_fields) - wire == {"command", "tree", "tree_delta"}


def test_job_info_shows_the_spec_fields_by_their_wire_names():
    # An answer names a setting as the request did (`timeout`, not `time_limit`), and the
    # settings it shows stay those it showed.
    wire = {WIRE_NAMES.get(name, name) for name in JobSpec._fields}
    assert wire & set(JobInfo.model_fields) == {
        "name", "gpus", "env", "priority", "retries", "workers", "gpu_memory_mb", "data",
        "python", "private_network", "after", "after_any", "timeout", "retry_on", "sweep",
        "max_parallel", "mixed_gpus", "notify", "secrets", "image",
    }  # fmt: skip
    assert not set(WIRE_NAMES) & set(JobInfo.model_fields)


def test_a_spec_names_what_is_not_at_its_default_and_sends_just_that():
    spec = JobSpec(
        gpus=2, name="n", env={"A": "1"}, data=(Mount("d", None, "in"),), after=("a",),
        time_limit=60, priority=0, notify=(),
    )  # fmt: skip
    asked = {
        "gpus": 2, "name": "n", "env": {"A": "1"},
        "data": [{"name": "d", "version": None, "mount": "in"}], "after": ["a"], "time_limit": 60,
    }  # fmt: skip
    assert spec.non_default() == asked
    assert JobSpec.from_json(asked) == spec  # the rest comes back at its defaults
    # On the wire by the names agents have always known; what a request gives back.
    wire = spec.to_wire()
    assert wire == {**{k: v for k, v in asked.items() if k != "time_limit"}, "timeout": 60}
    assert SubmitRequest(command=["x.py"], **wire).spec() == spec
    # Empty is empty whatever its type: nothing asked, nothing sent.
    nothing = JobSpec(env={}, after=[], data=[], notify=())  # type: ignore[arg-type]
    assert nothing.non_default() == {} and nothing.to_wire() == {}


def test_a_request_gives_its_spec_settled():
    spec = submit(workers=2, gpus_per_worker=2, timeout=60, data=[{"name": "d", "mount": "in"}])
    assert spec.spec() == JobSpec(
        gpus=4, workers=2, gpus_per_worker=2, time_limit=60, data=(Mount("d", None, "in"),)
    )
    assert submit(gpu_memory_mb=4096).spec().gpus == 1
    assert submit().spec() == JobSpec()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"gpus_per_worker": 1}, "gpus_per_worker is for multi-worker jobs"),
        ({"workers": 2, "gpus": 3, "gpus_per_worker": 1}, "takes gpus_per_worker, not gpus"),
        ({"workers": 2, "gpu_memory_mb": 10}, "a multi-worker job takes whole GPUs"),
        ({"max_parallel": 2}, "max_parallel limits the runs of a sweep"),
    ],
)
def test_a_request_is_refused_for_its_spec_problems(fields: dict[str, object], words: str):
    with pytest.raises(ValidationError, match=words):
        submit(**fields)
