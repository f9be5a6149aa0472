"""The kernel's PCIe bandwidth notices: the real capture's facts (INDEX.md),
hand-made layouts of other kernels and prefixes, and what is not a notice."""

from pathlib import Path

import pytest
from conftest import FIXTURES

from preflight.readers.kernel import pcie_notice

HERE = FIXTURES / "pcie_notice"
STAS00 = HERE / "pcie_01_dmesg-limited-by-16GTs-x16_h100-capable-32GTs_ELIDED.txt"
TWO = HERE / "dmesg_two-devices-limited_gpu-x8-of-x16_nic-gen3-of-gen4_one-full_handmade.txt"
OLD = HERE / "syslog_older-kernel-speed-format_unknown-port_handmade.txt"


def facts(n: pcie_notice.Notice) -> tuple:
    return (n.device, n.available_gbps, str(n.link), n.capable_gbps, str(n.capable), n.limited_at)


def test_the_real_capture_gives_both_devices_with_their_upstream_port_across_the_elision():
    read = pcie_notice.parse(STAS00.read_text())
    assert [facts(n) for n in read.notices] == [
        ("0000:04:00.0", 252.048, "16.0 GT/s x16", 504.112, "32.0 GT/s x16", "0000:01:00.0"),
        ("0000:8b:00.0", 252.048, "16.0 GT/s x16", 504.112, "32.0 GT/s x16", "0000:87:00.0"),
    ]
    first = read.notices[0]
    assert first.limited and first.driver == "pci" and first.line == 1 and read.notices[1].line == 3
    assert (first.link.generation, first.capable.generation) == (4, 5)  # a Gen4 link on a Gen5-capable GPU
    assert read.devices == {}  # grep kept no enumeration line: nothing says what the devices are


def test_a_multi_line_dmesg_reads_each_device_and_what_its_enumeration_line_says():
    read = pcie_notice.parse(TWO.read_text())
    assert [(n.device, n.driver, n.limited, str(n.link), str(n.capable), n.limited_at) for n in read.notices] == [
        ("0000:1b:00.0", "pci", True, "16.0 GT/s x8", "32.0 GT/s x16", "0000:18:01.0"),
        ("0000:29:00.0", "mlx5_core", False, "32.0 GT/s x16", "32.0 GT/s x16", None),  # the short, full-bandwidth form
        ("0000:3b:00.0", "mlx5_core", True, "8.0 GT/s x16", "16.0 GT/s x16", "0000:3b:00.0"),
    ]
    assert read.devices["0000:1b:00.0"].label() == "NVIDIA GPU"
    assert read.devices["0000:43:00.0"].class_code == "030200"  # enumerated, printed no notice
    assert "0000:29:00.0" not in read.devices


def test_older_kernels_speed_words_a_syslog_prefix_and_an_unnamed_limiting_device():
    a, b = pcie_notice.parse(OLD.read_text()).notices
    assert facts(a) == ("0000:3b:00.0", 63.008, "8 GT/s x8", 126.016, "8 GT/s x16", "0000:3a:00.0")
    assert a.link.gts == 8.0 and a.link.generation == 3
    assert facts(b) == ("0000:5e:00.0", 2.0, "2.5 GT/s x1", 31.504, "8 GT/s x4", None)  # "at <unknown>"


def test_an_unknown_speed_is_kept_as_unknown_not_guessed():
    line = "pci 0000:02:00.0: 0.000 Gb/s available PCIe bandwidth, limited by Unknown x0 link at 0000:00:01.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)"
    (n,) = pcie_notice.parse(line).notices
    assert n.link.speed is None and n.link.gts is None and n.link.width == 0 and n.capable.gts == 16.0


def test_a_device_that_printed_twice_is_judged_by_its_last_line():
    text = STAS00.read_text().replace("16.0 GT/s PCIe x16 link at 0000:87", "8.0 GT/s PCIe x16 link at 0000:87") + \
        "[  900.1] pci 0000:8b:00.0: 252.048 Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe x16 link at 0000:87:00.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)\n"
    read = pcie_notice.parse(text)
    assert len(read.notices) == 3
    assert [(n.device, n.line, str(n.link)) for n in read.latest()] == [("0000:04:00.0", 1, "16.0 GT/s x16"), ("0000:8b:00.0", 4, "16.0 GT/s x16")]


@pytest.mark.parametrize("prefix", [
    "", "[   10.735323] ", "[Fri Aug 30 11:43:09 2024] ", "Dec  2 11:38:47 worker4 kernel: [  219.470994] ",
    "2024-08-30T11:43:09+0000 node kernel: ", "6,1234,10735323,-;", "kern  :info  : [   10.735323] ",
])
def test_looks_like_every_kernel_log_prefix(prefix):
    line = STAS00.read_text().splitlines()[0].split("] ", 1)[1]
    assert pcie_notice.looks_like(prefix + line + "\n")
    assert pcie_notice.parse(prefix + line).notices[0].device == "0000:04:00.0"


def test_looks_like_the_captures_and_not_the_other_kinds():
    for path in HERE.glob("*.txt"):
        assert pcie_notice.looks_like(path.read_text()), path.name
    assert pcie_notice.looks_like((FIXTURES / "xid" / "no-gpu-event_dmesg-pcie-limited_stas00.txt").read_text())
    others = [p for d in ("topo", "xid", "nccl", "nccltests", "df", "nvsmi", "dcgmi") for p in (FIXTURES / d).rglob("*")
              if p.is_file() and p.suffix in (".txt", ".log") and p.name != "no-gpu-event_dmesg-pcie-limited_stas00.txt"]
    assert len(others) > 40
    assert [p.name for p in others if pcie_notice.looks_like(p.read_text(errors="replace"))] == []


def test_prose_about_the_notice_is_not_one():
    assert not pcie_notice.looks_like("The kernel says 'limited by 16.0 GT/s PCIe x16 link' when a GPU trained at Gen4.\n")
    assert pcie_notice.parse("available PCIe bandwidth, limited by nothing\n").notices == []
