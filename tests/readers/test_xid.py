"""Xid / SXid parsing on recorded kernel logs, the code table, and reading the
kernel log: the real /dev/kmsg of this machine, a test root, and the fallbacks."""

import json
import os
import random
import stat
import threading
import time
from pathlib import Path

import fakes
import pytest
from conftest import FIXTURES

from preflight.base.actions import LADDER, Action, Domain, Next
from preflight.readers.kernel import journal, xid, xid_catalog
from preflight.base.errors import UsageError
from preflight.base.host import Completed, Host
from preflight.readers.kernel.xid import (
    KernelLogUnavailable,
    XidEvent,
    explain,
    parse,
    read_file,
    read_kernel_log,
)

XID = FIXTURES / "xid"
JSON_LOG = FIXTURES / "journal" / "journalctl-json_xid79_xid13-bytes_forged-newline-cr-vt_handmade.txt"


def events(name: str) -> list[XidEvent]:
    (path,) = XID.glob(name + "*")
    return parse(path.read_text(encoding="utf-8"))


def facts(e: XidEvent) -> tuple:
    return e.kind, e.code, e.pci, e.pid, e.name


# --- the shared captures: every fact INDEX.md lists ------------------------------

def test_01_xid63_row_remapper_without_prefix():
    (e,) = events("01_")
    assert facts(e) == ("xid", 63, "0000:10:1c", 1896, None)
    assert e.pci_raw == "PCI:0000:10:1c"
    assert e.message == "Row Remapper: New row marked for remapping, reset gpu to activate."
    assert (e.time, e.uptime, e.line) == (None, None, 1)
    assert e.info.severity == "fatal"


def test_03_xid79_one_liner_without_pid():
    (e,) = events("03_")
    assert facts(e) == ("xid", 79, "0000:44:00", None, None)
    assert e.message == "GPU has fallen off the bus"
    assert (e.time, e.uptime) == (None, None)
    assert e.info.severity == "fatal" and "reboot" in e.info.action


def test_05_dmesg_ctime_xid13_three_times_then_xid109_and_peermem_is_not_an_xid():
    found = events("05_")
    assert [facts(e) for e in found] == [("xid", 13, "0000:cb:00", None, None)] * 3 + [
        ("xid", 109, "0000:cb:00", 1797828, "pt_main_thread")]
    assert [e.line for e in found] == [2, 3, 4, 5]  # line 1 is the nvidia-peermem ERROR
    assert found[0].message == "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"
    assert found[1].message == "Graphics SM Global Exception on (GPC 7, TPC 7, SM 0): Multiple Warp Errors"
    assert found[2].message.startswith("Graphics Exception: ESR 0x57c730=0xc04000b")
    assert "errorString CTX SWITCH TIMEOUT, Info 0x58005" in found[3].message
    assert found[0].time == "Fri Aug 30 11:43:09 2024" and found[3].time == "Fri Aug 30 11:43:14 2024"
    assert [e.info.severity for e in found] == ["app"] * 3 + ["fatal"]


def test_15_syslog_dbe_page_retirement_and_a_second_gpu_failing_init():
    init, dbe, retire = events("15_")
    assert facts(dbe) == ("xid", 48, "0000:07:00", None, None)  # pid='<unknown>', name=<unknown>
    assert "physAddr 0x7fffa8860 partition 7, subpartition 1." in dbe.message
    assert (dbe.time, dbe.uptime) == ("Dec  2 11:38:47", pytest.approx(219.470994))
    assert facts(retire) == ("xid", 64, "0000:07:00", None, None)
    assert retire.message == ("Dynamic Page Retirement: Blacklisting failed.  "
                              "Page should have been blacklisted on boot(0x00000000007fffa8).")
    assert (init.kind, init.pci, init.pci_raw) == ("init_failed", "0000:0a:00", "0000:0a:00.0")
    assert init.message == "RmInitAdapter failed! (0x24:0x72:1568)"
    # four failed attempts: each logs "rm_init_adapter failed, device minor number 5";
    # the first attempt's RmInitAdapter line was cut from the excerpt
    assert init.count == 4
    assert (init.line, init.time, init.uptime) == (1, "Dec  2 11:38:27", pytest.approx(199.234935))
    assert {e.info.severity for e in (init, dbe, retire)} == {"fatal"}


# --- our own captures: every prefix style --------------------------------------

def test_kmsg_records_give_uptime_and_skip_continuation_lines():
    fell79, fell, recovery, sxid = events("kmsg_")
    assert facts(fell79) == ("xid", 79, "0000:3b:00", None, None)
    assert fell79.uptime == pytest.approx(219.470994) and fell79.time is None
    assert (fell.kind, fell.code, fell.pci, fell.pci_raw) == ("fell_off_bus", None, "0000:3b:00", "0000:3b:00.0")
    assert fell.uptime == pytest.approx(219.471002)
    assert recovery.code == 154 and recovery.uptime == pytest.approx(219.47105)  # flags carry caller=T1946
    assert recovery.info.severity == "fatal" and recovery.info.action.startswith("reboot the node")
    assert (sxid.kind, sxid.code, sxid.pci, sxid.name) == ("sxid", 24007, "0000:c3:00", "nvidia-nvswitch2")
    assert sxid.uptime == pytest.approx(301.0)


def test_journalctl_short_iso_with_a_mig_suffix():
    contained, fault = events("journalctl-short-iso_")
    assert facts(contained) == ("xid", 94, "0000:01:00", 7194, None)
    assert contained.pci_raw == "PCI:0000:01:00 GPU-I:05"
    assert contained.message == "Contained: CE User Channel (0x9). RST: No, D-RST: No"
    assert contained.time == "2024-08-30T11:43:09+0000" and contained.uptime is None
    assert contained.info.severity == "app"  # NVIDIA: RESTART_APP
    assert facts(fault) == ("xid", 31, "0000:2b:00", 1942, "llama-bench")
    assert fault.message.startswith("channel 0x00000002, intr 00000000. MMU Fault")


def test_journalctl_short_monotonic_has_uptime_but_no_wall_time():
    gsp, nvlink = events("journalctl-short-monotonic_")
    assert facts(gsp) == ("xid", 119, "0004:01:00", 430, "nv_queue")
    assert (gsp.time, gsp.uptime, gsp.line) == (None, pytest.approx(219.470994), 3)
    assert gsp.message == "Timeout waiting for RPC from GSP!"
    assert facts(nvlink) == ("xid", 74, "0000:c1:00", None, None)
    assert nvlink.message == "NVLink: fatal error detected on link 1"
    assert gsp.info.severity == nvlink.info.severity == "fatal"


def test_localized_month_names_are_kept_as_printed():
    dbe, nonfatal, fatal = events("journalctl-localized-month_")
    assert [e.time for e in (dbe, nonfatal, fatal)] == ["Dez  2 11:38:47", "déc. 02 11:38:49", "12月 02 11:38:50"]
    assert facts(dbe) == ("xid", 48, "0000:07:00", None, None)
    assert facts(nonfatal) == ("xid", 145, "0019:01:00", None, None)
    assert nonfatal.message.startswith("RLW_SRC_TRACK Nonfatal XC1 i0 Link 12")
    assert (nonfatal.info.severity, fatal.info.severity) == ("app", "fatal")  # as the NVLink 5 line says


def test_dmesg_caller_tag_and_recovery_action_reset():
    fault, recovery = events("dmesg-caller-tag_")
    assert facts(fault) == ("xid", 31, "0000:2b:00", 1942, "llama-bench")
    assert fault.uptime == pytest.approx(130.45625) and fault.time is None
    assert recovery.code == 154 and recovery.info.severity == "fatal"
    assert recovery.info.action.startswith("reset the GPU")


def test_sxid_severity_is_what_the_line_prints():
    fatal, nonfatal, nonfatal2, unmarked = events("sxid_")
    assert (fatal.kind, fatal.code, fatal.pci, fatal.pci_raw, fatal.name) == (
        "sxid", 24007, "0000:c3:00", "PCI:0000:c3:00.0", "nvidia-nvswitch0")
    assert fatal.message == "Fatal, Link 28 sourcetrack timeout error (First)"
    assert (nonfatal.code, nonfatal.message) == (20009, "Non-fatal, Link 04 RX Short Error Rate")
    assert (nonfatal2.code, nonfatal2.name) == (28006, "nvidia-nvswitch3")
    assert nonfatal2.uptime is None  # "[123]" has no fraction: not a dmesg time stamp
    assert (unmarked.code, unmarked.pci, unmarked.message) == (26006, "0004:00:00", "SOE HALTED")
    assert [e.info.severity for e in (fatal, nonfatal, nonfatal2, unmarked)] == ["fatal", "app", "app", "app"]
    assert "Fabric Manager" in unmarked.info.meaning


def test_fallen_off_the_bus_without_an_xid_counts_like_xid_79():
    bare, no_host = events("fell-off-bus_")
    assert (bare.kind, bare.pci, bare.time) == ("fell_off_bus", "0000:3b:00", None)
    assert (no_host.pci, no_host.time) == ("0000:2b:00", "May 18 19:02:39")
    assert bare.info == explain("xid", 79)


def test_old_driver_wording_and_xid_without_pci_prefix():
    fell, old = events("syslog_old-driver_")
    assert (fell.kind, fell.pci, fell.time, fell.uptime) == (
        "fell_off_bus", "0000:01:00", "Jan 18 11:38:05", pytest.approx(269.516977))
    assert facts(old) == ("xid", 3, "0000:01:00", None, None) and old.pci_raw == "0000:01:00"
    assert old.info.severity == "app" and "unknown Xid 3" in old.info.meaning  # a gate warns on what it cannot explain


def test_broken_lines_are_not_events_and_nothing_raises():
    assert events("garbage_") == []


def test_random_garbage_never_raises():
    rng = random.Random(1)
    pieces = ["NVRM: ", "Xid ", "(PCI:", "0000:", "3b:00", ".0", ")", ": ", "79", ", ", "pid=", "'<unknown>'",
              "name=", "SXid ", "nvidia-nvswitch1: ", "[ 1.5] ", "kernel: ", "4,1,2,-;", "\n", "\x00", "é", "("]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        for e in parse(text):
            assert e.line >= 1 and e.raw in text.split("\n")


def test_absurd_numbers_are_not_events():
    assert parse("NVRM: Xid (PCI:0000:01:00): " + "9" * 5000 + ", x\n" + "4,1," + "9" * 5000 + ",-;NVRM: x") == []
    (e,) = parse("NVRM: Xid (PCI:0000:01:00): 13, pid=" + "1" * 5000 + ", name=a, b")
    assert e.pid is None


def test_events_go_into_a_json_report():
    found = events("15_") + events("kmsg_")
    dumped = json.loads(json.dumps([e.model_dump(mode="json") for e in found]))
    assert [XidEvent.model_validate(d) for d in dumped] == found
    assert {e.info.model_dump()["severity"] for e in found} == {"fatal"}


# --- the code table -------------------------------------------------------------

@pytest.mark.parametrize("code, severity", [
    (13, "app"), (31, "app"), (43, "app"), (45, "app"), (69, "app"), (92, "app"), (94, "app"),
    (46, "fatal"), (48, "fatal"), (63, "fatal"), (64, "fatal"), (74, "fatal"), (79, "fatal"), (95, "fatal"),
    (109, "fatal"), (110, "fatal"), (119, "fatal"), (120, "fatal"), (140, "fatal"), (143, "fatal"),
    (144, "fatal"), (150, "fatal"), (158, "fatal"),
])
def test_severity_follows_the_catalog(code, severity):
    info = explain("xid", code)
    assert info.severity == severity and info.meaning and info.action


def test_fatal_actions_say_reset_reboot_or_drain():
    for code in (46, 48, 63, 64, 74, 79, 95, 109, 119, 140, 143, 145):
        assert explain("xid", code).action.startswith(("reset the GPU", "reboot the node", "drain the node"))


def test_unknown_codes_warn_and_point_at_the_catalog():
    info = explain("xid", 999)
    assert info.severity == "app"
    assert info.meaning.startswith("unknown Xid 999: look it up in NVIDIA's Xid catalog")


@pytest.mark.parametrize("target, severity", [
    ("0x0 (None)", "info"), ("0x3 (Drain P2P)", "app"), ("0x1 (GPU Reset Required)", "fatal"),
    ("0x2 (Node Reboot Required)", "fatal"), ("0x4 (Drain and Reset)", "fatal"), ("", "fatal"),
])
def test_xid_154_is_judged_by_the_action_it_names(target, severity):
    message = f"GPU recovery action changed from 0x1 (GPU Reset Required) to {target}" if target else "garbled"
    assert explain("xid", 154, message).severity == severity


def test_init_failure_is_fatal():
    assert explain("init_failed", None).severity == "fatal"


# --- the catalog's buckets and the action each asks --------------------------------

CITED = "NVIDIA Xid catalog (2026-11-22): Xid "
# Every immediate bucket the catalog's "Xids" sheet names, as it spells them.
IMMEDIATE = {"RESTART_APP", "RESET_GPU", "RESTART_BM", "RESTART_VM", "CHECK_MECHANICALS", "CONTACT_SUPPORT", "IGNORE",
             "UPDATE_SWFW", "CHECK_UVM", "XID_154", "WORKFLOW_XID_45", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
             "WORKFLOW_NVLINK5_ERR"}


@pytest.mark.parametrize("name", sorted(p.name for p in XID.glob("*.txt")))
def test_every_event_in_the_fixtures_gets_its_catalog_bucket_and_an_action(name):
    for e in events(name):
        info = e.info
        assert info.act.source and info.act.source != "not judged", (name, e.line)
        if e.kind in ("xid", "fell_off_bus"):
            code = 79 if e.kind == "fell_off_bus" else e.code
            assert info.bucket in IMMEDIATE, (name, e.line, code, info.bucket)  # never "unknown" for a fixture's code
            assert info.investigate and info.investigate != xid_catalog.UNKNOWN
            assert info.act.source.startswith(f"{CITED}{code} {info.bucket}")
        else:  # an SXid or a failed initialisation is no Xid: no bucket, and the action says where it comes from
            assert info.bucket is None and info.act.source


def test_the_catalog_rows_cover_every_code_it_lists_and_name_only_its_buckets():
    assert sorted(xid_catalog.BUCKETS) == list(range(1, 173))
    named = {b for b, _ in xid_catalog.BUCKETS.values()}
    assert named == IMMEDIATE | {"unknown"}
    assert xid_catalog.buckets(162) == ("unknown", "unknown") == xid_catalog.buckets(999) == xid_catalog.buckets(None)
    assert xid_catalog.buckets(45) == ("WORKFLOW_XID_45", "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)")
    assert xid_catalog.buckets(142) == ("CONTACT_SUPPORT", None)  # the row leaves the investigatory bucket empty


def test_every_code_preflight_explains_has_its_catalog_bucket():
    for code in xid._TABLE:
        assert explain("xid", code).bucket in IMMEDIATE, code


@pytest.mark.parametrize("code, bucket, investigate, action, domain", [
    (79, "RESTART_BM", "CONTACT_SUPPORT", Action.REBOOT, Domain.NODE),
    (48, "WORKFLOW_XID_48", "WORKFLOW_XID_48", Action.RESET_GPU, Domain.NODE),
    (54, "CHECK_MECHANICALS", "CONTACT_SUPPORT", Action.SERVICE, Domain.NODE),
    (74, "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", Action.RESET_GPU, Domain.NODE),
    (109, "RESET_GPU", "CONTACT_SUPPORT", Action.RESET_GPU, Domain.NODE),
    (151, "RESTART_VM", "CONTACT_SUPPORT", Action.REBOOT, Domain.NODE),
    (13, "RESTART_APP", "WORKFLOW_XID_13", Action.FIX_JOB, Domain.JOB),
    (31, "RESTART_APP", "WORKFLOW_XID_31", Action.FIX_JOB, Domain.JOB),
    (94, "RESTART_APP", "IGNORE (sympathetic)", Action.FIX_JOB, Domain.JOB),
    (43, "IGNORE", "CONTACT_SUPPORT", Action.WATCH, Domain.NODE),
    (45, "WORKFLOW_XID_45", "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)", Action.WATCH, Domain.NODE),
    (63, "IGNORE", "IGNORE", Action.RESET_GPU, Domain.NODE),  # the departure: "reset gpu to activate"
])
def test_each_code_takes_its_buckets_action_citing_code_bucket_and_date(code, bucket, investigate, action, domain):
    info = explain("xid", code)
    assert (info.bucket, info.investigate, info.act.action, info.act.domain) == (bucket, investigate, action, domain)
    assert info.act.source.startswith(f"NVIDIA Xid catalog (2026-11-22): Xid {code} {bucket}")


@pytest.mark.parametrize("target, action", [
    ("0x0 (None)", Action.NONE), ("0x3 (Drain P2P)", Action.WATCH), ("0x1 (GPU Reset Required)", Action.RESET_GPU),
    ("0x2 (Node Reboot Required)", Action.REBOOT), ("0x4 (Drain and Reset)", Action.RESET_GPU), ("", Action.DRAIN),
])
def test_xid_154_acts_on_the_recovery_action_it_prints(target, action):
    message = f"GPU recovery action changed from 0x1 (GPU Reset Required) to {target}" if target else "garbled"
    info = explain("xid", 154, message)
    assert (info.bucket, info.act.action, info.act.domain) == ("XID_154", action, Domain.NODE)
    assert info.act.source.startswith("NVIDIA Xid catalog (2026-11-22): Xid 154 XID_154")


def test_nvlink5_xids_act_on_the_fatal_or_non_fatal_they_print():
    fatal = explain("xid", 144, "SAW_MVB Fatal XC0 i0 Link -1 (0x00000021 0x00000002 ...)")
    nonfatal = explain("xid", 145, "RLW_REMAP Nonfatal XC0 i0 Link 02")
    assert (fatal.act.action, nonfatal.act.action) == (Action.RESET_GPU, Action.WATCH)


def test_a_code_the_catalog_lists_unused_is_watched_not_serviced_as_preflight_only_warns():
    info = explain("xid", 3)  # an older driver's code: "Unused" on Ampere and newer, CONTACT_SUPPORT
    assert (info.severity, info.bucket, info.investigate) == ("app", "CONTACT_SUPPORT", "N/A; Unused")
    assert info.act.action == Action.WATCH and "only warns" in info.act.source
    unknown = explain("xid", 165)  # listed, with prose where the bucket goes
    assert (unknown.bucket, unknown.act.action) == ("unknown", Action.WATCH)
    assert unknown.act.source.startswith("NVIDIA Xid catalog (2026-11-22): Xid 165 unknown")


def test_the_action_never_contradicts_the_severity():
    """A warning never takes the node out of service; a failure always does; information asks nothing."""
    fix_job, drain = LADDER.index(Action.FIX_JOB), LADDER.index(Action.DRAIN)
    messages = ["", "Nonfatal", "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)"]
    for code in [*range(1, 200), None]:
        for message in messages:
            info = explain("xid", code, message)
            rank = LADDER.index(info.act.action)
            assert {"app": rank <= fix_job, "fatal": rank >= drain, "info": info.act.action == Action.NONE}[info.severity], (code, message)


def test_sxids_and_failed_initialisation_act_on_what_they_print():
    assert explain("sxid", 24007, "Fatal, Link 10 ...").act.action == Action.REBOOT
    assert explain("sxid", 20009, "Non-fatal, Link 04 ...").act.action == Action.WATCH
    assert explain("sxid", 26006, "SOE HALTED").act.action == Action.WATCH
    assert explain("init_failed", None).act == Next(Action.REBOOT, Domain.NODE, explain("init_failed", None).act.source)



# --- reading the kernel log -----------------------------------------------------

def test_the_real_dev_kmsg_is_read_quickly_and_parses():
    start = time.monotonic()
    try:
        text, source = read_kernel_log(Host(), timeout=10)
    except KernelLogUnavailable as e:  # a container without CAP_SYSLOG and no journal
        assert time.monotonic() - start < 11
        pytest.skip(f"no kernel log readable here: {e.cause}")
    assert time.monotonic() - start < 5
    assert source in ("/dev/kmsg", "/dev/kmsg + " + " ".join(xid.JOURNALCTL), " ".join(xid.JOURNALCTL), " ".join(xid.DMESG))
    assert text.strip()
    parse(text)


class FakeHost(Host):
    """A test root, and commands answered from a table instead of run."""

    def __init__(self, root: Path, answers: dict[str, Completed | Exception]):
        super().__init__(root=root, environ={})
        self.answers, self.asked = answers, []

    def run(self, argv, timeout, cwd=None):
        name = Path(argv[0]).name  # the command as found on PATH
        self.asked.append((name, timeout))
        answer = self.answers[name]
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(stdout: str) -> Completed:
    return Completed((), 0, stdout, "", False)


def test_kmsg_under_a_test_root(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text((XID / "kmsg_xid79_fell-off-bus_xid154_sxid_handmade.txt").read_text())
    # Its first record is #1201: the ring has wrapped, so the journal is asked for what it lost.
    text, source = read_kernel_log(FakeHost(tmp_path, {"journalctl": FileNotFoundError(2, "No such file or directory")}), timeout=5)
    assert source == str(tmp_path / "dev" / "kmsg")
    assert [e.code for e in parse(text)] == [79, None, 154, 24007]


def test_without_kmsg_journalctl_is_asked_with_the_time_left(tmp_path):
    host = FakeHost(tmp_path, {"journalctl": ok(JSON_LOG.read_text())})
    text, source = read_kernel_log(host, timeout=5)
    assert source == "journalctl -k -b --no-pager -o json"
    assert [e.code for e in parse(text)] == [79, 13]
    assert host.asked[0][0] == "journalctl" and 0 < host.asked[0][1] <= 5


def test_an_empty_journal_is_not_a_clean_node(tmp_path):
    host = FakeHost(tmp_path, {"journalctl": ok("-- No entries --\n"), "dmesg": ok("[ 1.0] NVRM: loading\n")})
    text, source = read_kernel_log(host, timeout=5)
    assert source == "dmesg" and "NVRM" in text


def test_nothing_readable_names_every_source(tmp_path):
    host = FakeHost(tmp_path, {
        "journalctl": FileNotFoundError(2, "No such file or directory"),
        "dmesg": Completed((), 1, "", "dmesg: read kernel buffer failed: Operation not permitted\n", False),
    })
    with pytest.raises(KernelLogUnavailable) as raised:
        read_kernel_log(host, timeout=5)
    cause = raised.value.cause
    assert "kmsg: No such file or directory" in cause
    assert "journalctl: No such file or directory" in cause
    assert "dmesg: dmesg: read kernel buffer failed: Operation not permitted" in cause


def test_an_empty_kmsg_falls_back_to_the_journal(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text("")
    host = FakeHost(tmp_path, {"journalctl": ok('{"__MONOTONIC_TIMESTAMP":"1000000","MESSAGE":"Linux version"}\n')})
    assert read_kernel_log(host, timeout=5)[1].startswith("journalctl")


def test_a_command_past_its_deadline_is_a_failure(tmp_path):
    late = Completed((), None, "", "", True)
    with pytest.raises(KernelLogUnavailable, match="journalctl: timed out; dmesg: timed out"):
        read_kernel_log(FakeHost(tmp_path, {"journalctl": late, "dmesg": late}), timeout=5)


def test_kmsg_reading_survives_overwritten_records(tmp_path, monkeypatch):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text("")  # opened for real, then read through the fake below
    replies = [b"4,1,100,-;NVRM: Xid (PCI:0000:01:00): 13, a\n", BrokenPipeError(),
               b"4,9,900,-;NVRM: Xid (PCI:0000:01:00): 79, b\n", BlockingIOError()]

    def read(fd, n):
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    monkeypatch.setattr(xid.os, "read", read)
    text, _ = read_kernel_log(FakeHost(tmp_path, {"journalctl": FileNotFoundError(2, "No such file or directory")}), timeout=5)
    assert [e.code for e in parse(text)] == [13, 79]


def test_kmsg_that_never_ends_stops_at_the_deadline(tmp_path, monkeypatch):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text("")
    monkeypatch.setattr(xid.os, "read", lambda fd, n: b"4,1,1,-;endless\n")
    start = time.monotonic()
    with pytest.raises(KernelLogUnavailable, match="deadline"):
        read_kernel_log(FakeHost(tmp_path, {}), timeout=0.3)
    assert time.monotonic() - start < 2


# --- --from FILE -----------------------------------------------------------------

def usage_error(path) -> str:
    with pytest.raises(UsageError) as raised:
        read_file(path)
    message = str(raised.value)
    assert "\n" not in message and str(path) in message
    return message


def test_read_file_returns_the_text():
    assert "Xid (PCI:0000:10:1c): 63" in read_file(XID / "01_xid63_row-remapper-new-row-marked_a100.txt")


def test_read_file_replaces_bytes_that_are_not_utf8(tmp_path):
    (tmp_path / "latin1.log").write_bytes(b"Dez  2 kernel: NVRM: Xid (PCI:0000:01:00): 13, \xe9t\xe9\n")
    assert [e.message for e in parse(read_file(tmp_path / "latin1.log"))] == ["\ufffdt\ufffd"]


def test_read_file_errors_are_one_line_each(tmp_path):
    assert "no such file" in usage_error(tmp_path / "missing.log")
    assert "is a directory" in usage_error(tmp_path)
    (tmp_path / "log.gz").write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00")
    assert "not text" in usage_error(tmp_path / "log.gz")
    big = tmp_path / "huge.log"
    with big.open("wb") as f:
        f.truncate(64 * 2**20 + 1)  # sparse: costs no disk
    assert "larger than 64 MiB" in usage_error(big)
    assert "not a regular file" in usage_error(Path("/dev/null"))


def test_read_file_accepts_a_pipe(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    writer = threading.Thread(target=lambda: fifo.write_text("NVRM: Xid (PCI:0000:01:00): 79, gone\n"))
    writer.start()
    try:
        assert [e.code for e in parse(read_file(fifo))] == [79]
    finally:
        writer.join(timeout=5)


# What a kernel log line is: each form parse() reads, with a message that is no GPU event.
KERNEL_LINES = [
    "[    0.050716] CPU topo: Max. logical packages:   1",  # dmesg (this machine's)
    "[  130.456250] [ T1946] usb 1-1: new high-speed USB device number 2",  # dmesg, printk caller tag
    "<6>[    0.050716] CPU topo: Max. logical packages:   1",  # dmesg -r
    "kern  :info  : [    0.050716] CPU topo: Max. logical packages:   1",  # dmesg -x
    "[Mon Nov 23 20:46:24 2026] CPU topo: Max. logical packages:   1",  # dmesg -T (this machine's)
    "6,57,50716,-;CPU topo: Max. logical packages:   1",  # /dev/kmsg (this machine's)
    "Dec  2 11:38:27 worker4 kernel: [  199.234935] pci 0000:0a:00.0: enabling device",  # syslog (xid/15's prefix)
    "[    0.000000] worker4 kernel: Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103)",  # journalctl short-monotonic
    "2024-08-30T11:43:09+0000 gpu-node-3 kernel: mlx5_core 0000:3b:00.0: link up",  # journalctl short-iso
    "Dez 02 11:38:47 worker4 kernel: e1000e: eth0 NIC Link is Up",  # journalctl, de_DE
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",  # an excerpt without prefix: the driver's own words
]
NOT_KERNEL_LINES = [
    "",
    "# preflight",
    "`preflight xid` reads `/dev/kmsg` (falling back to `journalctl -k -b`, then",
    "-- No entries --",
    "-- Boot 5d1f0c3e2a8b4c6f9e7d1a2b3c4d5e6f --",
    "Dec  2 11:38:47 worker4 sshd[812]: Accepted publickey for root from 10.0.0.1 port 50022",  # syslog, not the kernel's
    "[2026-03-18 11:13:09] VM-16-64-ubuntu:28471:28499 [0] misc/socket.cc:537 NCCL WARN ncclSocketInit",  # NCCL's clock
    "node17:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.17<0>",
    '{"driver_version": "550.54.15", "gpus": []}',
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity",
]


@pytest.mark.parametrize("line", KERNEL_LINES)
def test_a_kernel_log_line_in_every_form_counts(line):
    assert xid.kernel_lines(line + "\n") == 1
    assert parse(line) == []  # and none of them is a GPU event


@pytest.mark.parametrize("line", NOT_KERNEL_LINES)
def test_other_lines_are_not_kernel_log_lines(line):
    assert xid.kernel_lines(line + "\n") == 0


@pytest.mark.parametrize("path", sorted(XID.glob("*.txt")), ids=lambda p: p.name[:16])
def test_every_recorded_kernel_log_is_one(path):
    assert xid.kernel_lines(read_file(path)) > 0


def test_read_file_refuses_a_file_with_no_kernel_log_line(tmp_path):
    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    assert "holds no kernel log lines (dmesg, journalctl, syslog or /dev/kmsg)" in usage_error(pyproject)
    for doc in ("README.md", "docs/explain.md"):  # docs/explain.md quotes Xid lines: a document, not a log
        assert "is a document (Markdown) that quotes captures, not a capture" in usage_error(Path(__file__).parents[2] / doc)
    (tmp_path / "empty.log").write_text("")
    assert "is empty: it holds no kernel log lines" in usage_error(tmp_path / "empty.log")
    (tmp_path / "blank.log").write_text("\n\n")
    assert "is empty" in usage_error(tmp_path / "blank.log")


def test_driver_text_quoted_inside_another_message_is_no_event():
    # Any user can put text of their own into the kernel log: a mount option tmpfs refuses is
    # quoted there (`unshare -Urm mount -t tmpfs -o "...NVRM: Xid..." none /tmp`, as nobody).
    # Only a line the driver's own text starts is the driver's.
    forged = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."
    lines = [
        f"3,4521,1234567890,-;tmpfs: Unknown parameter '{forged}'",  # /dev/kmsg
        f"Nov 26 23:10:01 gpu17 kernel: tmpfs: Unknown parameter '{forged}'",  # journalctl, syslog
        f"Nov 26 23:10:01 gpu17 kernel: tmpfs: Unknown parameter 'x kernel: {forged}'",
        f"[ 1234.567890] tmpfs: Unknown parameter '{forged}'",  # dmesg
        f"[ 1234.567890] tmpfs: Unknown parameter 'kernel: {forged}'",  # a "kernel:" of the user's own
        f"[Fri Aug 30 11:43:09 2024] tmpfs: Unknown parameter 'kernel: {forged}'",
    ]
    assert xid.parse("\n".join(lines)) == []
    real = ["3,4521,1234567890,-;" + forged, "Nov 26 23:10:01 gpu17 kernel: " + forged, "[ 1234.567890] " + forged, forged,
            "kern  :warn  : [ 1234.567890] " + forged, "kern  :warn  : " + forged,  # dmesg -x, with and without --notime
            "2024-08-30T11:43:09,123456+00:00 " + forged]  # dmesg --time-format=iso
    assert [e.code for e in xid.parse("\n".join(real))] == [79] * 7


# ---- journalctl's output unreadable: dmesg answers, and the log says who did ---------------------------

LOG = XID / "03_xid79_one-liner_no-pid_NVSentinel-155-comment.txt"
BAD = [pytest.param(dict(prints=out), id=kind) for kind, out in fakes.BAD_OUTPUT.items()] + [
    pytest.param(dict(prints=b"", exit_code=1), id="exit-1-silent"), pytest.param(dict(hang=True), id="hang")]


@pytest.mark.parametrize("bad", BAD)
def test_an_unreadable_journalctl_hands_over_to_dmesg_within_the_deadline(tmp_path, bad):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", **bad)
    fakes.tool(bin_dir, "dmesg", prints=LOG)
    started = time.monotonic()
    log = xid.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert time.monotonic() - started < 4 + 3  # journalctl had half, and the kill's grace
    assert log.source == "dmesg" and [e.code for e in parse(log.text)] == [79]
    assert set(log.unread) == {str(tmp_path / "root" / "dev" / "kmsg"), "journalctl"}
    assert log.unread["journalctl"] == {"nothing": "printed nothing", "garbage": "printed no kernel log line (garbage, or not a kernel log)",
                                        "binary": "printed no kernel log line (garbage, or not a kernel log)",
                                        "exit-1-silent": "exit 1", "hang": "timed out"}[_id(bad)]


def _id(bad: dict) -> str:
    if bad.get("hang"):
        return "hang"
    if bad.get("exit_code"):
        return "exit-1-silent"
    return next(k for k, v in fakes.BAD_OUTPUT.items() if v == bad["prints"])


def test_garbage_from_every_source_is_no_clean_log(tmp_path):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=fakes.BAD_OUTPUT["garbage"])
    fakes.tool(bin_dir, "dmesg", prints=fakes.BAD_OUTPUT["binary"])
    with pytest.raises(KernelLogUnavailable) as raised:
        xid.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert set(raised.value.unread) == {str(tmp_path / "root" / "dev" / "kmsg"), "journalctl", "dmesg"}
    assert "dmesg: printed no kernel log line" in raised.value.cause


def test_a_coloured_dmesg_reads_as_a_plain_one(tmp_path):
    coloured = b"".join(b"\x1b[32m" + line[:14] + b"\x1b[0m" + line[14:] for line in LOG.read_bytes().splitlines(keepends=True))
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=b"", exit_code=1)
    fakes.tool(bin_dir, "dmesg", prints=coloured)
    log = xid.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert parse(log.text) == parse(LOG.read_text())


# ---- a user's text inside a kernel message: CR, other line separators, continuation lines ------------

FORGED = "NVRM: Xid (PCI:0000:5d:00): 48, pid=0, DBE (0x1)"
TMPFS = "[ 1234.567890] tmpfs: Unknown parameter 'y{sep}" + FORGED + "'\n"


def test_a_cr_inside_a_message_is_content_not_a_rewritten_line(tmp_path):
    # `unshare -Urm mount -t tmpfs -o "$(printf "y\rNVRM: Xid ...")" none /tmp` as any user: dmesg
    # prints the CR raw; read as a terminal's last write it left the forged driver line alone.
    cap = TMPFS.format(sep="\r") + "[ 1234.600000] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    assert [e.code for e in parse(cap)] == [79]
    saved = tmp_path / "cap.log"
    saved.write_bytes(cap.encode())
    assert [e.code for e in parse(read_file(saved))] == [79]  # xid --from, explain
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=b"", exit_code=1)
    fakes.tool(bin_dir, "dmesg", prints=cap.encode())
    log = xid.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert log.source == "dmesg" and [e.code for e in parse(log.text)] == [79]


@pytest.mark.parametrize("sep", ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"],
                         ids=lambda c: f"U+{ord(c):04X}")
def test_only_a_line_feed_ends_a_kernel_log_line(sep):
    cap = TMPFS.format(sep=sep)
    assert parse(cap) == []
    assert xid.kernel_lines(cap) == 1
    stamped = "[    1.000000] tmpfs: Unknown parameter 'y" + sep + "[    2.000000] x'\n"
    assert xid.kernel_lines(stamped) == 1


def test_an_indented_continuation_line_is_not_the_drivers():
    # A newline inside a message: dmesg (from /dev/kmsg) and journalctl's short formats print
    # the rest indented with spaces, where the driver's own line has a stamp or starts the line.
    lines = [
        "[ 1234.567890] tmpfs: Unknown parameter 'y",
        "               " + FORGED + "'",  # dmesg
        "[ 1234.567890] gpu17 kernel: tmpfs: Unknown parameter 'y",
        "                               " + FORGED + "'",  # journalctl -o short-monotonic
        "Nov 26 23:10:01 gpu17 kernel: tmpfs: Unknown parameter 'y",
        "\t" + FORGED + "'",
    ]
    assert parse("\n".join(lines)) == []
    assert [e.code for e in parse(FORGED + "\n[ 1.0] " + FORGED + "\n")] == [48, 48]  # printk.time=0, and a stamp


def test_the_journal_keeps_each_message_whole():
    # journalctl -o json: a message counts only where MESSAGE itself starts with the driver's
    # text; one given as an array of bytes (a control character in it) is read too.
    text = xid.journal.lines(JSON_LOG.read_text())
    found = parse(text)
    assert [(e.code, e.pci, e.uptime) for e in found] == [(79, "0000:3b:00", 219.470994), (13, "0000:cb:00", 1399.9999)]
    assert xid.journal.lines(fakes.BAD_OUTPUT["garbage"].decode()) is None


def test_the_journal_answers_through_a_stand_in_journalctl(tmp_path):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=JSON_LOG)
    log = xid.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert log.source == "journalctl -k -b --no-pager -o json" and [e.code for e in parse(log.text)] == [79, 13]


def test_dmesg_through_syslog_says_message_boundaries_are_lost(tmp_path):
    # No /dev/kmsg to read (a container): dmesg reads syslog(2), which stamps every line of a
    # message. The event still counts; the log says why it may not be the driver's.
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=b"", exit_code=1)
    fakes.tool(bin_dir, "dmesg", prints=b"[ 1234.567890] tmpfs: Unknown parameter 'y\n[ 1234.567890] " + FORGED.encode() + b"'\n")
    log = xid.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert [e.code for e in parse(log.text)] == [48]
    assert log.note == xid.SYSLOG_NOTE


# ---- printk.time=0: dmesg prints no stamp ---------------------------------------------------------------

def test_control_characters_a_user_put_in_dmesg_leave_it_a_kernel_log(tmp_path):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=b"", exit_code=1)
    fakes.tool(bin_dir, "dmesg", prints=b"[ 1.0] tmpfs: Unknown parameter 'y\x01\x0b\x1b\x7f'\n[ 2.0] NVRM: loading\n")
    log = xid.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert log.source == "dmesg" and parse(log.text) == []


def test_a_dmesg_without_time_stamps_is_a_kernel_log(tmp_path):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=b"", exit_code=1)
    fakes.tool(bin_dir, "dmesg", prints=b"Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103)\n"
                                         b"Command line: BOOT_IMAGE=/vmlinuz root=/dev/vda1 printk.time=0\n")
    log = xid.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert log.source == "dmesg" and parse(log.text) == []


# ---- a ring that wrapped: the journal holds what it lost ---------------------------------------------------

KMSG = XID / "kmsg_xid79_fell-off-bus_xid154_sxid_handmade.txt"  # its first record is #1201, 5.12 s after boot
WRAPPED = FIXTURES / "journal" / "journalctl-json_ring-wrapped_xid48-at-3s_xid79-also-in-ring_handmade.txt"


def _kmsg_root(tmp_path: Path, text: str) -> Path:
    (tmp_path / "root" / "dev").mkdir(parents=True)
    (tmp_path / "root" / "dev" / "kmsg").write_text(text)
    return tmp_path / "root"


def test_a_wrapped_ring_adds_the_journals_older_events_once(tmp_path):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=WRAPPED)
    log = xid.read_log(Host(_kmsg_root(tmp_path, KMSG.read_text()), environ={"PATH": str(bin_dir)}), timeout=4)
    assert [(e.code, e.uptime) for e in parse(log.text)] == [(48, 3.0), (79, 219.470994), (None, 219.471002), (154, 219.47105), (24007, 301.0)]
    assert log.source == str(tmp_path / "root" / "dev" / "kmsg") + " + journalctl -k -b --no-pager -o json"
    assert "ring had wrapped" in log.note and "#1201" in log.note and "1 driver line" in log.note


def test_a_wrapped_ring_without_a_journal_says_what_cannot_be_seen(tmp_path):
    log = xid.read_log(Host(_kmsg_root(tmp_path, KMSG.read_text()), environ={"PATH": str(tmp_path / "none")}), timeout=4)
    assert [e.code for e in parse(log.text)] == [79, None, 154, 24007]
    assert log.source == str(tmp_path / "root" / "dev" / "kmsg")
    assert "ring had wrapped" in log.note and "cannot be seen" in log.note and "journalctl -k -b --no-pager -o json: " in log.note
    assert log.unread == {}  # a node without a journal is no reader's trouble


def test_a_ring_from_boot_asks_no_journal(tmp_path):
    whole = "6,0,0,-;Linux version 6.8.0\n" + KMSG.read_text()
    log = read_kernel_log(FakeHost(_kmsg_root(tmp_path, whole), {}), timeout=5)  # FakeHost answers no command
    assert [e.code for e in parse(log[0])] == [79, None, 154, 24007]


def _recording_journalctl(directory: Path, answer: Path, early: str) -> Path:
    """A journalctl that logs its arguments and prints ``answer``, or ``early`` for the
    around-boot question (its --until is the margin after boot)."""
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "journalctl"
    exe.write_text(f'#!/bin/sh\necho "$*" >> {directory}/args\n'
                   f'case "$*" in *"--until @1054000"*) printf %s \'{early}\';; *) cat {answer};; esac\n')
    exe.chmod(0o755)
    return directory


def test_a_wrapped_ring_asks_the_journal_only_for_what_the_ring_lost(tmp_path):
    """A node up for months keeps a big journal: only the messages up to the ring's first record
    (5.12 s after a boot at 1000000, 15 hours' margin for a clock ahead at boot) are asked for, then the hours around boot."""
    root = _kmsg_root(tmp_path, KMSG.read_text())
    (root / "proc").mkdir()
    (root / "proc" / "stat").write_text("cpu 1 2 3\nbtime 1000000\n")
    first_minute = '{"_SOURCE_MONOTONIC_TIMESTAMP":"0","MESSAGE":"Linux version 6.8.0"}\n'
    bin_dir = _recording_journalctl(tmp_path / "bin", WRAPPED, first_minute)
    log = xid.read_log(Host(root, environ={"PATH": str(bin_dir)}), timeout=4)
    assert (bin_dir / "args").read_text().splitlines() == ["-k -b --no-pager -o json --until @1054005", "-k -b --no-pager -o json --until @1054000"]
    assert [e.code for e in parse(log.text)] == [48, 79, None, 154, 24007] and "reach" not in log.note and "around boot" not in log.note


def test_a_journal_vacuumed_since_boot_says_older_events_cannot_be_seen(tmp_path):
    root = _kmsg_root(tmp_path, KMSG.read_text())
    (root / "proc").mkdir()
    (root / "proc" / "stat").write_text("btime 1000000\n")
    bin_dir = _recording_journalctl(tmp_path / "bin", WRAPPED, "")  # nothing from around boot
    log = xid.read_log(Host(root, environ={"PATH": str(bin_dir)}), timeout=4)
    assert "holds no kernel message from around boot" in log.note and "cannot be seen" in log.note


def test_a_backspace_run_in_a_journal_message_cannot_erase_its_prefix(tmp_path):
    """Any user can get a message of their own text into the kernel log (a failed mount's
    options); the JSON gives its raw bytes, and backspaces would erase the time stamp and
    "tmpfs: Unknown parameter '" in front of a forged driver line."""
    forged = "'" + "\b" * 60 + "NVRM: Xid (PCI:0000:5d:00): 79, pid=0, GPU has fallen off the bus."
    row = json.dumps({"_SOURCE_MONOTONIC_TIMESTAMP": "12345678", "MESSAGE": f"tmpfs: Unknown parameter {forged}"})
    text = journal.lines(row + "\n")
    assert "\\x08" in text and "\b" not in text
    assert parse(text) == []
    host = FakeHost(tmp_path, {"journalctl": ok(row + "\n" + '{"_SOURCE_MONOTONIC_TIMESTAMP":"1000","MESSAGE":"Linux version 6.8.0"}\n')})
    assert parse(xid.read_log(host, timeout=5).text) == []


def test_a_journal_message_that_comes_as_bytes_is_not_skipped_by_the_driver_prefilter(tmp_path):
    """An Xid line names its process, whose name any user sets: a control character in it makes
    journald give MESSAGE as an array of bytes, where "NVRM: " is not text a prefilter finds."""
    real = "NVRM: Xid (PCI:0000:5d:00): 48, pid=4242, name=py\x01thon, Ch 00000010, DBE (0x1)"
    row = json.dumps({"_SOURCE_MONOTONIC_TIMESTAMP": "3000000", "MESSAGE": list(real.encode())})
    text = journal.lines(row + "\n", xid._MARK)
    assert [e.code for e in parse(text)] == [48]


def test_a_journal_read_cut_short_by_the_deadline_is_no_log_at_all():
    rows = "".join(json.dumps({"_SOURCE_MONOTONIC_TIMESTAMP": str(i), "MESSAGE": "x"}) + "\n" for i in range(5000))
    with pytest.raises(journal.CutShort):
        journal.lines(rows, None, deadline=time.monotonic() - 1)


def test_an_impossible_boot_time_asks_the_journal_everything_rather_than_raise(tmp_path):
    root = _kmsg_root(tmp_path, KMSG.read_text())
    (root / "proc").mkdir()
    (root / "proc" / "stat").write_text("btime nan\n")
    bin_dir = _recording_journalctl(tmp_path / "bin", WRAPPED, "")
    log = xid.read_log(Host(root, environ={"PATH": str(bin_dir)}), timeout=4)
    assert (bin_dir / "args").read_text().splitlines() == ["-k -b --no-pager -o json"] and 48 in [e.code for e in parse(log.text)]
