"""Which interpreters the agent asks for TensorBoard before serving a job's logs: a team
user's venv is never one of them (its .pth files, its user's, would run as the agent, root)."""

from gpuhop.agent.services.tensorboard import candidates

AGENT = "/opt/agent/bin/python"
VENV = {"dir": "/state/envs/abc"}


def test_a_team_users_venv_is_never_asked():
    deps = {"env": VENV, "identity": {"user": "alice", "uid": 2000000000, "gid": 2000000000}}
    assert candidates(AGENT, deps) == [AGENT]


def test_a_single_users_venv_is_asked_after_the_agents_own_python():
    assert candidates(AGENT, {"env": VENV}) == [AGENT, "/state/envs/abc/bin/python"]
    assert candidates(AGENT, {"python": "/usr/bin/python3.12"}) == [AGENT, "/usr/bin/python3.12"]
