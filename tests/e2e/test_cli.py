"""The CLI as a user runs it: `python -m gpuhop ...` in a project dir, against a real agent."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhop.home import read_pid
from tests.conftest import EXAMPLES, wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.mark.tf
def test_digits_demo_trains_and_pulls_a_working_savedmodel(make_agent, tmp_path):
    agent = make_agent()
    work = tmp_path / "work"
    shutil.copytree(EXAMPLES / "digits", work / "examples" / "digits")
    out = tmp_path / "model"
    run = agent.cli(
        "run",
        "--name",
        "digits",
        "--pull",
        str(out),
        "examples/digits/train.py",
        "--epochs",
        "3",
        cwd=work,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr
    assert "Epoch 3/3" in run.stdout
    accuracy = float(run.stdout.split("test accuracy: ")[1].split()[0])
    assert accuracy > 0.6
    assert "succeeded: exited with code 0" in run.stderr
    assert (out / "digits_savedmodel" / "saved_model.pb").is_file()
    # TensorBoard's event files, written to $GPUHOP_TENSORBOARD_DIR, came back too.
    assert list((out / "tensorboard" / "train").glob("events.out.tfevents.*"))

    show = json.loads(agent.cli("show", "--json", "digits").stdout)
    assert show["state"] == "succeeded"
    assert show["latest_metrics"]["epoch"] == 3
    assert show["latest_metrics"]["epochs"] == 3  # what `run` shows as "epoch 3/3"
    assert show["latest_metrics"]["val_accuracy"] == pytest.approx(accuracy, abs=1e-4)

    # The pulled model is a real SavedModel: load it in a fresh process and classify.
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, numpy as np, tensorflow as tf\n"
            "sys.path.insert(0, sys.argv[2])\n"
            "from drawn_digits import draw\n"
            "m = tf.saved_model.load(sys.argv[1])\n"
            "images, labels = draw(1797, seed=7)\n"  # digits it never saw
            "x = images.reshape(len(images), -1) / 16.0\n"
            "p = m.serve(tf.constant(x)).numpy()\n"
            "print(p.shape, float((p.argmax(1) == labels).mean()))\n",
            str(out / "digits_savedmodel"),
            str(EXAMPLES / "digits"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=agent.env,
    )
    assert check.returncode == 0, check.stderr
    shape, acc = check.stdout.strip().rsplit(" ", 1)
    assert shape == "(1797, 10)" and float(acc) > 0.6


def test_exit_code_is_the_jobs_own(shared_agent, project):
    root = project(
        {
            "ok.py": "print('fine')\n",
            "seven.py": "import sys; print('partial'); sys.exit(7)\n",
            "sigkill.py": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n",
        }
    )
    ok = shared_agent.cli("run", "ok.py", cwd=root)
    seven = shared_agent.cli("run", "seven.py", cwd=root)
    killed = shared_agent.cli("run", "sigkill.py", cwd=root)
    assert (ok.returncode, ok.stdout) == (0, "fine\n")
    assert (seven.returncode, seven.stdout) == (7, "partial\n")
    assert "failed: exited with code 7" in seven.stderr
    assert killed.returncode == 128 + 9
    assert "killed by signal 9 (SIGKILL" in killed.stderr


def test_gpuhops_own_lines_start_on_a_line_of_their_own(shared_agent, project):
    # A job whose output stops mid-line (a progress bar when it crashed): gpuhop's lines after
    # it, in the job's log (a retry's notice) and on the user's terminal (how it ended), each
    # start a line of their own. Where stdout goes alone, it is the job's output as it was.
    root = project({"bar.py": "import sys\nsys.stdout.write('1/8 - loss: 0.0181')\nsys.exit(3)\n"})
    argv = [sys.executable, "-m", "gpuhop", "run", "--retries", "1", "--retry-on", "any"]
    together = subprocess.run(
        [*argv, "--name", "glued", "bar.py"],
        cwd=root,
        env=shared_agent.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # as on a terminal
        text=True,
        timeout=120,
    )
    assert together.returncode == 3, together.stdout
    lines = together.stdout.splitlines()
    assert lines.count("1/8 - loss: 0.0181") == 2, lines  # each attempt's, alone on its line
    assert [line for line in lines if "gpuhop" in line and not line.startswith("gpuhop: ")] == []
    assert any(line.startswith("gpuhop: attempt 1 failed: exited with code 3") for line in lines)
    assert lines[-1].startswith("gpuhop: job ") and "failed: exited with code 3" in lines[-1]

    apart = subprocess.run(
        [*argv, "bar.py"],
        cwd=root,
        env=shared_agent.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert apart.returncode == 3
    assert apart.stdout.startswith("1/8 - loss: 0.0181\ngpuhop: attempt 1 failed")
    assert apart.stdout.endswith("\n1/8 - loss: 0.0181")  # nothing added to the job's own
    assert apart.stderr.startswith("gpuhop: synced")


def test_arguments_env_and_programs_reach_the_job(shared_agent, project):
    root = project({"args.py": "import os, sys; print(sys.argv[1:], os.environ['GREETING'])\n"})
    run = shared_agent.cli(
        "run", "-e", "GREETING=hi there", "args.py", "--lr", "0.1", "-x", cwd=root
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "['--lr', '0.1', '-x'] hi there\n"
    assert "gpuhop: synced 1 file (" in run.stderr  # one file, not "1 files"
    program = shared_agent.cli("run", "-q", "ls", "-1", cwd=root)
    assert (program.returncode, program.stdout, program.stderr) == (0, "args.py\n", "")


def test_a_program_of_the_work_dir_runs_by_its_path_as_in_a_shell(shared_agent, project):
    # `run ./train.sh` lost its ./ on the way and ran as the bare name train.sh, looked for
    # on the host's PATH: "command 'train.sh' was not found on the GPU host".
    root = project({"train.sh": '#!/bin/sh\necho trained "$@"\n'})
    (root / "train.sh").chmod(0o755)
    dotted = shared_agent.cli("run", "-q", "./train.sh", "--lr", "1", cwd=root)
    assert (dotted.returncode, dotted.stdout) == (0, "trained --lr 1\n"), dotted.stderr
    # A bare name is the host's to find, as a shell's is; the work dir's own is named.
    bare = shared_agent.cli("run", "train.sh", cwd=root)
    assert (bare.returncode, bare.stderr) == (
        2,
        "gpuhop: error: command 'train.sh' was not found on the GPU host; to run the work"
        " dir's train.sh, name it ./train.sh\n",
    )


def test_a_script_whose_interpreter_is_missing_says_so(shared_agent, project):
    # Its #! line names an interpreter that is not there (Windows line endings make it
    # "/bin/sh\r"): exec fails with ENOENT, which said "No such file or directory" of the
    # script, that is there.
    root = project({"crlf.sh": "#!/bin/sh\r\necho hi\r\n", "gone.sh": "#!/no/such/sh\necho\n"})
    for name in ("crlf.sh", "gone.sh"):
        (root / name).chmod(0o755)
    crlf = shared_agent.cli("run", "-q", "./crlf.sh", cwd=root)
    assert crlf.returncode == 127
    assert "crlf.sh': its #! line ends in a carriage return (Windows line endings)" in crlf.stdout
    assert "'/bin/sh\\r', which does not exist: convert the file to Unix" in crlf.stdout
    gone = shared_agent.cli("run", "-q", "./gone.sh", cwd=root)
    assert gone.returncode == 127
    assert "gone.sh': the interpreter its #! line names, '/no/such/sh', is not" in gone.stdout


def test_a_module_the_jobs_python_lacks_is_named_with_what_to_do(shared_agent, project):
    # A script run from a subfolder of its project (its `mylib` left behind), or one needing
    # a package not installed, ended "exited with code 1" and a traceback, nothing more.
    root = project({"sub/train.py": "import mylib.layers\n", "mylib/layers.py": "pass\n"})
    ran = shared_agent.cli("run", "--no-requirements", "train.py", cwd=root / "sub")
    assert ran.returncode == 1
    said = " ".join(ran.stderr.split())
    assert "its Python has no module 'mylib': a package goes in the work dir's requirements" in said
    assert "a module of the project's own must be in the work dir (run from the project's top" in (
        said
    )
    # A script's own failure gets no such words.
    (root / "bad.py").write_text("raise ValueError('a bad value')\n")
    bad = shared_agent.cli("run", "--no-requirements", "bad.py", cwd=root)
    assert bad.returncode == 1 and "has no module" not in bad.stderr


def test_bad_input_gets_a_clear_message(shared_agent, project):
    root = project({"ok.py": "pass\n", "sub/a.py": "pass\n"})
    missing = shared_agent.cli("run", "nope.py", cwd=root)
    dirs = [shared_agent.cli("run", head, cwd=root) for head in (".", "sub/")]
    into_files = [shared_agent.cli("pull", "j", flag, "ok.py", cwd=root) for flag in ("-o", "-C")]
    # -C names a dir that is not there, or a file: that is said, not "no such script".
    no_dir = shared_agent.cli("run", "-C", "nodir", "ok.py", cwd=root)
    file_dir = shared_agent.cli("run", "-C", "ok.py", "ok.py", cwd=root)
    elsewhere = shared_agent.cli("run", "-C", str(root), "ok2.py", cwd=root.parent)
    no_cmd = shared_agent.cli("run", "definitely-not-a-program", cwd=root)
    too_many = shared_agent.cli("run", "--gpus", "4", "ok.py", cwd=root)
    unknown = shared_agent.cli("logs", "ffffffffff", cwd=root)
    empty = [shared_agent.cli(command, "", cwd=root) for command in ("logs", "show", "cancel")]
    slashed = [shared_agent.cli(command, "a/b", cwd=root) for command in ("logs", "show", "pull")]
    bad_env = shared_agent.cli("run", "-e", "NOEQUALS", "ok.py", cwd=root)
    bad_name = shared_agent.cli("run", "--name", "<b>", "ok.py", cwd=root)
    # An unknown option before the script is gpuhop's mistake to name, as every command does.
    bad_option = shared_agent.cli("run", "--frobnicate", "ok.py", cwd=root)
    dashed = shared_agent.cli("run", "--", "-x", cwd=root)
    for result in (missing, no_cmd, too_many, unknown, *empty, bad_env, bad_name, bad_option):
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
    assert f"no such script: nope.py in the work dir {root}\n" in missing.stderr
    for result, head in zip(dirs, (".", "sub/"), strict=True):  # not "command '.' not found"
        assert result.returncode == 2, result.stderr
        assert f"gpuhop: error: {head} is a directory, not a script" in result.stderr
    for result, flag in zip(into_files, ("-o", "-C"), strict=True):  # checked before the job
        assert result.returncode == 2, result.stderr
        assert (
            result.stderr == f"gpuhop: error: {flag} ok.py is a file, not a folder: name a"
            " folder (made if missing)\n"
        )
    for result, path in ((no_dir, root / "nodir"), (file_dir, root / "ok.py")):
        assert result.returncode == 2, result.stderr
        assert result.stderr == f"gpuhop: error: work dir {path} is not a directory\n"
    # A name close to a script's there is taken for a typo of it.
    assert f"no such script: ok2.py in the work dir {root}; did you mean ok.py?\n" in (
        elsewhere.stderr
    )
    typo = shared_agent.cli("run", "sub/b.py", cwd=root)
    assert f"no such script: sub/b.py in the work dir {root}; did you mean sub/a.py?" in (
        typo.stderr
    )
    assert "'definitely-not-a-program' was not found on the GPU host" in no_cmd.stderr
    assert "asks for 4 GPUs; this host has 0" in too_many.stderr
    assert "no job matches 'ffffffffff'" in unknown.stderr
    for result in empty:  # not the job list's answer, read as a job
        assert "no job matches '' (an empty job reference)" in result.stderr
    for result in slashed:  # not "no such route: GET /v1/jobs/a/b"
        assert (result.returncode, result.stderr) == (2, "gpuhop: error: no job matches 'a/b'\n")
    assert "--env takes KEY=VALUE" in bad_env.stderr
    assert "not submitted: name: name must be 1-128 characters" in bad_name.stderr
    assert "No such option: --frobnicate" in bad_option.stderr
    assert "was not found" not in bad_option.stderr
    assert (dashed.returncode, dashed.stderr) == (2, "gpuhop: error: No such option: -x\n")
    # Past the agent's bound: said of --limit, not as the agent's "query.limit: ...".
    too_long = shared_agent.cli("ps", "--limit", "100000", cwd=root)
    assert too_long.returncode == 2, too_long.stderr
    assert "Invalid value for '--limit'" in too_long.stderr and "query." not in too_long.stderr
    for command in (("cancel", "j"), ("sweep", "cancel", "s"), ("tf-server", "stop")):
        graceless = shared_agent.cli(*command, "--grace", "5000", cwd=root)
        assert graceless.returncode == 2, graceless.stderr
        assert "Invalid value for '--grace'" in graceless.stderr, graceless.stderr


def test_an_unknown_option_before_the_script_says_what_was_meant(shared_agent, project):
    # `sweep --gpu 1 -p a=1,2 train.py` took --gpu for the program to run: "a sweep needs -p
    # NAME=V1,V2,... or --array N"; `run --gpu 1` named no --gpus, and `run --epochs 3
    # train.py` did not say that a script's options go after it.
    root = project({"train.py": "pass\n"})
    for command in ("run", "sweep"):
        typo = shared_agent.cli(command, "--gpu", "1", "-p", "a=1,2", "train.py", "{a}", cwd=root)
        assert typo.returncode == 2, typo.stderr
        assert "Error: No such option: --gpu (Possible options: --gpus)\n" in typo.stderr
        theirs = shared_agent.cli(command, "--epochs", "3", "train.py", cwd=root)
        assert theirs.returncode == 2, theirs.stderr
        assert "Error: No such option: --epochs (the script's own options go after it: " in (
            theirs.stderr
        )
        assert f"{command} [OPTIONS] SCRIPT.py ARGS...)" in theirs.stderr


def test_sweep_show_and_cancel_take_h_for_help_as_every_command_does(shared_agent, project):
    # `gpuhop sweep show -h` said "No such option: -h": the two are parsed apart from the
    # sweep itself, and took --help only.
    root = project({})
    for sub in ("show", "cancel"):
        short = shared_agent.cli("sweep", sub, "-h", cwd=root)
        assert short.returncode == 0, short.stderr
        assert short.stdout.startswith(f"Usage: gpuhop sweep {sub} [OPTIONS] {{SWEEP}}")
        assert "-h, --help" in short.stdout
        assert short.stdout == shared_agent.cli("sweep", sub, "--help", cwd=root).stdout


def test_top_and_ps_watch_into_a_pipe_say_they_need_a_terminal(shared_agent, project):
    # Into a pipe or a file they printed nothing, and ran until killed: rich's live view
    # draws there only as it stops.
    root = project({})
    top = shared_agent.cli("top", cwd=root, timeout=30)
    assert (top.returncode, top.stdout) == (2, "")
    assert top.stderr == (
        "gpuhop: error: gpuhop top redraws a terminal's screen, and the output here is a pipe"
        " or a file: run it in a terminal, or use gpuhop ps and gpuhop gpus (--json for"
        " scripts)\n"
    )
    watch = shared_agent.cli("ps", "--watch", cwd=root, timeout=30)
    assert (watch.returncode, watch.stdout) == (2, "")
    assert "gpuhop ps --watch redraws a terminal's screen" in watch.stderr
    assert "or use gpuhop ps (--json for scripts)" in watch.stderr


def test_tf_server_start_refuses_a_wait_of_no_time_before_queueing_it(shared_agent, project):
    # --start-timeout 0 (or -1) queued the server, then failed at once "after -1s" and left
    # it running, holding its GPUs.
    root = project({})
    for seconds in ("0", "-1"):
        start = shared_agent.cli(
            "tf-server", "start", "--name", "no-wait", "--start-timeout", seconds, cwd=root
        )
        assert start.returncode == 2, start.stderr
        assert "Invalid value for '--start-timeout'" in start.stderr
    listed = json.loads(shared_agent.cli("ps", "--json", cwd=root).stdout)
    assert [j for j in listed if j["name"] == "no-wait"] == []


def test_env_rm_older_than_is_checked_here(shared_agent, project):
    # A negative --older-than came back as the agent's "query.older_than: Input should be
    # greater than or equal to 0"; with an ID and no --unused it was dropped unsaid.
    root = project({})
    negative = shared_agent.cli("env", "rm", "--unused", "--older-than", "-5", cwd=root)
    assert negative.returncode == 2, negative.stderr
    assert "Invalid value for '--older-than'" in negative.stderr
    assert "query." not in negative.stderr
    with_id = shared_agent.cli("env", "rm", "abc", "--older-than", "3", cwd=root)
    assert (with_id.returncode, with_id.stderr) == (
        2,
        "gpuhop: error: --older-than goes with --unused: gpuhop env rm --unused --older-than 3\n",
    )


def test_link_out_of_the_work_dir_is_refused(shared_agent, project, tmp_path):
    root = project({"ok.py": "pass\n"})
    (tmp_path / "secret.txt").write_text("do not send")
    (root / "data").symlink_to(tmp_path / "secret.txt")
    run = shared_agent.cli("run", "ok.py", cwd=root)
    assert run.returncode == 2
    assert "data is a link to" in run.stderr and "outside the work dir" in run.stderr
    (root / ".gpuhopignore").write_text("data\n")
    assert shared_agent.cli("run", "ok.py", cwd=root).returncode == 0


def test_logs_to_a_pipe_are_the_text_a_terminal_shows_and_raw_keeps_the_bytes(
    shared_agent, project
):
    from gpuhop.cli.termtext import render

    keras_log = (Path(__file__).parent.parent / "unit" / "data" / "keras_fit.log").read_bytes()
    replay = "import sys\nsys.stdout.buffer.write(open('k.log', 'rb').read())\n"
    root = project({"replay.py": replay})
    (root / "k.log").write_bytes(keras_log)
    job_id = shared_agent.cli("run", "--detach", "replay.py", cwd=root).stdout.strip()
    followed = shared_agent.cli("logs", "-f", job_id, text=False)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.decode() == render(keras_log)  # an unmodified Keras fit's bars
    assert b"\r" not in followed.stdout and b"\x1b" not in followed.stdout
    assert shared_agent.cli("logs", job_id, text=False).stdout == followed.stdout
    assert shared_agent.cli("logs", "--raw", job_id, text=False).stdout == keras_log


def test_detach_ps_show_logs_and_cancel(shared_agent, project):
    root = project(
        {
            "slow.py": "import time\nprint('started', flush=True)\n"
            "while True:\n    time.sleep(0.05)\n"
        }
    )
    detach = shared_agent.cli(
        "run",
        "--detach",
        "--name",
        "slowpoke",
        "-e",
        "HF_TOKEN=hf-s3cret",
        "-e",
        "LR=0.1",
        "slow.py",
        cwd=root,
    )
    assert detach.returncode == 0, detach.stderr
    job_id = detach.stdout.strip()
    assert len(job_id) == 8

    def running():
        return json.loads(shared_agent.cli("show", "--json", job_id[:6]).stdout)["state"] == (
            "running"
        )

    wait_until(running, timeout=60)
    wait_until(lambda: shared_agent.cli("logs", "slowpoke").stdout == "started\n", timeout=30)
    # `show` hides values whose names say secret, as the dashboard does; --json has them.
    shown = shared_agent.cli("show", "slowpoke").stdout
    assert "HF_TOKEN=******" in shown and "LR=0.1" in shown and "hf-s3cret" not in shown
    assert json.loads(shared_agent.cli("show", "--json", job_id).stdout)["env"]["HF_TOKEN"] == (
        "hf-s3cret"
    )
    ps = json.loads(shared_agent.cli("ps", "--json", "--state", "running").stdout)
    assert job_id in [j["id"] for j in ps]
    table = shared_agent.cli("ps").stdout
    assert "slowpoke" in table and "running" in table
    ids = shared_agent.cli("ps", "-q").stdout.splitlines()  # ids only, for `xargs`
    assert job_id in ids and all(len(i) == 8 and i.isalnum() for i in ids), ids

    cancel = shared_agent.cli("cancel", "slowpoke")
    assert cancel.returncode == 0, cancel.stderr
    assert f"job {job_id} cancelled" in cancel.stderr
    again = shared_agent.cli("cancel", job_id)
    assert again.returncode == 2 and "has already ended: cancelled" in again.stderr


# Metrics whose name and value carry terminal escapes: clear the screen, set the title.
ESCAPING_METRICS = r"""
import json, os
with open(os.environ["GPUHOP_METRICS_FILE"], "a") as f:
    f.write(json.dumps({"step": 1, "lo\x1b[2Jss": 0.5, "note": "\x1b]0;owned\x07hi\r"}) + "\n")
"""


def test_metrics_a_job_wrote_reach_ps_and_show_without_their_control_characters(
    shared_agent, project
):
    """`ps` and `show` wrote a job's metric names and values as they came, escapes and all:
    on a team agent a user's job could clear an admin's terminal, retitle it or write its
    clipboard (OSC 52) each time the admin ran `ps`. They are now shown as \\xNN."""
    root = project({"esc.py": ESCAPING_METRICS})
    ran = shared_agent.cli("run", "--name", "escapes", "esc.py", cwd=root)
    assert ran.returncode == 0, ran.stderr
    job_id = json.loads(shared_agent.cli("show", "--json", "escapes").stdout)["id"]
    styled = {**shared_agent.env, "FORCE_COLOR": "1", "COLUMNS": "400"}
    for env in (shared_agent.env, styled):  # to a pipe, and as on a terminal
        for args in (("ps",), ("show", job_id)):
            out = shared_agent.cli(*args, env=env).stdout
            assert job_id in out
            assert "\x1b[2J" not in out and "\x1b]0;" not in out and "\x07" not in out
            assert "lo\\x1b[2Jss=0.5" in out, out
            assert "note=\\x1b]0;owned\\x07hi\\x0d" in out, out
    assert "lo\\x1b[2Jss=0.5" in ran.stderr  # `run`'s own "last metrics" line


def test_wait_logs_tail_and_follow_give_the_jobs_code(shared_agent, project):
    root = project(
        {
            "count.py": "import sys\nfor i in range(1, int(sys.argv[1]) + 1):\n    print(i)\n",
            "seven.py": "import sys; print('partial'); sys.exit(7)\n",
        }
    )
    ids = [
        shared_agent.cli("run", "-d", *script, cwd=root).stdout.strip()
        for script in (("count.py", "5"), ("seven.py",), ("count.py", "40000"))
    ]
    ok, seven, long = ids
    alone = shared_agent.cli("wait", ok)
    assert alone.returncode == 0, alone.stderr
    assert f"job {ok} succeeded" in alone.stderr
    both = shared_agent.cli("wait", ok, seven)
    assert both.returncode == 7
    assert f"exit code 7, from job {seven}" in both.stderr
    assert "failed: exited with code 7" in both.stderr
    unknown = shared_agent.cli("wait", ok, "no-such-job")
    assert unknown.returncode == 2 and "no job matches 'no-such-job'" in unknown.stderr

    assert shared_agent.cli("logs", "--tail", "2", ok).stdout == "4\n5\n"
    assert shared_agent.cli("logs", "--tail", "9", ok).stdout == "1\n2\n3\n4\n5\n"
    assert shared_agent.cli("logs", "--tail", "0", ok).stdout == ""
    assert shared_agent.cli("wait", long).returncode == 0  # a log longer than a first read
    assert shared_agent.cli("logs", "--tail", "3", long).stdout == "39998\n39999\n40000\n"
    # Following an ended job ends at once, with its code, as `run` does.
    followed = shared_agent.cli("logs", "-f", "--tail", "1", seven)
    assert (followed.returncode, followed.stdout) == (7, "partial\n")
    assert shared_agent.cli("logs", "-f", ok).returncode == 0
    # There are jobs, none in the state asked for: said so, not "no jobs yet".
    lost = shared_agent.cli("ps", "-s", "lost")
    assert (lost.returncode, lost.stderr) == (
        0,
        "gpuhop: no lost jobs (gpuhop ps lists them all)\n",
    )


def test_logs_follow_tail_of_a_line_being_drawn_writes_it_once(shared_agent, project):
    """`logs -f --tail N` joined while a progress bar draws its line (frames, no newline
    yet): to a pipe that line comes out once, as its last frame, not as the tail saw it
    with the rest glued on by the follow (`step 1/3step 3/3`)."""
    root = project(
        {
            "bar.py": "import sys, time\nfrom gpuhop.runtime import artifacts_dir\n"
            "sys.stdout.write('first\\n\\rstep 1/3'); sys.stdout.flush()\n"
            "while not (artifacts_dir() / 'go').exists():\n    time.sleep(0.05)\n"
            "sys.stdout.write('\\rstep 3/3\\nend\\n')\n"
        }
    )
    job_id = shared_agent.cli("run", "-d", "bar.py", cwd=root).stdout.strip()
    with shared_agent.client() as client:
        wait_until(lambda: b"step 1/3" in b"".join(client.job(job_id).logs()), 60)
    follow = subprocess.Popen(
        [sys.executable, "-m", "gpuhop", "logs", "-f", "--tail", "2", job_id],
        env=shared_agent.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert follow.stdout is not None
    out = b""
    try:
        while b"\n" not in out:  # the tail has been read and written: the bar is mid-line
            piece = os.read(follow.stdout.fileno(), 4096)
            assert piece, follow.stderr.read() if follow.stderr else ""
            out += piece
    finally:
        (shared_agent.home / "jobs" / job_id / "artifacts" / "go").touch()
    rest, err = follow.communicate(timeout=60)
    assert (follow.returncode, out + rest) == (0, b"first\nstep 3/3\nend\n"), err


def test_cancel_of_several_jobs_cancels_each_and_names_what_it_cannot(shared_agent, project):
    root = project({"slow.py": "import time\nprint('up', flush=True)\ntime.sleep(600)\n"})
    ids = [shared_agent.cli("run", "-d", "slow.py", cwd=root).stdout.strip() for _ in range(2)]
    with shared_agent.client() as client:
        for job_id in ids:
            wait_until(lambda job_id=job_id: client.job(job_id).state.value == "running", 60)
    cancel = shared_agent.cli("cancel", "--grace", "1", ids[0], "no-such-job", ids[1])
    assert cancel.returncode == 2
    for job_id in ids:
        assert f"job {job_id} cancelled" in cancel.stderr
    assert "no job matches 'no-such-job'" in cancel.stderr
    with shared_agent.client() as client:
        assert {client.job(job_id).state.value for job_id in ids} == {"cancelled"}


def test_cancel_escalates_to_sigkill_and_reaches_every_process(shared_agent, project, tmp_path):
    # The child is known by its command line: inside the job's PID namespace its pid is
    # not the host's.
    marker = f"gpuhop-test-child-{tmp_path.name}"
    root = project(
        {
            "stubborn.py": "import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: print('ignoring SIGTERM', flush=True))\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)',"
            f" {marker!r}])\n"
            "print('ready', flush=True)\n"
            "while True:\n    time.sleep(0.05)\n"
        }
    )
    with shared_agent.client() as client:
        job = client.submit(["stubborn.py"], workdir=root)
        wait_until(lambda: b"ready" in b"".join(job.logs()), timeout=60)
        wait_until(lambda: _running(marker), timeout=30)
        info = job.cancel(grace=0.5)
        info = job.wait(timeout=30)
        log = b"".join(job.logs()).decode()
    assert info.state.value == "cancelled"
    assert "killed after the grace period" in info.reason
    assert "ignoring SIGTERM" in log
    wait_until(lambda: not _running(marker), timeout=10)


def _running(marker: str) -> bool:
    """Whether a live process (not a zombie) has `marker` in its command line."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and not _zombie(int(entry.name)):
            return True
    return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_ctrl_c_detaches_and_the_job_goes_on(shared_agent, project):
    root = project(
        {
            # Five minutes: still running when the test looks, however slow the machine;
            # cancelled at the end.
            "tick.py": "import time\nfor i in range(6000):\n    print('tick', i, flush=True)\n"
            "    time.sleep(0.05)\n"
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuhop", "run", "--name", "ticker", "tick.py"],
        cwd=root,
        env=shared_agent.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("tick")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        assert proc.returncode == 130
        assert "detached from job" in err and "gpuhop logs -f" in err
        show = json.loads(shared_agent.cli("show", "--json", "ticker").stdout)
        assert show["state"] == "running"
    finally:
        assert shared_agent.cli("cancel", "--grace", "0", "ticker").returncode == 0


def test_one_fake_gpu_is_shared_in_turn(make_agent, project):
    agent = make_agent(fake_gpus=1)
    root = project(
        {
            "gpu.py": "import os, time\nprint('CUDA_VISIBLE_DEVICES=' + "
            "os.environ['CUDA_VISIBLE_DEVICES'])\ntime.sleep(0.5)\n"
        }
    )
    first = agent.cli("run", "--detach", "--gpus", "1", "gpu.py", cwd=root).stdout.strip()
    second = agent.cli("run", "--detach", "--gpus", "1", "gpu.py", cwd=root).stdout.strip()
    with agent.client() as client:
        a, b = client.job(first).wait(60), client.job(second).wait(60)
        assert b"".join(client.job(first).logs()) == b"CUDA_VISIBLE_DEVICES=0\n"
        assert b"".join(client.job(second).logs()) == b"CUDA_VISIBLE_DEVICES=0\n"
    assert a.state.value == b.state.value == "succeeded"
    assert a.gpu_ids == b.gpu_ids == [0]
    # Each had the GPU alone: the second started only after the first had ended.
    assert b.started_at >= a.ended_at
    status = agent.cli("agent", "status")
    assert "GPUs: 0: Fake GPU (fake)" in status.stdout


def test_two_fake_gpus_run_side_by_side(make_agent, project):
    agent = make_agent(fake_gpus=2)
    root = project(
        {
            "gpu.py": "import os, time, pathlib\n"
            "pathlib.Path(os.environ['GPUHOP_JOB_ID'] + '.flag').touch()\n"
            "print(os.environ['CUDA_VISIBLE_DEVICES'])\n"
            "time.sleep(1)\n"
        }
    )
    with agent.client() as client:
        jobs = [client.submit(["gpu.py"], workdir=root, gpus=1) for _ in range(2)]
        infos = [j.wait(60) for j in jobs]
        outputs = sorted(b"".join(j.logs()).decode().strip() for j in jobs)
    assert outputs == ["0", "1"]
    assert sorted(i.gpu_ids[0] for i in infos) == [0, 1]


def test_agent_start_stop_status(make_agent, tmp_path):
    agent = make_agent()
    status = agent.cli("agent", "status", "--json")
    info = json.loads(status.stdout)
    assert info["running"] is True and info["pid"] == agent.pid and info["gpus"] == []
    again = agent.cli("agent", "start")
    assert again.returncode == 2 and "already runs" in again.stderr
    stop = agent.cli("agent", "stop")
    assert stop.returncode == 0 and f"agent {agent.pid} stopped" in stop.stderr
    assert agent.cli("agent", "status").returncode == 1
    assert not agent.paths.socket.exists()
    # The token commands start no agent: they say how to (they said only "[Errno 2] No such
    # file or directory").
    for command in (("ls",), ("create", "alice"), ("revoke", "abc")):
        token = agent.cli("agent", "token", *command)
        assert token.returncode == 2, token.stderr
        assert token.stderr.endswith(
            f"; start the agent first with `gpuhop agent start --home {agent.home}`\n"
        )


@pytest.mark.agent_log(r"NotADirectoryError: .*checkouts/boot")
def test_an_agent_that_fails_while_it_starts_is_named_by_the_command_that_started_it(tmp_path):
    """The agent takes connections only once it can answer them: one that fails while it
    opens its stores is reported with its cause by the command that started it, not as a
    connection closed on that command."""
    from tests.conftest import Agent

    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    agent.paths.ensure()
    (agent.home / "checkouts").write_text("a file where the agent keeps a directory")
    try:
        for _ in range(3):  # each command starts the agent anew, and each hears why it failed
            ps = agent.cli("ps")
            assert ps.returncode == 2, ps.stderr
            assert "the agent failed to start" in ps.stderr, ps.stderr
            assert "Not a directory" in ps.stderr and "checkouts/boot" in ps.stderr
            assert "Connection reset" not in ps.stderr
            # What this start logged, not the last ones', and where the whole log is.
            assert ps.stderr.count("gpuhop agent exited with code 1") == 1, ps.stderr
            assert f"(the agent's log: {agent.paths.logfile})" in ps.stderr
            assert read_pid(agent.paths) is None
        assert not agent.paths.socket.exists()
    finally:
        agent.shutdown()


def test_commands_that_start_the_agent_at_once_share_one(tmp_path):
    """Six first commands at once: one agent starts; the others' agents find it running,
    and each command waits for it to answer."""
    from tests.conftest import Agent

    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    try:
        argv = [sys.executable, "-m", "gpuhop", "ps"]
        procs = [
            subprocess.Popen(argv, env=agent.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(6)
        ]
        for proc in procs:
            _out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            assert b"no jobs yet" in err
        assert read_pid(agent.paths) is not None
        log = agent.paths.logfile.read_text()
        assert log.count(" serving ") == 1, log
    finally:
        agent.shutdown()


def test_first_command_starts_the_embedded_agent(tmp_path, project):
    """With no agent running, `gpuhop run` starts one on demand and reuses it afterwards."""
    from tests.conftest import Agent

    root = project({"hi.py": "print('hi')\n"})
    agent = Agent(tmp_path / "home", tmp_path / "cache", None)
    try:
        first = agent.cli("run", "hi.py", cwd=root)
        assert (first.returncode, first.stdout) == (0, "hi\n"), first.stderr
        pid = json.loads(agent.cli("agent", "status", "--json").stdout)["pid"]
        second = agent.cli("run", "hi.py", cwd=root)
        assert second.stdout == "hi\n"
        assert json.loads(agent.cli("agent", "status", "--json").stdout)["pid"] == pid
        assert os.stat(agent.paths.socket).st_mode & 0o777 == 0o600
    finally:
        agent.shutdown()


def test_remote_add_leaves_an_explicitly_chosen_default(shared_agent, tmp_path):
    env = {**shared_agent.env, "GPUHOP_CONFIG_DIR": str(tmp_path / "config")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = shared_agent.cli(*args, env=env)
        assert done.returncode == 0, done.stderr
        return done

    def default() -> str | None:  # as stored: 'local' once chosen, None before any choice
        return json.loads((tmp_path / "config" / "remotes.json").read_text()).get("default")

    cli("remote", "add", "first", "ssh://host-a")  # no default chosen yet: the first is it
    assert default() == "first"
    cli("remote", "default", "local")
    cli("remote", "add", "second", "ssh://host-b")
    assert default() == "local"
    cli("ps")  # answered by this machine's agent, as chosen
    cli("remote", "default", "second")
    cli("remote", "add", "third", "ssh://host-c")
    assert default() == "second"
