"""The agent's retention and quota settings: agent.toml, then options; bad ones are named."""

from __future__ import annotations

import pytest

from gpuhop.agent.config import Policy, PolicyError, load, parse_bytes


def test_defaults_then_the_file_then_options(tmp_path):
    assert load(tmp_path) == Policy()
    (tmp_path / "agent.toml").write_text('keep_jobs = 5\nstorage_quota = "2GiB"\nlog_cap = 4096\n')
    policy = load(tmp_path, {"keep_jobs": 7, "jobs_quota": "10M", "keep_days": None})
    assert (policy.keep_jobs, policy.storage_quota, policy.log_cap) == (7, 2 << 30, 4096)
    assert policy.jobs_quota == 10 << 20 and policy.keep_days == Policy().keep_days


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("keep_dayz = 3\n", "unknown setting 'keep_dayz'"),
        ('storage_quota = "lots"\n', "storage_quota"),
        ("keep_jobs = -1\n", "negative"),
        ("keep_jobs = [\n", "agent.toml"),
        ('idle_action = "kill"\n', "idle_action = 'kill': give one of 'warn', 'cancel'"),
        ("idle_gpu_minutes = -1\n", "idle_gpu_minutes = -1: give a number of minutes above 0"),
        ("notify_timeout_seconds = 0\n", "notify_timeout_seconds = 0: give a number of seconds"),
        ("notify_timeout_seconds = -3\n", "notify_timeout_seconds = -3: give a number of seconds"),
        ("notify_timeout_seconds = inf\n", "notify_timeout_seconds = inf: give a number of second"),
        ("auth_fail_limit = 0\n", "auth_fail_limit = 0: give a whole number of wrong tokens"),
        ("auth_fail_limit = 2.5\n", "auth_fail_limit = 2.5: give a whole number of wrong tok"),
        ('auth_fail_limit = "many"\n', "auth_fail_limit = 'many': give a whole number of wrong"),
        ("auth_fail_window_seconds = 0\n", "auth_fail_window_seconds = 0: give a number of sec"),
        ('[slurm]\nports = "32000-20000"\n', "[slurm] ports = '32000-20000': give ports from"),
        ('[slurm]\nports = "80-90"\n', "from 1024 to 65535"),
        ("[slurm]\nports = 20000\n", '[slurm] ports = 20000: give a range of ports "LOW-HIGH"'),
        ('[slurm]\nport = "20000-21000"\n', "unknown setting [slurm] port "),
        ('slurm = "20000-21000"\n', "slurm is a table: write [slurm] and its settings"),
        ('ready_containers = "no"\n', "ready_containers = 'no': give true or false"),
    ],
)
def test_a_bad_setting_is_named(tmp_path, text, words):
    (tmp_path / "agent.toml").write_text(text)
    with pytest.raises(PolicyError, match=words.replace("[", r"\[")):
        load(tmp_path)


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("64KiB", 65536), ("1.5G", 3 << 29), ("2 MiB", 2 << 20), ("3kb", 3072)],
)
def test_sizes(text, size):
    assert parse_bytes(text) == size


def test_the_idle_guard_takes_fractional_minutes_and_is_off_by_default(tmp_path):
    assert (Policy().idle_gpu_minutes, Policy().idle_action) == (None, "warn")
    (tmp_path / "agent.toml").write_text('idle_gpu_minutes = 0.05\nidle_action = "cancel"\n')
    assert (load(tmp_path).idle_gpu_minutes, load(tmp_path).idle_action) == (0.05, "cancel")


def test_wrong_tokens_are_limited_by_default_and_the_limit_can_be_lifted(tmp_path):
    assert (Policy().auth_fail_limit, Policy().auth_fail_window_seconds) == (20, 60.0)
    (tmp_path / "agent.toml").write_text("auth_fail_limit = 5\nauth_fail_window_seconds = 0.5\n")
    assert (load(tmp_path).auth_fail_limit, load(tmp_path).auth_fail_window_seconds) == (5, 0.5)
    (tmp_path / "agent.toml").write_text('auth_fail_limit = "none"\n')
    assert load(tmp_path).auth_fail_limit is None


def test_the_slurm_section_sets_the_gangs_port_range(tmp_path):
    assert Policy().slurm_ports is None  # the Slurm backend's own default
    (tmp_path / "agent.toml").write_text('[slurm]\nports = " 30000 - 30099 "\n')
    assert load(tmp_path).slurm_ports == (30000, 30099)


def test_the_slurm_section_sets_node_local_scratch(tmp_path):
    assert Policy().slurm_scratch is None  # $SLURM_TMPDIR, else the node's temp dir
    (tmp_path / "agent.toml").write_text('[slurm]\nscratch = "/local/scratch"\n')
    assert load(tmp_path).slurm_scratch == "/local/scratch"
    (tmp_path / "agent.toml").write_text('[slurm]\nscratch = "scratch"\n')
    with pytest.raises(PolicyError, match=r"\[slurm\] scratch = 'scratch': give an absolute"):
        load(tmp_path)


def test_the_object_cache_is_bounded_by_default_in_the_units_other_sizes_take(tmp_path):
    assert Policy().object_cache_size == 100 << 30
    (tmp_path / "agent.toml").write_text('object_cache_size = "512MiB"\nobject_keep_days = 2\n')
    policy = load(tmp_path)
    assert (policy.object_cache_size, policy.object_keep_days) == (512 << 20, 2.0)
    (tmp_path / "agent.toml").write_text('object_cache_size = "none"\n')
    assert load(tmp_path).object_cache_size is None
    (tmp_path / "agent.toml").write_text('object_cache_size = "plenty"\n')
    with pytest.raises(PolicyError, match="object_cache_size = 'plenty': cannot read"):
        load(tmp_path)


def test_containers_are_started_ahead_of_image_jobs_unless_turned_off(tmp_path):
    assert Policy().ready_containers is True
    (tmp_path / "agent.toml").write_text("ready_containers = false\n")
    assert load(tmp_path).ready_containers is False
