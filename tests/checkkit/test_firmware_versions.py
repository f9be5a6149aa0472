"""One firmware version across the members of each board (preflight/checkkit/firmware_versions.py):
the boards read from recorded sysfs trees (tests/fixtures/firmware), the judge on versions
given by hand and FakeNvml files with the VBIOS lines of real `nvidia-smi -q` output."""

from pathlib import Path

from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.checkkit import firmware_versions as firmware  # the tests' bodies as they were in tests/checks/test_firmware.py
from preflight.readers.nvidia.nvml import FakeNvml

NVML = Path(__file__).parents[1] / "fixtures" / "nvml"
BOARDS = Path(__file__).parents[1] / "fixtures" / "firmware"
FAIL = Status.FAIL


def test_a_split_with_no_majority_names_every_group():
    inv = FakeNvml(NVML / "h100-sxm-8x-fabric-completed.json")
    values = {g.index: "G520.0200.00.05" if g.index < 4 else "G520.0200.00.03" for g in inv.gpus}
    (f,), _ = firmware.judge_uniform("InfoROM image", values, None, "inforom_version")
    assert f.summary == "GPUs on 2 InfoROM image versions"
    assert "GPU 0-3 on G520.0200.00.05; GPU 4-7 on G520.0200.00.03" in f.cause


def test_gpu_boards_are_read_from_sysfs_and_trusted_only_for_nvmls_gpu():
    inv = FakeNvml(NVML / "h100-sxm-gpu6-vbios-odd.json")
    assert firmware.boards(Host(BOARDS / "hgx-h100-one-board"), inv) == ({i: "10de:16c1" for i in range(8)}, {})
    # The RTX 4090 tree at the H100s' addresses: nothing there is NVML's GPU, so no board is known.
    known, why = firmware.boards(Host(BOARDS / "rtx4090-two-boards"), inv)
    assert set(known.values()) == {None} and why[0] == "/sys/bus/pci/devices/0000:1b:00.0/vendor unreadable"
    l40s = FakeNvml(NVML / "l40s-2x.json")  # device 0x26b9 where sysfs says 0x2684
    assert firmware.boards(Host(BOARDS / "rtx4090-two-boards"), l40s)[1][0] == (
        "/sys/bus/pci/devices/0000:21:00.0 is 0x10de:0x2684, not NVML's GPU 0x10de:0x26b9")


def test_a_gpu_of_one_board_left_behind_still_fails_on_a_node_of_two_boards():
    values = {0: "95.02.3C.00.A1", 1: "95.02.3C.00.A1", 2: "95.02.3C.00.9F", 3: "95.02.18.80.87"}
    boards = {0: "10de:16c1", 1: "10de:16c1", 2: "10de:16c1", 3: "10de:16c0"}
    (f,), _ = firmware.judge_uniform("VBIOS", values, None, "vbios_version", boards=boards)
    assert (f.status, f.summary) == (FAIL, "GPU 2 on another VBIOS than the other 2 of board 10de:16c1")
    assert "GPU 2 95.02.3C.00.9F; the other 2 GPUs of board 10de:16c1 run VBIOS 95.02.3C.00.A1" in f.cause and "nvfwupd" in f.remedy


def test_a_site_pin_written_in_lowercase_hex_holds_the_vbios_nvml_prints_in_uppercase():
    # settings.py accepts vbios_version in either case ("96.00.a5.00.01"); NVML prints the same
    # hex digits in uppercase. The same version in another case is no GPU off the pin.
    values = {i: "96.00.A5.00.01" for i in range(8)}
    assert firmware.judge_uniform("VBIOS", values, "96.00.a5.00.01", "vbios_version") == ([], None)
    (f,), _ = firmware.judge_uniform("VBIOS", values, "96.00.a5.00.03", "vbios_version")
    assert f.summary == "VBIOS not the site's 96.00.a5.00.03 on GPU 0-7"
