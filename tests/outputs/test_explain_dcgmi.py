"""`preflight explain` on saved `dcgmi diag` tables: every failure and warning is a
finding in DCGM's own words, naming the GPU."""

import json

import pytest
from conftest import FIXTURES

from preflight.base.errors import UsageError
from preflight.outputs.explain import explain_dcgmi

NVSMI = FIXTURES / "nvsmi"


def explain(prefix: str):
    (path,) = NVSMI.glob(prefix + "*")
    return explain_dcgmi.explain(path.read_text(), path.name, None)


def test_dcgmi_01_memory_failure_on_gpu0_and_dcgms_thermal_warning_whole():
    e = explain("dcgmi_01_")
    assert (e.kind, e.title) == ("dcgmi-diag", "dcgmi diag")
    fail, warn = e.findings
    assert (fail.severity, fail.gpu, fail.summary) == ("fail", "GPU 0", "GPU Memory failed on GPU 0")
    assert "GPUs 1, 2, 3, 4, 5, 6, 7 passed it" in fail.cause
    assert (warn.severity, warn.gpu) == ("warn", "GPU 0")
    assert warn.cause == ("GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds into the test for GPU 0 Verify that "
                          "the cooling on this machine is functional, including external, thermal material interface, fans, and any other components.")
    assert e.facts["tests"]["GPU Memory"] == {"category": None, "status": "fail", "gpus": {"pass": [1, 2, 3, 4, 5, 6, 7], "fail": [0]}}
    json.dumps(e.to_json())


def test_a_pass_only_run_has_nothing_to_say():
    e = explain("dcgmi_hand_diag-r1")
    assert e.findings == [] and not e.failed
    assert e.facts["metadata"]["Driver Version Detected"] == "550.127.05"


def test_dcgm4_failure_names_the_gpu_row_not_the_summary_row():
    e = explain("dcgmi_hand_diag-r2_dcgm4")
    assert [(i.severity, i.gpu, i.summary.split(":")[0]) for i in e.findings] == [
        ("fail", "GPU 1", "pcie failed on GPU 1"), ("warn", "GPU 1", "DCGM warning on GPU 1 (pcie)")]
    assert e.findings[1].cause.endswith("If issue is on the board, run the field diagnostic.")


def test_a_software_failure_says_to_fix_the_setting_and_skips_are_information():
    row = lambda name, info: "| " + name.ljust(25) + " | " + info.ljust(46) + " |"  # noqa: E731
    text = "\n".join(["|-----  Deployment  --------+------------------------------------------------|",
                      row("Persistence Mode", "Fail"), row("Error", "Persistence mode for GPU 0 is disabled."),
                      "+-----  Stress  ------------+------------------------------------------------+", row("Targeted Power", "Skip - All")])
    e = explain_dcgmi.explain(text, "x", None)
    assert [(i.severity, i.summary) for i in e.findings] == [
        ("fail", "Persistence Mode failed"), ("fail", "DCGM error on GPU 0 (Persistence Mode): Persistence mode for GPU 0 is disabled."),
        ("info", "DCGM skipped: Targeted Power")]
    assert e.findings[0].fix.startswith("fix the setting DCGM names")


def test_a_table_with_no_result_is_a_usage_error():
    with pytest.raises(UsageError, match="no dcgmi diag result"):
        explain_dcgmi.explain("+---------------------------+\n", "x", None)
