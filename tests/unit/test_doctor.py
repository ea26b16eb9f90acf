"""`gpuhop doctor`'s verdicts, from the facts a host could present (no GPU needed)."""

from __future__ import annotations

import datetime
from dataclasses import replace

import pytest

from gpuhop.agent.services.bucketcreds import BucketFacts, usual_config
from gpuhop.agent.services.bucketcreds import check as bucket_check
from gpuhop.agent.services.doctor import Facts, evaluate
from gpuhop.agent.services.hostchecks import TlsFacts, tls_certificate
from gpuhop.api import CheckStatus, DoctorCheck, GpuInfo
from gpuhop.backends.ray.backend import SAME_USER_NODE
from gpuhop.cli.doctor import exit_code

GIB = 2**30
PY = "/opt/venv/bin/python"
H100 = GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", memory_mb=81559)
GPU_TF = {
    "python": PY,
    "tf_version": "2.21.0",
    "tf_dists": {"tensorflow": "2.21.0"},
    "cuda_build": True,
    "cuda_version": "12.5.1",
    "cudnn_version": "9",
    "gpus": ["/physical_device:GPU:0", "/physical_device:GPU:1"],
    "tf_keras": "2.21.0",
}
GPU_HOST = Facts(
    gpu_source="nvml",
    gpus=[H100, H100.model_copy(update={"index": 1})],
    driver_version="550.54.15",
    driver_cuda="12.6",
    driver_error=None,
    state_dir="/srv/gpuhop",
    disk_free=500 * GIB,
    probe=GPU_TF,
    podman="/usr/bin/podman",
    podman_version="4.3.1",
    cdi_spec="/etc/cdi/nvidia.yaml",
    nvidia_ctk=True,
)
CPU_HOST = replace(
    GPU_HOST,
    gpu_source="none",
    gpus=[],
    driver_version=None,
    driver_cuda=None,
    probe={**GPU_TF, "cuda_build": False, "gpus": [], "tf_dists": {"tensorflow-cpu": "2.21.0"}},
)


def verdicts(facts: Facts) -> dict[str, tuple[CheckStatus, str, str | None]]:
    return {c.name: (c.status, c.detail, c.fix) for c in evaluate(facts)}


def statuses(facts: Facts) -> dict[str, CheckStatus]:
    return {c.name: c.status for c in evaluate(facts)}


def test_a_healthy_gpu_host_passes_everything():
    checks = evaluate(GPU_HOST)

    assert [c.name for c in checks] == [
        "NVIDIA driver",
        "TensorFlow",
        "CUDA version",
        "TensorFlow sees the GPUs",
        "GPU health",
        "tf-keras",
        "disk space",
        "job sandbox",
        "job identity",
        "container images",
        "job work dirs",
    ]
    assert {c.status for c in checks} == {CheckStatus.passed}
    assert all(c.ok for c in checks)
    v = verdicts(GPU_HOST)
    assert "driver 550.54.15 (supports CUDA 12.6), 2 GPU(s): NVIDIA H100" in v["NVIDIA driver"][1]
    assert v["CUDA version"][1] == (
        "the driver supports CUDA up to 12.6; TensorFlow was built for 12.5.1"
    )


def test_a_quarantined_gpu_is_named_with_its_fault_and_the_fix():
    one = verdicts(replace(GPU_HOST, quarantined={1: "XID 79 (GPU fell off the bus)"}))
    status, detail, fix = one["GPU health"]
    assert status == CheckStatus.warning  # jobs still run on GPU 0
    assert "GPU 1: XID 79 (GPU fell off the bus)" in detail and "other GPUs" in detail
    assert fix is not None and "gpuhop gpus --release N" in fix
    both = replace(GPU_HOST, quarantined={0: "2 uncorrectable ECC error(s)", 1: "lost"})
    assert statuses(both)["GPU health"] == CheckStatus.failed
    assert statuses(CPU_HOST)["GPU health"] == CheckStatus.skipped


def test_a_cpu_only_host_is_a_valid_setup():
    s = statuses(CPU_HOST)

    assert all(status != CheckStatus.failed for status in s.values())
    assert s["NVIDIA driver"] == CheckStatus.skipped
    assert s["CUDA version"] == CheckStatus.skipped
    assert s["TensorFlow sees the GPUs"] == CheckStatus.skipped
    assert s["TensorFlow"] == CheckStatus.passed
    assert verdicts(CPU_HOST)["NVIDIA driver"][1] == (
        "no NVIDIA GPU on this host; jobs run on the CPU"
    )


def test_a_cpu_build_on_a_gpu_host_fails_with_the_install_to_run():
    facts = replace(GPU_HOST, probe=CPU_HOST.probe)

    v = verdicts(facts)

    status, detail, fix = v["TensorFlow"]
    assert status == CheckStatus.failed
    assert detail == "TensorFlow 2.21.0 is a CPU build; it cannot use this host's 2 GPU(s)"
    assert fix == (
        f"{PY} -m pip uninstall -y tensorflow-cpu && {PY} -m pip install 'tensorflow[and-cuda]'"
    )
    assert v["TensorFlow sees the GPUs"][0] == CheckStatus.failed
    assert "pip install 'tensorflow[and-cuda]'" in v["TensorFlow sees the GPUs"][2]


def test_tensorflow_missing_fails_and_says_what_to_install():
    facts = replace(GPU_HOST, probe={"python": PY, "tf_error": "ModuleNotFoundError: no"})

    v = verdicts(facts)

    assert v["TensorFlow"] == (
        CheckStatus.failed,
        f"cannot import tensorflow with {PY}: ModuleNotFoundError: no",
        f"{PY} -m pip install 'tensorflow[and-cuda]'",
    )
    assert v["TensorFlow sees the GPUs"][0] == CheckStatus.skipped
    assert v["tf-keras"][0] == CheckStatus.skipped


def test_a_probe_that_cannot_run_is_a_failure_with_a_way_to_see_why():
    facts = replace(CPU_HOST, probe={"python": PY, "probe_error": "the probe exited with 1"})

    status, detail, fix = verdicts(facts)["TensorFlow"]

    assert (status, detail) == (CheckStatus.failed, "the probe exited with 1")
    assert fix == f"run {PY} -c 'import tensorflow' on the GPU host to see what goes wrong"


@pytest.mark.parametrize(
    ("driver_cuda", "status"),
    [("11.8", CheckStatus.failed), ("12.2", CheckStatus.warning), ("12.5", CheckStatus.passed)],
)
def test_the_driver_must_support_the_cuda_tensorflow_was_built_for(driver_cuda, status):
    status_got, detail, fix = verdicts(replace(GPU_HOST, driver_cuda=driver_cuda))["CUDA version"]

    assert status_got == status
    assert detail.startswith(f"the driver supports CUDA up to {driver_cuda};")
    if status != CheckStatus.passed:
        assert fix == "update the NVIDIA driver to one that supports CUDA 12.5 or newer"


def test_tensorflow_seeing_fewer_gpus_than_the_driver_fails():
    facts = replace(GPU_HOST, probe={**GPU_TF, "gpus": []})

    status, detail, fix = verdicts(facts)["TensorFlow sees the GPUs"]

    assert (status, detail) == (CheckStatus.failed, "TensorFlow sees 0 of the 2 GPU(s)")
    assert "LD_LIBRARY_PATH" in fix


def test_a_driver_that_does_not_answer_fails():
    facts = replace(CPU_HOST, gpu_source="none", driver_error="nvidia-smi failed")

    assert verdicts(facts)["NVIDIA driver"][:2] == (CheckStatus.failed, "nvidia-smi failed")


def test_fake_gpus_need_no_driver_and_no_gpu_build():
    fake = [GpuInfo(index=i, name="Fake GPU", memory_mb=8192) for i in range(2)]
    facts = replace(CPU_HOST, gpu_source="fake", gpus=fake)

    s = statuses(facts)

    assert s["NVIDIA driver"] == s["TensorFlow sees the GPUs"] == CheckStatus.skipped
    assert all(status != CheckStatus.failed for status in s.values())


@pytest.mark.parametrize(
    ("tf_keras", "status"),
    [(None, CheckStatus.warning), ("2.20.1", CheckStatus.warning), ("2.21.3", CheckStatus.passed)],
)
def test_tf_keras_is_recommended_in_the_matching_version(tf_keras, status):
    status_got, _, fix = verdicts(replace(GPU_HOST, probe={**GPU_TF, "tf_keras": tf_keras}))[
        "tf-keras"
    ]

    assert status_got == status
    if status == CheckStatus.warning:
        assert fix == f"{PY} -m pip install 'tf-keras==2.21.*'"


@pytest.mark.parametrize(
    ("free", "status"),
    [
        (500 * GIB, CheckStatus.passed),
        (5 * GIB, CheckStatus.warning),
        (GIB // 2, CheckStatus.failed),
    ],
)
def test_free_disk_in_the_state_dir(free, status):
    status_got, detail, _ = verdicts(replace(GPU_HOST, disk_free=free))["disk space"]

    assert status_got == status
    assert "free in the agent's state dir /srv/gpuhop" in detail


def test_doctor_exit_code_follows_the_failed_checks():
    def check(status: CheckStatus) -> DoctorCheck:
        return DoctorCheck(name="x", status=status, detail="d", fix="f")

    assert exit_code([check(CheckStatus.passed), check(CheckStatus.skipped)]) == 0
    assert exit_code([check(CheckStatus.warning)]) == 0
    assert exit_code([check(CheckStatus.passed), check(CheckStatus.failed)]) == 1


def test_doctor_says_whether_jobs_get_an_overlay_or_a_copy():
    overlay = verdicts(GPU_HOST)["job work dirs"]
    assert overlay[0] == CheckStatus.passed and overlay[1].startswith("overlay:")
    why = "overlayfs: mount: Operation not permitted"
    copy = verdicts(replace(GPU_HOST, work_view=why))["job work dirs"]
    assert copy[0] == CheckStatus.warning and copy[1].startswith("copy:") and why in copy[1]


def test_a_host_without_namespaces_warns_a_single_user_and_fails_a_team():
    why = "[Errno 1] unshare: Operation not permitted; run the agent as root, or allow ..."
    alone = verdicts(replace(GPU_HOST, isolation=why))["job sandbox"]
    assert alone[0] == CheckStatus.warning
    assert "run unsandboxed" in alone[1] and "a team agent starts none" in alone[1]
    assert alone[2] == f"allow namespaces: {why}"
    team = verdicts(replace(GPU_HOST, isolation=why, team=True))["job sandbox"]
    assert team[0] == CheckStatus.failed and "no job starts" in team[1]
    assert verdicts(replace(GPU_HOST, team=True))["job sandbox"][0] == CheckStatus.passed


def test_doctor_says_whether_jobs_can_run_in_images_and_with_gpus_there():
    ready = verdicts(replace(GPU_HOST, container_runtime="runc"))["container images"]
    assert ready[0] == CheckStatus.passed
    assert "Podman 4.3.1" in ready[1] and "OCI runtime: runc" in ready[1]
    assert "CDI (/etc/cdi/nvidia.yaml)" in ready[1]
    none = verdicts(replace(GPU_HOST, podman=None))["container images"]
    assert none[0] == CheckStatus.skipped and "not installed" in none[1]
    assert none[2] == "apt-get install podman runc catatonit"
    no_cdi = verdicts(replace(GPU_HOST, cdi_spec=None, nvidia_ctk=False))["container images"]
    assert no_cdi[0] == CheckStatus.warning and "gets no GPU" in no_cdi[1]
    assert no_cdi[2].startswith("install the NVIDIA container toolkit, then nvidia-ctk cdi")
    cpu = verdicts(replace(CPU_HOST, cdi_spec=None))["container images"]
    assert cpu[0] == CheckStatus.passed


def test_doctor_says_which_identity_jobs_run_as():
    alone = verdicts(replace(GPU_HOST, agent_uid=1000))["job identity"]
    assert alone[0] == CheckStatus.passed and "the agent's user (uid 1000)" in alone[1]
    team = verdicts(replace(GPU_HOST, team=True, identity_users=2, uid_base=2_000_000_000))
    assert team["job identity"][0] == CheckStatus.passed
    assert "uid of their own (from 2000000000 on; 2 user(s) so far)" in team["job identity"][1]
    not_root = verdicts(replace(GPU_HOST, team=True, agent_uid=1000))["job identity"]
    assert not_root[0] == CheckStatus.failed and "no job starts" in not_root[1]
    assert not_root[2] == "run the team agent as root"
    cluster = verdicts(replace(GPU_HOST, team=True, ray=True, agent_uid=1000))["job identity"]
    assert cluster[0] == CheckStatus.warning and "cluster's user" in cluster[1]
    as_root = verdicts(replace(GPU_HOST, team=True, ray=True))["job identity"]
    assert as_root[0] == CheckStatus.failed and "no job starts" in as_root[1]


def test_on_a_ray_cluster_doctor_says_jobs_are_not_sandboxed():
    ray = replace(GPU_HOST, ray=True)
    alone = verdicts(ray)["job sandbox"]
    assert alone[0] == CheckStatus.passed and "unsandboxed" in alone[1]
    team = verdicts(replace(ray, team=True))["job sandbox"]
    assert team[0] == CheckStatus.warning and "not kept apart" in team[1]
    beside = verdicts(replace(ray, team=True, isolation=SAME_USER_NODE))["job sandbox"]
    assert beside[0] == CheckStatus.failed and "no job starts" in beside[1]
    assert "agent's own user" in beside[1]


def test_without_the_probe_only_the_checks_that_need_none_are_made():
    # What `doctor` shows at once; the probe's report is not read (there is none yet).
    whole = {c.name: c for c in evaluate(GPU_HOST)}
    quick = evaluate(replace(GPU_HOST, probe={}), probed=False)
    assert [c.name for c in quick] == [
        name
        for name in whole
        if name not in ("TensorFlow", "CUDA version", "TensorFlow sees the GPUs", "tf-keras")
    ]
    assert all(c == whole[c.name] for c in quick)


def test_on_slurm_tensorflow_is_judged_by_the_gpus_slurm_gave_the_check_on_its_node():
    slurm = replace(
        GPU_HOST,
        gpu_source="slurm",
        driver_version=None,
        driver_cuda=None,
        ray=True,
        cluster="the Slurm cluster",
        work_view="each job runs on a Slurm compute node from a copy of its files",
        probe={**GPU_TF, "node": "n7", "visible": "3", "gpus": ["/physical_device:GPU:0"]},
    )
    seen = verdicts(slurm)
    assert seen["TensorFlow sees the GPUs"][:2] == (
        CheckStatus.passed,
        "TensorFlow sees the 1 GPU(s) Slurm gave it on node n7",
    )
    assert seen["NVIDIA driver"][0] == CheckStatus.skipped
    assert seen["CUDA version"][0] == CheckStatus.skipped  # not the login host's driver
    assert seen["job work dirs"][0] == CheckStatus.passed  # no overlayfs advice
    cpu = verdicts(replace(slurm, probe={**slurm.probe, "cuda_build": False}))["TensorFlow"]
    assert cpu[:2] == (
        CheckStatus.failed,
        "TensorFlow 2.21.0 is a CPU build; it cannot use the 1 GPU(s) Slurm gave it on node n7",
    )
    none = verdicts(replace(slurm, probe={**slurm.probe, "gpus": []}))["TensorFlow sees the GPUs"]
    assert none[:2] == (
        CheckStatus.failed,
        "TensorFlow sees 0 of the 1 GPU(s) Slurm gave it on node n7",
    )
    assert "reinstall" not in (none[2] or "")


def test_where_the_probe_cannot_run_on_the_cluster_its_checks_are_skipped():
    ray = replace(
        GPU_HOST, ray=True, cluster="the Ray cluster", probe={"not_probed": "the Ray cluster"}
    )
    seen = verdicts(ray)
    for name in ("TensorFlow", "CUDA version", "TensorFlow sees the GPUs", "tf-keras"):
        assert seen[name][0] == CheckStatus.skipped, name
        assert seen[name][2] is None  # no advice about the agent's host


def test_on_ray_tensorflow_is_judged_by_the_gpu_ray_gave_the_check_with_advice_for_ray():
    node = "gpu3 (10.0.0.3, Ray node 0a1b2c3d)"
    ray = replace(
        GPU_HOST,
        gpu_source="ray",
        driver_version=None,
        driver_cuda=None,
        ray=True,
        cluster="the Ray cluster",
        work_view="the job's files are sent to the cluster's nodes from a copy",
        probe={**GPU_TF, "node": node, "visible": "0", "gpus": ["/physical_device:GPU:0"]},
    )
    seen = verdicts(ray)
    assert seen["TensorFlow sees the GPUs"][:2] == (
        CheckStatus.passed,
        f"TensorFlow sees the 1 GPU(s) Ray gave it on node {node}",
    )
    assert seen["TensorFlow"][1].endswith(f" on node {node}")
    assert seen["CUDA version"][0] == CheckStatus.skipped  # not the agent's host's driver
    none = verdicts(replace(ray, probe={**ray.probe, "gpus": []}))["TensorFlow sees the GPUs"]
    assert none[:2] == (
        CheckStatus.failed,
        f"TensorFlow sees 0 of the 1 GPU(s) Ray gave it on node {node}",
    )
    assert none[2] is not None and "on that node" in none[2]
    assert "srun" not in none[2] and "reinstall" not in none[2]


def test_bucket_credentials_are_the_users_secrets_or_their_usual_aws_configuration(tmp_path):
    # A single-user agent: its user's usual configuration fills in what the secrets leave out.
    assert usual_config({"AWS_CA_BUNDLE": "/x", "HOME": "/h"}, tmp_path) == ()
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    elsewhere = tmp_path / "conf"
    elsewhere.write_text("[default]\n")
    env = {"AWS_PROFILE": "lab", "AWS_SECRET_ACCESS_KEY": "", "AWS_CONFIG_FILE": str(elsewhere)}
    usual = usual_config(env, tmp_path)
    assert usual == (
        "the agent's environment (AWS_PROFILE)",
        str(tmp_path / ".aws" / "credentials"),
        str(elsewhere),
    )
    both = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")
    own = bucket_check(BucketFacts(both, usual))
    assert own.status == CheckStatus.passed
    assert own.detail.startswith(
        "a bucket's fetch signs with your secrets AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,"
        " AWS_ENDPOINT_URL; what they leave out comes from your usual AWS configuration:"
        " the agent's environment (AWS_PROFILE); "
    )
    fallback = bucket_check(BucketFacts(("AWS_REGION",), usual))
    assert fallback.status == CheckStatus.passed
    assert "your secrets AWS_REGION and, for the rest, your usual AWS configuration" in (
        fallback.detail
    )
    none = bucket_check(BucketFacts((), ()))
    assert none.status == CheckStatus.warning and none.detail.startswith(
        "none: you have no secret named AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY, and there"
        " is no usual AWS configuration here"
    )
    assert none.fix and none.fix.startswith("gpuhop secret set AWS_ACCESS_KEY_ID")
    # A team agent: the user's secrets or nothing, whatever the agent's own configuration.
    team = bucket_check(BucketFacts(both, None))
    assert team.status == CheckStatus.passed and "never the agent's own environment" in team.detail
    half = bucket_check(BucketFacts(("AWS_ACCESS_KEY_ID",), None))
    assert half.status == CheckStatus.warning
    assert half.detail.startswith(
        "none: you have no secret named AWS_SECRET_ACCESS_KEY (only AWS_ACCESS_KEY_ID), and"
    )


def test_the_listeners_certificate_is_judged_by_its_end_with_how_to_renew_it():
    """Checked only with a TLS listener; a warning two weeks before its end, a failure after
    (an agent that ran past it: clients refuse it), each fix for whose certificate it is."""
    assert "TLS certificate" not in {c.name for c in evaluate(GPU_HOST)}
    now = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC)
    given = TlsFacts("SHA256:AB", now + datetime.timedelta(days=90), None, now)
    own = replace(given, own="/srv/gpuhop/tls/cert.pem")
    checks = evaluate(replace(GPU_HOST, tls=given))
    [passed] = [c for c in checks if c.name == "TLS certificate"]
    assert (passed.status, passed.detail) == (
        CheckStatus.passed,
        "the listener's certificate (SHA256:AB) expires on 2027-03-03 12:00 UTC, in 90 days",
    )
    soon = tls_certificate(replace(given, expires=now + datetime.timedelta(days=14)))
    assert soon.status == CheckStatus.warning
    assert soon.detail.endswith("expires on 2026-12-17 12:00 UTC, in 14 day(s): clients refuse"
                                " it from then on")  # fmt: skip
    assert soon.fix and soon.fix.startswith("renew it and restart the agent with the new --tls")
    hours = tls_certificate(replace(own, expires=now + datetime.timedelta(hours=3)))
    assert hours.status == CheckStatus.warning and "in 3 hour(s)" in hours.detail
    # Its own: not renewed by the agent while valid (every pin would break); the fix says how.
    assert hours.fix and hours.fix.startswith(
        "stop the agent, remove /srv/gpuhop/tls/cert.pem and the key beside it, and start it"
    )
    assert "--replace --fingerprint NEW" in hours.fix
    gone = tls_certificate(replace(own, expires=now - datetime.timedelta(minutes=1)))
    assert gone.status == CheckStatus.failed
    assert gone.detail == (
        "the listener's certificate (SHA256:AB) expired on 2026-12-03 11:59 UTC: every client"
        " refuses it"
    )
    assert gone.fix and gone.fix.startswith("restart the agent: it makes a new certificate")
    given_gone = tls_certificate(replace(given, expires=now))
    assert given_gone.status == CheckStatus.failed
    assert given_gone.fix and given_gone.fix.startswith("renew it and restart the agent")
