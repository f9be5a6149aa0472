"""`dcgmi diag` tables read on a recorded fragment (tests/fixtures/nvsmi, INDEX facts
as expectations) and on tables drawn as dcgmi/Diag.cpp draws them."""

import pytest
from conftest import FIXTURES

from preflight.base.errors import UsageError
from preflight.readers.nvidia import dcgmi, nvsmi

NVSMI = FIXTURES / "nvsmi"
THERMAL = ("GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds into the test for GPU 0 Verify that the "
           "cooling on this machine is functional, including external, thermal material interface, fans, and any other components.")


def parse(prefix: str) -> dcgmi.DcgmDiag:
    (path,) = NVSMI.glob(prefix + "*")
    return dcgmi.parse(path.read_text())


def test_dcgmi_01_fail_on_gpu0_and_the_warning_joined_back_mid_word():
    d = parse("dcgmi_01_")
    assert [(r.test, r.status, r.gpu) for r in d.results] == [("GPU Memory", "pass", n) for n in range(1, 8)] + [("GPU Memory", "fail", 0)]
    (m,) = d.messages
    assert (m.kind, m.gpu, m.test) == ("warning", 0, "GPU Memory")
    assert m.text == THERMAL  # "second" + "s started", "GP" + "U 0": cut at 45 characters, joined as cut


def test_a_pass_only_run_has_results_and_no_message():
    d = parse("dcgmi_hand_diag-r1")
    assert {r.status for r in d.results} == {"pass"} and len(d.results) == 9 and d.messages == []
    assert {r.category for r in d.results} == {"Deployment"}
    assert d.metadata["DCGM Version"] == "3.3.9"


def test_dcgm4_rows_per_gpu_and_a_labelled_warning_keep_a_space_that_ended_a_piece():
    d = parse("dcgmi_hand_diag-r2_dcgm4")
    assert [(r.test, r.status, r.gpu) for r in d.results if r.test == "pcie"] == [("pcie", "fail", None), ("pcie", "pass", 0), ("pcie", "fail", 1)]
    (m,) = d.messages
    assert (m.kind, m.gpu, m.category) == ("warning", 1, "Integration")
    assert m.text.startswith("Detected more than 8 PCIe replays per minute for GPU 1 : 13 Reconnect PCIe card.")


def _row(name: str, info: str) -> str:
    return "| " + name.ljust(25) + " | " + info.ljust(46) + " |"


def test_a_message_that_fills_its_last_row_does_not_swallow_the_next_gpu_row():
    text = "\n".join([_row("pcie", "Fail"), _row("", "GPU0: Fail"), _row("Warning: GPU0", "x" * 45), _row("", "GPU1: Pass")])
    d = dcgmi.parse(text)
    assert [m.text for m in d.messages] == ["x" * 45]
    assert [(r.status, r.gpu) for r in d.results] == [("fail", None), ("fail", 0), ("pass", 1)]


def test_an_error_row_continued_with_a_leading_space():
    # The rows as stas00/ml-engineering compute/accelerator/nvidia/debug.md quotes them (a repeating Xid 64).
    text = ("|-----  Deployment  --------+------------------------------------------------|\n"
            "| Error                     | GPU 3 has uncorrectable memory errors and row  |\n"
            "|                           |  remappings are pending                        |\n")
    (m,) = dcgmi.parse(text).messages
    assert (m.kind, m.gpu, m.text) == ("error", 3, "GPU 3 has uncorrectable memory errors and row remappings are pending")


def test_a_failed_run_line_is_an_error():
    (m,) = dcgmi.parse("Error: Diagnostic could not be run while DCGM is paused.\n").messages
    assert m.kind == "error" and "paused" in m.text


@pytest.mark.parametrize("text", ["", "+---+\n| a | b |\n", "Filesystem  Size  Used\n"])
def test_no_result_row_is_refused(text):
    with pytest.raises(UsageError, match="no dcgmi diag result"):
        dcgmi.parse(text)


def _captures(*dirs: str) -> list:
    return [p for d in dirs for p in sorted((FIXTURES / d).glob("*")) if p.is_file() and p.suffix in (".txt", ".log")]


@pytest.mark.parametrize("path", [p for p in _captures("nvsmi") if p.name.startswith("dcgmi_")], ids=lambda p: p.name[:24])
def test_every_dcgmi_table_looks_like_one(path):
    assert dcgmi.looks_like(path.read_text())


@pytest.mark.parametrize("path", _captures("topo", "xid", "nccl", "nccltests", "df") + [p for p in _captures("nvsmi") if p.name.startswith("q_")],
                         ids=lambda p: f"{p.parent.name}/{p.name[:24]}")
def test_other_kinds_do_not_look_like_dcgmi(path):
    assert not dcgmi.looks_like(path.read_text(errors="replace"))
    assert not (nvsmi.looks_like(path.read_text(errors="replace")) and path.parent.name != "nvsmi")
