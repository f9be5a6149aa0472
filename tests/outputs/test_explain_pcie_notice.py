"""`preflight explain` of kernel PCIe bandwidth notices: one finding per device,
failing where the link runs below what the device can do."""

import pytest
from conftest import FIXTURES

from preflight.base.errors import UsageError
from preflight.outputs.explain import explain_pcie_notice
from preflight.outputs.explain.explained import render

HERE = FIXTURES / "pcie_notice"


def explained(name: str):
    (path,) = HERE.glob(name + "*")
    return explain_pcie_notice.explain(path.read_text(), path.name, None)


def test_the_real_capture_fails_both_gpus_at_half_their_bandwidth():
    e = explained("pcie_01_")
    assert (e.kind, e.title) == ("pcie-notice", "kernel PCIe bandwidth notices") and e.failed
    assert [(i.severity, i.gpu, i.summary) for i in e.findings] == [
        ("fail", "0000:04:00.0", "PCIe link at 16.0 GT/s x16, capable of 32.0 GT/s x16: half the bandwidth"),
        ("fail", "0000:8b:00.0", "PCIe link at 16.0 GT/s x16, capable of 32.0 GT/s x16: half the bandwidth"),
    ]
    first = e.findings[0]
    assert "16.0 GT/s of 32.0 GT/s (Gen4 of Gen5)" in first.cause and "the link at 0000:01:00.0" in first.cause
    # The line does not say what 04:00.0 is; an x16 device cut above Gen1 in a server is a GPU, NIC or accelerator: a FAIL.
    assert "252.048 of 504.112 Gb/s" in first.cause and "an x16 device in a server is a GPU, NIC or accelerator" in first.cause
    assert "reseat" in first.fix and "BIOS PCIe link speed" in first.fix
    assert "`sudo lspci -vv -s 0000:04:00.0` LnkSta with LnkCap" in first.fix and "`sudo lspci -vv -s 0000:01:00.0`" in first.fix
    assert "when the kernel enumerated 0000:04:00.0 (line 1)," in first.cause  # the line does not say what the device is: its address alone
    (row, _) = e.facts["devices"]
    assert row == {"device": "0000:04:00.0", "what": None, "driver": "pci", "line": 1, "limited": True,
                   "available_gbps": 252.048, "capable_gbps": 504.112, "speed": "16.0 GT/s", "width": 16,
                   "capable_speed": "32.0 GT/s", "capable_width": 16, "generation": 4, "capable_generation": 5,
                   "limited_at": "0000:01:00.0", "times_printed": 1}
    assert "FAIL [0000:04:00.0] PCIe link at 16.0 GT/s x16, capable of 32.0 GT/s x16: half the bandwidth" in render(e)


def test_two_devices_limited_and_one_at_full_bandwidth():
    e = explained("dmesg_two-devices")
    gpu, full, nic = e.findings
    assert (gpu.severity, gpu.summary) == ("fail", "PCIe link at 16.0 GT/s x8, capable of 32.0 GT/s x16: a quarter of the bandwidth")
    assert "0000:1b:00.0 (NVIDIA GPU)" in gpu.cause and "16.0 GT/s of 32.0 GT/s (Gen4 of Gen5) and x8 of x16" in gpu.cause
    assert (full.severity, full.gpu) == ("info", "0000:29:00.0") and "all 504.112 Gb/s" in full.summary
    assert (nic.severity, nic.summary) == ("fail", "PCIe link at 8.0 GT/s x16, capable of 16.0 GT/s x16: half the bandwidth")
    assert "0000:3b:00.0 (mlx5_core)" in nic.cause and "its own link" in nic.cause
    assert "its slot;" in nic.fix and "(and `sudo lspci" not in nic.fix  # the device's own link: one device to look at
    assert [d["what"] for d in e.facts["devices"]] == ["NVIDIA GPU", None, None]


def test_width_alone_and_an_unnamed_limiting_device():
    width, unnamed = explained("syslog_older").findings
    assert width.severity == "fail" and width.summary == "PCIe link at 8 GT/s x8, capable of 8 GT/s x16: half the bandwidth"
    assert "ran at x8 of x16" in width.cause
    # An unidentified x4 device (NVMe, most likely) is a WARN: a fault only if it is a GPU or NIC, which the capture does not say.
    assert unnamed.severity == "warn" and "a link the kernel did not name" in unnamed.cause and "does not say what the device is" in unnamed.cause
    assert "2.5 GT/s of 8 GT/s (Gen1 of Gen3) and x1 of x4" in unnamed.cause and "6% of the bandwidth" in unnamed.summary


@pytest.mark.parametrize("text", ["", "[    0.000000] Linux version 6.8.0\n", "pci 0000:04:00.0: limited by something\n"])
def test_no_notice_is_one_line_usage_error(text):
    with pytest.raises(UsageError) as e:
        explain_pcie_notice.explain(text, "dmesg.txt", None)
    assert str(e.value).startswith("dmesg.txt: holds no kernel PCIe bandwidth notice") and "\n" not in str(e.value)


def test_a_gpu_at_gen1_speed_alone_warns_and_the_bmcs_vga_is_information():
    """GPU drivers manage link power, and a GPU probed idle can sit at 2.5 GT/s: a Gen1 speed
    alone is a WARN with how to confirm; the BMC's VGA controller is no device a job uses."""
    gpu = explain_pcie_notice.explain((FIXTURES / "pcie_notice/dmesg_gpu-probed-at-gen1-of-gen3_handmade.txt").read_text(), "gpu.txt", None)
    (item,) = gpu.findings
    assert item.severity == "warn" and "(NVIDIA GPU)" in item.cause and "read LnkSta while it works" in item.cause
    bmc = explain_pcie_notice.explain((FIXTURES / "pcie_notice/dmesg_bmc-vga-gen1-of-gen2_handmade.txt").read_text(), "bmc.txt", None)
    assert [(i.severity, i.gpu) for i in bmc.findings] == [("info", "0000:02:00.0")] and "(VGA controller)" in bmc.findings[0].cause
    assert not bmc.failed
