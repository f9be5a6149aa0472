"""Xid / SXid parsing on recorded kernel logs, `--from FILE` and what a kernel log line is,
and a user's text inside a kernel message (readers/kernel/xid.py). The code table is
test_xid_meaning.py; reading the node's kernel log is test_log_sources.py."""

import json
import os
import random
import stat
import threading
from pathlib import Path

import fakes
import pytest
from conftest import FIXTURES

from preflight.readers.kernel import journal, log_sources, xid
from preflight.base.errors import UsageError
from preflight.base.host import Host
from preflight.readers.kernel.xid import (
    XidEvent,
    parse,
    read_file,
)
from preflight.readers.kernel.xid_meaning import explain

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
    "kern  :info  : 2026-11-28T03:29:55,205429+00:00 eth0: renamed from p0-df58c2",  # dmesg -x --time-format=iso (this machine's)
    "2026-11-28T03:29:55,205429+00:00 eth0: renamed from p0-df58c2",  # dmesg --time-format=iso (this machine's)
    "kern  :info  : eth0: renamed from p0-df58c2",  # dmesg -x -t (this machine's)
    "1725018005.123456 node1 kernel: nvidia: loading out-of-tree module taints kernel.",  # journalctl -o short-unix
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
    "2026-03-18T11:13:09.123Z INFO train.py step 100 loss 2.31",  # an application's ISO stamp
    "2026-03-18T11:13:09+0000 node17 sshd[812]: Accepted publickey for root",  # journalctl short-iso, not the kernel's
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
    log = log_sources.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
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
    text = journal.lines(JSON_LOG.read_text())
    found = parse(text)
    assert [(e.code, e.pci, e.uptime) for e in found] == [(79, "0000:3b:00", 219.470994), (13, "0000:cb:00", 1399.9999)]
    assert journal.lines(fakes.BAD_OUTPUT["garbage"].decode()) is None


def test_the_journal_answers_through_a_stand_in_journalctl(tmp_path):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=JSON_LOG)
    log = log_sources.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert log.source == "journalctl -k -b --no-pager -o json" and [e.code for e in parse(log.text)] == [79, 13]


def test_dmesg_through_syslog_says_message_boundaries_are_lost(tmp_path):
    # No /dev/kmsg to read (a container): dmesg reads syslog(2), which stamps every line of a
    # message. The event still counts; the log says why it may not be the driver's.
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=b"", exit_code=1)
    fakes.tool(bin_dir, "dmesg", prints=b"[ 1234.567890] tmpfs: Unknown parameter 'y\n[ 1234.567890] " + FORGED.encode() + b"'\n")
    log = log_sources.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert [e.code for e in parse(log.text)] == [48]
    assert log.note == log_sources.SYSLOG_NOTE


def test_dmesg_x_with_iso_stamps_reads_the_event_and_its_time():
    # util-linux writes `-x`'s facility and level before the `--time-format=iso` stamp: a prefix
    # read in one order only left the line a message of someone else's, and a GPU gone read as clean.
    events = parse(read_file(XID / "dmesg-x-iso_xid79_fell-off-bus_handmade-prefix.txt"))
    assert [(e.kind, e.code, e.pci, e.time) for e in events] == [
        ("xid", 79, "0000:44:00", "2024-08-30T11:43:09,123456+00:00"),
        ("fell_off_bus", None, "0000:44:00", "2024-08-30T11:43:10,000001+00:00")]


def test_dmesg_x_t_and_short_unix_times_are_the_times_printed():
    forged = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."
    assert parse("kern  :warn  : [Fri Aug 30 11:43:09 2024] " + forged)[0].time == "Fri Aug 30 11:43:09 2024"
    assert parse("1725018189.123456 node1 kernel: " + forged)[0].time == "1725018189.123456"


def test_a_capture_saved_with_a_byte_order_mark_reads_its_first_line(tmp_path):
    # PowerShell's Out-File and Notepad write one; a capture is handed over, not printed by the tool.
    saved = tmp_path / "xid.log"
    saved.write_bytes(b"\xef\xbb\xbf" + (XID / "03_xid79_one-liner_no-pid_NVSentinel-155-comment.txt").read_bytes())
    assert [(e.code, e.pci) for e in parse(read_file(saved))] == [(79, "0000:44:00")]
