"""What a launch leaves behind, read back (gpuwork/launch_output.py): torchrun's failure
summary, each rank's exit code and the root cause."""

from preflight.gpuwork import launch_output


def test_torchrun_summary_parsing():
    lines = [
        "Failures:", "[1]:", "  time      : 2026-11-22_01:34:44", "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -9 (pid: 8084)", "Root Cause (first observed failure):", "[0]:",
        "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 8083)",
    ]  # fmt: skip
    assert launch_output.torchrun_exits(lines) == {1: -9, 0: 1}
    assert launch_output.torchrun_exits(["no summary here"]) == {}


def test_torchrun_root_cause_is_read():
    lines = ["Root Cause (first observed failure):", "[1]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 1)"]
    assert launch_output.torchrun_root_cause(["[0]:", "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 2)", *lines]) == 1
    assert launch_output.torchrun_root_cause(["nothing"]) is None
