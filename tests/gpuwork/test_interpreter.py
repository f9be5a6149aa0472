"""Is --python a Python at all (preflight/gpuwork/interpreter.py)? Asked of real executables.
The nccl check's answer through the CLI is in tests/checks/test_nccl.py."""

from __future__ import annotations

import sys

from preflight.base.findings import Status
from preflight.gpuwork import interpreter


def test_a_python_answers_with_its_version_and_is_not_judged():
    answer = interpreter.ask(sys.executable)
    assert answer.returncode == 0 and answer.version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert interpreter.judge(sys.executable, answer, "torchrun ended") is None


def test_a_program_that_exits_at_once_is_named_with_its_exit_status():
    fail = interpreter.judge("/bin/false", interpreter.ask("/bin/false"), "torchrun ended (exit 1) before any rank started")
    assert fail.status == Status.FAIL and fail.summary == "/bin/false is not a Python interpreter"
    assert "/bin/false exited 1 with no output; torchrun ended (exit 1)" in fail.cause and "--python" in fail.remedy


def test_a_script_that_prints_something_else_is_named_with_what_it_printed(tmp_path):
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho not a python\n")
    script.chmod(0o755)
    fail = interpreter.judge(str(script), interpreter.ask(str(script)), "the worker ended")
    assert f"{script} exited 0, printing 'not a python'" in fail.cause


def test_a_file_that_cannot_be_run_says_why(tmp_path):
    answer = interpreter.ask(str(tmp_path / "gone"))
    assert answer.returncode is None and answer.output.startswith("could not be started: ")
    assert "could not be started" in interpreter.judge(str(tmp_path / "gone"), answer, "x").cause
