"""`nvidia-smi -q` read on recorded captures of every layout (tests/fixtures/nvsmi,
INDEX facts as expectations) and on the hand-made layouts no capture has."""

import pytest
from conftest import FIXTURES

from preflight.base.errors import UsageError
from preflight.readers.nvidia import dcgmi, nvsmi

NVSMI = FIXTURES / "nvsmi"


def read(prefix: str) -> str:
    (path,) = NVSMI.glob(prefix + "*")
    return path.read_text()


def parse(prefix: str) -> nvsmi.SmiCapture:
    return nvsmi.parse(read(prefix))


# --- the shared captures: every fact INDEX.md lists ------------------------------

def test_q01_old_four_line_ecc_and_a_pending_remap_around_elisions():
    c = parse("q_01_")
    assert (c.driver_version, c.cuda_version, c.attached_gpus, c.elided) == ("510.73.08", "11.6", 8, True)
    (g,) = c.gpus
    assert (g.bus_id, g.product_name) == ("00000000:10:1C.0", "NVIDIA A100-SXM4-80GB")
    assert (g.ecc.volatile_correctable, g.ecc.aggregate_correctable) == (177, 177)
    assert (g.ecc.volatile_uncorrectable, g.ecc.aggregate_uncorrectable) == (0, 0)
    assert g.ecc.counters["volatile DRAM Correctable"] == 177
    assert "volatile SRAM Uncorrectable" in g.ecc.counters  # not split into Parity / SEC-DED
    assert g.retired_pages.model_dump() == {"single_bit": None, "double_bit": None, "pending": None}  # N/A: A100 remaps rows
    assert "retired" not in g.not_printed  # printed, as N/A
    assert g.remapped_rows.model_dump() == {"correctable": 1, "uncorrectable": 0, "pending": True, "failure": False}


def test_q04_de_indented_paste_with_throttle_reasons_and_no_gpu_line():
    (g,) = parse("q_04_").gpus
    assert g.bus_id is None
    assert g.events_active == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert g.clocks_events["hw_thermal_slowdown"] is False and g.clocks_events["sw_power_cap"] is False
    assert g.clocks_mhz == {"graphics": 382, "sm": 382, "memory": 877}
    assert {"ecc", "remap", "retired", "pcie"} <= set(g.not_printed)


def test_q08_clean_baseline_of_a_new_driver():
    c = parse("q_08_")
    assert (c.timestamp, c.driver_version, c.cuda_version, c.attached_gpus) == (None, "555.42.02", "12.5", 4)
    (g,) = c.gpus
    assert (g.bus_id, g.pci_device_id, g.performance_state, g.utilization_gpu_pct) == ("00000000:68:00.0", "0x20b2", "P0", 0)
    assert (g.ecc.mode, g.ecc.volatile_uncorrectable, g.ecc.aggregate_correctable) == (True, 0, 0)
    assert g.remapped_rows.model_dump() == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert g.pcie.model_dump() == {"gen_max": 4, "gen_current": 4, "gen_device_max": 4, "gen_host_max": 5, "width_max": 16, "width_current": 16}
    assert g.events_active == ["gpu_idle"]  # `Clocks Event Reasons`, the new name
    assert (g.power_draw_w, g.power_limit_w, g.power_default_limit_w) == (59.77, 500.0, 500.0)
    assert (g.memory_total_mib, g.persistence_mode, g.mig_mode) == (81920, True, False)
    assert g.not_printed == []


def test_q10_one_line_remapped_rows_na_blank_values_and_narrow_link():
    c = parse("q_10_")
    assert (c.driver_version, c.cuda_version, c.attached_gpus) == ("570.124.06", "12.8", 1)
    (g,) = c.gpus
    assert (g.bus_id, g.product_name) == ("00000000:02:00.0", "NVIDIA GeForce RTX 5090")
    assert (g.pcie.gen_max, g.pcie.gen_current, g.pcie.width_max, g.pcie.width_current) == (5, 1, 16, 8)
    assert (g.performance_state, g.events_active) == ("P8", ["sw_power_cap"])
    assert g.ecc.mode is None and g.ecc.volatile_uncorrectable is None and set(g.ecc.counters.values()) == {None}
    assert g.remapped_rows_na and g.remapped_rows.pending is None
    assert g.power_draw_w == 24.05  # only `Average Power Draw` on this driver


# --- hand-made layouts (tests/fixtures/nvsmi/SOURCE.md) --------------------------

def test_old_narrow_padding_reads_throttle_reasons_bit_totals_and_retired_pending():
    text = read("q_hand_v100-418_")
    colons = {line.index(" : ") + 1 for line in text.splitlines() if " : " in line and not line.startswith("GPU ")}
    assert colons == {36}, "the fixture must keep the old driver's narrow padding"
    c = nvsmi.parse(text)
    assert (c.driver_version, [g.bus_id for g in c.gpus]) == ("418.40.04", ["00000000:3B:00.0", "00000000:D8:00.0"])
    bad, hot = c.gpus
    assert (bad.ecc.volatile_correctable, bad.ecc.volatile_uncorrectable) == (3, 2)  # Single / Double Bit totals
    assert bad.retired_pages.model_dump() == {"single_bit": 1, "double_bit": 2, "pending": True}
    assert (bad.pcie.gen_current, bad.pcie.gen_max, bad.utilization_gpu_pct) == (2, 3, 97)
    assert bad.power_limit_w == 250.0
    assert hot.events_active == ["hw_slowdown", "hw_thermal_slowdown"] and hot.temperature_c == 84


def test_a_d_ecc_section_output_reads_ecc_only():
    c = parse("q_hand_h100-535_-d-ECC")
    assert [(g.bus_id, g.ecc.volatile_uncorrectable, g.ecc.volatile_correctable) for g in c.gpus] == [
        ("00000000:18:00.0", 0, 0), ("00000000:2A:00.0", 2, 12)]
    assert set(c.gpus[1].not_printed) == {"retired", "remap", "pcie", "reasons", "perf", "clocks", "power"}


def test_a_grep_fragment_is_one_gpu_with_no_name():
    (g,) = parse("q_hand_grep-3-lines").gpus
    assert g.bus_id is None and g.events_active == ["hw_slowdown"]


def test_a_grepped_fact_seen_again_is_the_next_gpu():
    text = "        Pending Page Blacklist            : No\n        Pending Page Blacklist            : Yes\n"
    assert [g.retired_pages.pending for g in nvsmi.parse(text).gpus] == [False, True]


def test_an_ambiguous_key_without_its_section_is_not_taken():
    # `grep Pending` also prints MIG Mode's and Driver Model's Pending: which one is this?
    with pytest.raises(UsageError, match="no nvidia-smi -q field"):
        nvsmi.parse("        Pending                           : Yes\n")


def test_tabs_for_padding_read_as_spaces():
    (g,) = nvsmi.parse("GPU 00000000:18:00.0\n\tRemapped Rows\n\t\tPending\t\t: Yes\n\t\tRemapping Failure Occurred\t: No\n").gpus
    assert (g.remapped_rows.pending, g.remapped_rows.failure) == (True, False)


# --- MIG on: a GPU instance's block inside the GPU's -----------------------------
# The fixture's layout and its sources: tests/fixtures/nvsmi/SOURCE_q_hand_h100-580_MIG-on.md (a driver 580
# capture from a MIG-enabled RTX PRO 6000 puts `MIG Device` with its own `FB Memory Usage` at the GPU's top
# level, before the GPU's own; a driver 610 capture gives the whole MIG Device block).

MIG = "q_hand_h100-580_MIG-on_"


def _gpu0_lines() -> list[str]:
    lines = read(MIG).splitlines()
    return lines[lines.index("GPU 00000000:18:00.0") + 1:lines.index("GPU 00000000:2A:00.0")]


def test_mig_on_each_gpu_reads_its_own_memory_not_a_mig_devices():
    c = parse(MIG)
    assert (c.driver_version, c.cuda_version, c.attached_gpus) == ("580.105.06", "13.0", 2)
    assert [(g.bus_id, g.product_name, g.memory_total_mib, g.mig_mode) for g in c.gpus] == [
        ("00000000:18:00.0", "NVIDIA H100 80GB HBM3", 81559, True), ("00000000:2A:00.0", "NVIDIA H100 80GB HBM3", 81559, True)]
    for g in c.gpus:
        assert g.utilization_gpu_pct is None and "perf.utilization" in g.printed_na  # N/A with MIG on
        assert (g.ecc.mode, g.ecc.volatile_uncorrectable, g.ecc.aggregate_uncorrectable) == (True, 0, 0)
        assert g.remapped_rows.model_dump() == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
        assert (g.pcie.gen_current, g.pcie.gen_max, g.pcie.width_current, g.pcie.width_max) == (5, 5, 16, 16)
        assert g.events_active == ["gpu_idle"] and len(g.clocks_events) == 9  # the Counters' `0 us` lines are no reasons
        assert (g.power_limit_w, g.power_default_limit_w, g.persistence_mode) == (700.0, 700.0, True)
        assert g.not_printed == []


def test_a_mig_gpu_pasted_without_its_gpu_line_is_one_gpu_with_its_own_memory():
    # Unfixed, each MIG Device's `FB Memory Usage` Total was this GPU's memory, and the next one seen
    # started another GPU: three GPUs, two of 40448 MiB (under an H100 profile's floor: FAIL).
    (g,) = nvsmi.parse("\n".join(_gpu0_lines()) + "\n").gpus
    assert (g.bus_id, g.product_name, g.memory_total_mib, g.mig_mode) == ("00000000:18:00.0", "NVIDIA H100 80GB HBM3", 81559, True)
    assert g.not_printed == []


def test_a_paste_cut_before_the_gpus_own_memory_has_no_memory_not_a_mig_devices():
    lines = _gpu0_lines()
    cut = lines[:lines.index("    Accounting Mode                       : Disabled")]  # name, MIG Mode, both MIG Devices
    (g,) = nvsmi.parse("\n".join(cut) + "\n").gpus
    assert (g.product_name, g.mig_mode, g.memory_total_mib) == ("NVIDIA H100 80GB HBM3", True, None)


def test_the_header_above_a_block_without_its_gpu_line_is_no_section_of_it():
    lines = read(MIG).splitlines()
    header = lines[:lines.index("GPU 00000000:18:00.0")]
    c = nvsmi.parse("\n".join(header + _gpu0_lines()) + "\n")
    (g,) = c.gpus
    assert (c.attached_gpus, g.bus_id, g.product_name, g.memory_total_mib) == (2, "00000000:18:00.0", "NVIDIA H100 80GB HBM3", 81559)


def test_a_vgpus_block_in_nvidia_smi_vgpu_q_is_not_the_gpus():
    # `nvidia-smi vgpu -q` nests each vGPU's FB Memory Usage and Utilization under its `vGPU ID` line
    # (layout of a public capture from a driver 580 host, stored-index file id 66050694460; values invented).
    text = ("GPU 00000001:C8:00.0\n"
            "    Active vGPUs                          : 1\n"
            "    vGPU ID                               : 3251637554\n"
            "        vGPU Name                         : NVIDIA RTX Pro 6000 Blackwell DC-3Q\n"
            "        GPU Instance ID                   : N/A\n"
            "        FB Memory Usage\n"
            "            Total                         : 3072 MiB\n"
            "            Used                          : 128 MiB\n"
            "        Utilization\n"
            "            GPU                           : 12 %\n")
    # Unfixed, this read as the GPU's: 3072 MiB of memory at 12 %. None of it is the GPU's own.
    with pytest.raises(UsageError, match="no nvidia-smi -q field"):
        nvsmi.parse(text)


@pytest.mark.parametrize("text", ["", "Filesystem  Size  Used Avail Use% Mounted on\nshm  64M  0  64M  0% /dev/shm\n",
                                  "==============NVSMI LOG==============\n\nSomething Else                        : 1\n"])
def test_a_capture_with_no_field_the_reader_knows_is_refused(text):
    with pytest.raises(UsageError, match="no nvidia-smi -q field"):
        nvsmi.parse(text)


# --- telling the kinds apart ----------------------------------------------------

def _captures(*dirs: str) -> list:
    return [p for d in dirs for p in sorted((FIXTURES / d).glob("*")) if p.is_file() and p.suffix in (".txt", ".log")]


@pytest.mark.parametrize("path", [p for p in _captures("nvsmi") if p.name.startswith("q_")], ids=lambda p: p.name[:24])
def test_every_nvidia_smi_layout_looks_like_one_and_not_like_dcgmi(path):
    text = path.read_text()
    assert nvsmi.looks_like(text) and not dcgmi.looks_like(text)


@pytest.mark.parametrize("path", _captures("topo", "xid", "nccl", "nccltests", "df") + [p for p in _captures("nvsmi") if p.name.startswith("dcgmi_")],
                         ids=lambda p: f"{p.parent.name}/{p.name[:24]}")
def test_other_kinds_do_not_look_like_nvidia_smi(path):
    assert not nvsmi.looks_like(path.read_text(errors="replace"))


def test_de_indented_and_grepped_sections_look_like_nvidia_smi():
    assert nvsmi.looks_like("Volatile\n    SRAM Correctable              : 0\n")
    assert nvsmi.looks_like("Clocks Event Reasons\n    Idle                              : Active\n")
    assert nvsmi.looks_like("    Remapped Rows                         : N/A\n")
    assert not nvsmi.looks_like("Clocks\nGraphics: 1 MHz\n")  # a section name and nothing of nvidia-smi's shape under it


@pytest.mark.parametrize("line, want", [
    ("Driver Version                            : 580.95.05", ("Driver Version", "580.95.05")),
    ("Clocks Event Reasons", None), ("FB Memory Usage :", ("FB Memory Usage", None)),
    ("Timestamp : Sat Nov 28 19:32:16 2026", ("Timestamp", "Sat Nov 28 19:32:16 2026")),
    ("GPU 00000000:10:1C.0", None), (": value", None),
    ("a" + " " * 20000 + "b", None),  # split, not backtracked: a long line of spaces costs one pass
])
def test_a_line_is_split_into_key_and_value_at_its_first_colon_before_a_space(line, want):
    assert nvsmi._key_value(line) == want


# --- driver 610: the power limits in a `GPU Ceiling Power Limit` sub-section ---------------
# NVIDIA's nvidia-smi documentation of that driver places Current / Requested / Default Power
# Limit under `GPU Ceiling Power Limit` (and the Base Power trio under `GPU Base Power`) inside
# `GPU Power Readings`; the fixture's sources are in tests/fixtures/nvsmi/SOURCE.md.

def test_driver_610_power_limits_are_read_from_the_gpu_ceiling_power_limit_sub_section():
    c = parse("q_hand_h100-610_")
    assert c.driver_version == "610.43.03"
    assert [(g.bus_id, g.power_draw_w, g.power_limit_w, g.power_default_limit_w) for g in c.gpus] == [
        ("00000000:06:00.0", 78.83, 500.0, 700.0), ("00000000:2A:00.0", 80.12, 700.0, 700.0)]
    assert all("power" not in g.not_printed for g in c.gpus)


def test_a_module_s_or_base_power_s_limits_are_never_the_gpu_s():
    # Module Power Readings prints the same key names (N/A here); GPU Base Power its own trio.
    text = ("GPU 00000000:06:00.0\n    Product Name : NVIDIA H100\n    GPU Power Readings\n        GPU Base Power\n            Current Base Power : 300.00 W\n"
            "    Module Power Readings\n        Current Power Limit : 900.00 W\n        Default Power Limit : 1000.00 W\n")
    (g,) = nvsmi.parse(text).gpus
    assert (g.power_limit_w, g.power_default_limit_w) == (None, None)


def test_older_layouts_keep_their_power_limits_beside_the_ceiling_one():
    # 595's flat `GPU Power Readings` (public capture in stackhpc/ansible-slurm-appliance#975) still reads.
    text = ("GPU 00000000:06:00.0\n    GPU Power Readings\n        Average Power Draw : 78.83 W\n"
            "        Current Power Limit : 500.00 W\n        Requested Power Limit : 700.00 W\n        Default Power Limit : 700.00 W\n")
    (g,) = nvsmi.parse(text).gpus
    assert (g.power_draw_w, g.power_limit_w, g.power_default_limit_w) == (78.83, 500.0, 700.0)


def test_a_grep_of_the_ceiling_sub_section_is_a_capture_and_reads_the_limits():
    # `nvidia-smi -q | grep -A3 "GPU Ceiling Power Limit"`: no GPU line, no header.
    text = ("        GPU Ceiling Power Limit\n            Current Power Limit                        : 500.00 W\n"
            "            Requested Power Limit                      : 500.00 W\n            Default Power Limit                        : 700.00 W\n")
    assert nvsmi.looks_like(text)
    (g,) = nvsmi.parse(text).gpus
    assert (g.power_limit_w, g.power_default_limit_w) == (500.0, 700.0)
