"""Reading the kernel log (readers/kernel/log_sources.py): the real /dev/kmsg of this machine,
a test root, the fallbacks to journalctl and dmesg, and a wrapped ring the journal fills in."""

import json
import time
from pathlib import Path

import fakes
import pytest
from conftest import FIXTURES

from preflight.base.host import Completed, Host
from preflight.readers.kernel import journal, log_sources, xid
from preflight.readers.kernel.log_sources import KernelLogUnavailable, read_kernel_log
from preflight.readers.kernel.xid import parse

XID = FIXTURES / "xid"
JSON_LOG = FIXTURES / "journal" / "journalctl-json_xid79_xid13-bytes_forged-newline-cr-vt_handmade.txt"


# --- reading the kernel log -----------------------------------------------------

def test_the_real_dev_kmsg_is_read_quickly_and_parses():
    start = time.monotonic()
    try:
        text, source = read_kernel_log(Host(), timeout=10)
    except KernelLogUnavailable as e:  # a container without CAP_SYSLOG and no journal
        assert time.monotonic() - start < 11
        pytest.skip(f"no kernel log readable here: {e.cause}")
    assert time.monotonic() - start < 5
    assert source in ("/dev/kmsg", "/dev/kmsg + " + " ".join(log_sources.JOURNALCTL), " ".join(log_sources.JOURNALCTL), " ".join(log_sources.DMESG))
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

    monkeypatch.setattr(log_sources.os, "read", read)
    text, _ = read_kernel_log(FakeHost(tmp_path, {"journalctl": FileNotFoundError(2, "No such file or directory")}), timeout=5)
    assert [e.code for e in parse(text)] == [13, 79]


def test_kmsg_that_never_ends_stops_at_the_deadline(tmp_path, monkeypatch):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text("")
    monkeypatch.setattr(log_sources.os, "read", lambda fd, n: b"4,1,1,-;endless\n")
    start = time.monotonic()
    with pytest.raises(KernelLogUnavailable, match="deadline"):
        read_kernel_log(FakeHost(tmp_path, {}), timeout=0.3)
    assert time.monotonic() - start < 2


# ---- journalctl's output unreadable: dmesg answers, and the log says who did ---------------------------

LOG = XID / "03_xid79_one-liner_no-pid_NVSentinel-155-comment.txt"
BAD = [pytest.param(dict(prints=out), id=kind) for kind, out in fakes.BAD_OUTPUT.items()] + [
    pytest.param(dict(prints=b"", exit_code=1), id="exit-1-silent"), pytest.param(dict(hang=True), id="hang")]


@pytest.mark.parametrize("bad", BAD)
def test_an_unreadable_journalctl_hands_over_to_dmesg_within_the_deadline(tmp_path, bad):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", **bad)
    fakes.tool(bin_dir, "dmesg", prints=LOG)
    started = time.monotonic()
    log = log_sources.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
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
        log_sources.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert set(raised.value.unread) == {str(tmp_path / "root" / "dev" / "kmsg"), "journalctl", "dmesg"}
    assert "dmesg: printed no kernel log line" in raised.value.cause


def test_a_coloured_dmesg_reads_as_a_plain_one(tmp_path):
    coloured = b"".join(b"\x1b[32m" + line[:14] + b"\x1b[0m" + line[14:] for line in LOG.read_bytes().splitlines(keepends=True))
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=b"", exit_code=1)
    fakes.tool(bin_dir, "dmesg", prints=coloured)
    log = log_sources.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert parse(log.text) == parse(LOG.read_text())


# ---- printk.time=0: dmesg prints no stamp ---------------------------------------------------------------

def test_control_characters_a_user_put_in_dmesg_leave_it_a_kernel_log(tmp_path):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=b"", exit_code=1)
    fakes.tool(bin_dir, "dmesg", prints=b"[ 1.0] tmpfs: Unknown parameter 'y\x01\x0b\x1b\x7f'\n[ 2.0] NVRM: loading\n")
    log = log_sources.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
    assert log.source == "dmesg" and parse(log.text) == []


def test_a_dmesg_without_time_stamps_is_a_kernel_log(tmp_path):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=b"", exit_code=1)
    fakes.tool(bin_dir, "dmesg", prints=b"Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103)\n"
                                         b"Command line: BOOT_IMAGE=/vmlinuz root=/dev/vda1 printk.time=0\n")
    log = log_sources.read_log(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), timeout=4)
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
    log = log_sources.read_log(Host(_kmsg_root(tmp_path, KMSG.read_text()), environ={"PATH": str(bin_dir)}), timeout=4)
    assert [(e.code, e.uptime) for e in parse(log.text)] == [(48, 3.0), (79, 219.470994), (None, 219.471002), (154, 219.47105), (24007, 301.0)]
    assert log.source == str(tmp_path / "root" / "dev" / "kmsg") + " + journalctl -k -b --no-pager -o json"
    assert "ring had wrapped" in log.note and "#1201" in log.note and "1 driver line" in log.note


def test_a_wrapped_ring_without_a_journal_says_what_cannot_be_seen(tmp_path):
    log = log_sources.read_log(Host(_kmsg_root(tmp_path, KMSG.read_text()), environ={"PATH": str(tmp_path / "none")}), timeout=4)
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
    log = log_sources.read_log(Host(root, environ={"PATH": str(bin_dir)}), timeout=4)
    assert (bin_dir / "args").read_text().splitlines() == ["-k -b --no-pager -o json --until @1054005", "-k -b --no-pager -o json --until @1054000"]
    assert [e.code for e in parse(log.text)] == [48, 79, None, 154, 24007] and "reach" not in log.note and "around boot" not in log.note


def test_a_journal_vacuumed_since_boot_says_older_events_cannot_be_seen(tmp_path):
    root = _kmsg_root(tmp_path, KMSG.read_text())
    (root / "proc").mkdir()
    (root / "proc" / "stat").write_text("btime 1000000\n")
    bin_dir = _recording_journalctl(tmp_path / "bin", WRAPPED, "")  # nothing from around boot
    log = log_sources.read_log(Host(root, environ={"PATH": str(bin_dir)}), timeout=4)
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
    assert parse(log_sources.read_log(host, timeout=5).text) == []


def test_a_journal_message_that_comes_as_bytes_is_not_skipped_by_the_driver_prefilter(tmp_path):
    """An Xid line names its process, whose name any user sets: a control character in it makes
    journald give MESSAGE as an array of bytes, where "NVRM: " is not text a prefilter finds."""
    real = "NVRM: Xid (PCI:0000:5d:00): 48, pid=4242, name=py\x01thon, Ch 00000010, DBE (0x1)"
    row = json.dumps({"_SOURCE_MONOTONIC_TIMESTAMP": "3000000", "MESSAGE": list(real.encode())})
    text = journal.lines(row + "\n", xid.DRIVER_MARK)
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
    log = log_sources.read_log(Host(root, environ={"PATH": str(bin_dir)}), timeout=4)
    assert (bin_dir / "args").read_text().splitlines() == ["-k -b --no-pager -o json"] and 48 in [e.code for e in parse(log.text)]
