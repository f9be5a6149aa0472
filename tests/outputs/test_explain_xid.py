"""`preflight explain` of a kernel log: each Xid/SXid event `preflight xid --from`
lists, as findings by severity naming the GPU, a PCIe notice in the same log
judged as the pcie-notice kind judges it, and the same refusal of a non-log."""

import json

import pytest
from conftest import FIXTURES
from typer.testing import CliRunner

from preflight.base.errors import UsageError
from preflight.cli.app import app
from preflight.outputs.explain import explain_xid, xid_text
from preflight.outputs.explain.explained import render
from preflight.readers.kernel import xid

XID = FIXTURES / "xid"
PCIE = FIXTURES / "pcie_notice" / "pcie_01_dmesg-limited-by-16GTs-x16_h100-capable-32GTs_ELIDED.txt"
SEVERITY = {"fatal": "fail", "app": "warn", "info": "info"}


def explained(name: str):
    (path,) = XID.glob(name + "*")
    return explain_xid.explain(path.read_text(), str(path), None)


@pytest.mark.parametrize("name", sorted(p.name for p in XID.glob("*.txt")))
def test_every_event_the_xid_command_lists_is_a_finding_of_its_severity(name):
    path = XID / name
    e = explain_xid.explain(path.read_text(), str(path), None)
    r = CliRunner().invoke(app, ["xid", "--from", str(path), "--json"])
    events = json.loads(r.stdout)["events"]
    assert e.facts["events"] == events
    xid_items = [i for i in e.findings if not i.summary.startswith("PCIe link")]  # a PCIe notice is no Xid: `xid` says nothing of it
    assert any(i.severity == "fail" for i in xid_items) == (r.exit_code == 1)
    assert {(i.severity, i.gpu) for i in xid_items} == {(SEVERITY[ev["severity"]], ev["pci"]) for ev in events}


def test_the_row_remapper_xid63_fails_naming_the_gpu_and_the_reset():
    e = explained("01_")
    (f,) = e.findings
    assert (f.severity, f.gpu) == ("fail", "0000:10:1c")
    assert f.summary == "Xid 63: GPU memory row remapping / page retirement pending: active only after a GPU reset"
    assert "Row Remapper: New row marked for remapping, reset gpu to activate." in f.cause and "nvidia-smi -r" in f.fix
    assert (e.kind, e.title, e.facts["fatal"], e.facts["gpus"]) == ("kernel-log", "kernel log", 1, ["0000:10:1c"])


def test_repeats_on_one_gpu_are_one_warning_with_their_count_and_the_fatal_one_fails():
    fatal, app_level = sorted(explained("05_").findings, key=lambda i: i.severity)
    assert (fatal.severity, fatal.gpu, fatal.summary) == ("fail", "0000:cb:00", "Xid 109: context switch timeout")
    assert "CTX SWITCH TIMEOUT" in fatal.cause and "Fri Aug 30 11:43:14 2024" in fatal.cause
    assert (app_level.severity, app_level.summary) == ("warn", "Xid 13 (x3): graphics engine exception")
    assert "line 2, 3, 4" in app_level.cause


def test_a_dbe_a_failed_retirement_and_a_gpu_that_never_initialised():
    e = explained("15_")
    assert [(i.severity, i.gpu, i.summary.split(":")[0]) for i in e.findings] == [
        ("fail", "0000:0a:00", "failed to initialise (x4)"), ("fail", "0000:07:00", "Xid 48"), ("fail", "0000:07:00", "Xid 64")]
    assert e.facts["gpus"] == ["0000:07:00", "0000:0a:00"]


def test_a_finished_recovery_is_information_and_a_non_fatal_sxid_warns():
    text = ("[  5.1] NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)\n"
            + (XID / "nvswitch-multiline-sxid-record_fm-guide-layout.txt").read_text())
    e = explain_xid.explain(text, "kern.log", None)
    assert [(i.severity, i.summary.split(":")[0]) for i in e.findings] == [("info", "Xid 154"), ("warn", "SXid 12028 (nvidia-nvswitch0)")]
    assert not e.failed


def test_a_log_with_no_gpu_event_passes_and_says_how_much_it_read():
    e = explained("no-gpu-event_dmesg_dev")
    assert e.findings == [] and e.facts["events"] == [] and e.facts["kernel_lines"] == 34


def test_a_pcie_notice_in_the_same_log_is_a_finding_beside_the_xids():
    text = (XID / "01_xid63_row-remapper-new-row-marked_a100.txt").read_text() + PCIE.read_text()
    e = explain_xid.explain(text, "dmesg.txt", None)
    assert [(i.severity, i.gpu, i.summary) for i in e.findings] == [
        ("fail", "0000:10:1c", "Xid 63: GPU memory row remapping / page retirement pending: active only after a GPU reset"),
        ("fail", "0000:04:00.0", "PCIe link at 16.0 GT/s x16, capable of 32.0 GT/s x16: half the bandwidth"),
        ("fail", "0000:8b:00.0", "PCIe link at 16.0 GT/s x16, capable of 32.0 GT/s x16: half the bandwidth"),
    ]
    assert [d["device"] for d in e.facts["pcie_notices"]] == ["0000:04:00.0", "0000:8b:00.0"]


@pytest.mark.parametrize("content", ["", "hello\nworld\n", "[2026-03-18 11:13:09] some application line\n"])
def test_a_text_with_no_kernel_log_line_is_refused_in_the_xid_commands_words(tmp_path, content):
    path = tmp_path / "dmesg.txt"
    path.write_text(content)
    with pytest.raises(UsageError) as e:
        explain_xid.explain(content, str(path), None)
    r = CliRunner().invoke(app, ["xid", "--from", str(path)])
    assert r.exit_code == 2 and r.stderr == f"preflight: error: --from {e.value}\n"


def test_the_xid_command_prints_and_dumps_each_events_action():
    found = xid_text.rows(xid.parse(next(XID.glob("03_*")).read_text()))
    assert found[0]["act"] == {"action": "reboot", "domain": "node",
                               "source": "NVIDIA Xid catalog (2026-11-22): Xid 79 RESTART_BM; restart the machine"}
    assert (found[0]["bucket"], found[0]["investigate"]) == ("RESTART_BM", "CONTACT_SUPPORT")
    assert "next:   reboot [node] (NVIDIA Xid catalog (2026-11-22): Xid 79 RESTART_BM" in xid_text.describe(found, "log")


@pytest.mark.parametrize("name", sorted(p.name for p in XID.glob("*.txt")))
def test_every_xid_finding_carries_its_events_action(name):
    e = explained(name)
    events = {(ev["pci"], ev["act"]["action"], ev["act"]["domain"], ev["act"]["source"]) for ev in e.facts["events"]}
    xid_items = [i for i in e.findings if not i.summary.startswith("PCIe link")]
    assert {(i.gpu, i.action, i.domain, i.action_source) for i in xid_items} <= events
    assert all(i.action for i in xid_items)


def test_a_log_of_several_xids_acts_on_the_highest():
    e = explained("05_")  # Xid 13 x3 (RESTART_APP) and Xid 109 (RESET_GPU) on one GPU
    acts = {i.summary.split(":")[0]: (i.action, i.domain) for i in e.findings}
    assert acts == {"Xid 109": ("reset-gpu", "node"), "Xid 13 (x3)": ("fix-job", "job")}
    assert e.facts["action"] == {"action": "reset-gpu", "domain": "node", "source": "NVIDIA Xid catalog (2026-11-22): Xid 109 RESET_GPU; reset the GPU"}
    assert "next:  reset-gpu [node] (NVIDIA Xid catalog (2026-11-22): Xid 109 RESET_GPU; reset the GPU)" in render(e)
    assert "next:  fix-job [job]" in render(e)


def test_xid_154_acts_on_the_recovery_it_names_and_a_log_without_events_names_no_action():
    (reboot,) = [i for i in explained("kmsg_").findings if i.summary.startswith("Xid 154")]
    assert (reboot.action, reboot.domain) == ("reboot", "node")
    assert "action" not in explained("no-gpu-event_dmesg_dev").facts
