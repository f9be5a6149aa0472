"""`preflight explain` on saved `nvidia-smi -q` captures: the cuda check's judge
gives the findings, named by the GPU the capture prints."""

import json
from pathlib import Path

import pytest
from conftest import FIXTURES

from preflight.base.errors import UsageError
from preflight.outputs.explain import explain_nvsmi
from preflight.pipeline import profiles

NVSMI = FIXTURES / "nvsmi"


def explain(prefix: str, profile=None):
    (path,) = NVSMI.glob(prefix + "*")
    return explain_nvsmi.explain(path.read_text(), path.name, profile)


def seen(e) -> list[tuple[str, str | None, str]]:
    return [(i.severity, i.gpu, i.summary) for i in e.findings]


def profile(name: str):
    return profiles.resolve(profiles.load(profiles.find(name, None)), Path(f"{name}.toml"), {}, "test")


def test_q01_pending_remap_fails_named_by_its_bus_id():
    e = explain("q_01_")
    assert (e.kind, e.title, e.failed) == ("nvidia-smi-q", "nvidia-smi -q", True)
    assert seen(e) == [("fail", "00000000:10:1C.0", "GPU 00000000:10:1C.0: row remap pending")]
    assert "nvidia-smi -r -i 00000000:10:1C.0" in e.findings[0].fix  # a paste has no index; -i takes the bus id
    assert "GPU 0 " not in e.findings[0].cause + e.findings[0].fix
    gpu = e.facts["gpus"][0]
    assert gpu["ecc"]["volatile_correctable"] == 177 and gpu["remapped_rows"]["pending"] is True
    assert gpu["unjudged"]["pcie_width"] == "not in the capture"
    json.dumps(e.to_json())


def test_q04_power_brake_fails_the_gpu_the_fragment_does_not_name():
    e = explain("q_04_")
    assert seen(e) == [("fail", None, "the GPU: power brake active")]
    assert e.facts["gpus"][0]["clocks_events_active"] == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert set(e.facts["gpus"][0]["unjudged"]) == {"ecc_volatile_uncorrectable", "remapped_rows", "retired_pages_pending", "pcie_width", "pcie_generation"}


def test_q08_clean_baseline_has_nothing_to_say():
    e = explain("q_08_")
    assert e.findings == []
    assert e.facts["gpus"][0]["unjudged"]["pcie_generation"].startswith("not at work when captured (P0, 0 % utilization, Idle reason active)")


def test_q10_width_8x_of_16x_fails_and_gen1_of_5_at_p8_idle_is_not_a_finding():
    e = explain("q_10_")
    assert seen(e) == [("fail", "00000000:02:00.0", "GPU 00000000:02:00.0: PCIe link x8 of x16"),
                       ("info", "00000000:02:00.0", "GPU 00000000:02:00.0: PCIe Gen1 of Gen5 not judged")]
    assert "P8, 0 % utilization" in e.findings[1].cause
    unjudged = e.facts["gpus"][0]["unjudged"]
    assert unjudged["remapped_rows"] == "printed N/A: this GPU does not remap rows"
    assert unjudged["ecc_volatile_uncorrectable"] == "printed N/A or blank"


def test_old_narrow_layout_judges_ecc_retired_pages_generation_under_load_and_thermal():
    e = explain("q_hand_v100-418_")
    assert seen(e) == [
        ("fail", "00000000:3B:00.0", "GPU 00000000:3B:00.0: uncorrectable ECC errors"),
        ("fail", "00000000:3B:00.0", "GPU 00000000:3B:00.0: page retirement pending"),
        ("fail", "00000000:3B:00.0", "GPU 00000000:3B:00.0: PCIe Gen2 of Gen3 under load"),  # P0 at 97 %: the link should be at Gen3
        ("warn", "00000000:D8:00.0", "GPU 00000000:D8:00.0: thermal slowdown"),
    ]


def test_d_ecc_output_judges_ecc_alone():
    e = explain("q_hand_h100-535_-d-ECC")
    assert seen(e) == [("fail", "00000000:2A:00.0", "GPU 00000000:2A:00.0: uncorrectable ECC errors")]
    assert e.facts["gpus"][0]["unjudged"]["pcie_width"] == "not in the capture"


def test_gpus_of_a_fragment_with_no_gpu_line_are_named_by_their_order():
    text = "        Pending Page Blacklist            : No\n        Pending Page Blacklist            : Yes\n"
    e = explain_nvsmi.explain(text, "paste", None)
    assert seen(e) == [("fail", "GPU #2 of the fragment", "GPU #2 of the fragment: page retirement pending")]
    assert "-i N" in e.findings[0].fix


def test_generation_is_judged_only_when_the_gpu_was_at_work():
    base = ("GPU 00000000:18:00.0\n    Performance State : {state}\n    Clocks Event Reasons\n        Idle : {idle}\n"
            "    PCI\n        GPU Link Info\n            PCIe Generation\n                Max : 5\n                Current : 3\n"
            "            Link Width\n                Max : 16x\n                Current : 16x\n")
    at_work = base.format(state="P0", idle="Not Active") + "    Utilization\n        Gpu : 88 %\n"
    assert [i.summary for i in explain_nvsmi.explain(at_work, "x", None).findings] == ["GPU 00000000:18:00.0: PCIe Gen3 of Gen5 under load"]
    for idle in (base.format(state="P8", idle="Not Active"), base.format(state="P0", idle="Active"), at_work.replace("88 %", "0 %")):
        assert [i.severity for i in explain_nvsmi.explain(idle, "x", None).findings] == ["info"]


def test_a_profile_adds_only_what_the_cuda_judge_takes():
    a100 = profile("a100-sxm4-80gb")
    assert explain("q_08_", a100).findings == []  # its SKU, memory and driver
    wrong = explain("q_10_", a100)
    assert ("fail", None, "NVIDIA GeForce RTX 5090 is not this profile's GPU") in seen(wrong)
    # A fragment without its header: the driver floor is not judged, the rest is.
    assert seen(explain("q_04_", a100)) == [("fail", None, "the GPU: power brake active")]


def test_damaged_capture_is_a_usage_error():
    with pytest.raises(UsageError, match="no nvidia-smi -q field"):
        explain_nvsmi.explain("==============NVSMI LOG==============\nnothing here\n", "bad.txt", None)


GREP_A3 = """    Remapped Rows
        Correctable Error                 : 1
        Uncorrectable Error               : 0
        Pending                           : Yes
"""


def test_a_grep_a3_of_remapped_rows_with_pending_yes_fails_and_says_failure_was_cut():
    # `nvidia-smi -q | grep -A3 "Remapped Rows"` drops the fourth line (Remapping Failure Occurred).
    e = explain_nvsmi.explain(GREP_A3, "grep.txt", None)
    assert seen(e) == [("fail", None, "the GPU: row remap pending")]
    assert "0 uncorrectable, 1 correctable rows remapped" in e.findings[0].cause
    assert e.facts["gpus"][0]["unjudged"]["remapped_rows"] == "failure not in the capture"


def test_pending_alone_fails_and_its_unknown_counts_are_said_unknown():
    e = explain_nvsmi.explain("    Remapped Rows\n        Pending : Yes\n", "x", None)
    assert seen(e) == [("fail", None, "the GPU: row remap pending")]
    assert "counts not in the capture" in e.findings[0].cause and "0 uncorrectable" not in e.findings[0].cause
    assert e.facts["gpus"][0]["unjudged"]["remapped_rows"] == "correctable, uncorrectable, failure not in the capture"


def test_a_section_the_capture_cut_is_not_called_printed_na():
    # ECC Mode printed, its counters cut by the paste: nothing was printed N/A.
    text = "GPU 00000000:18:00.0\n    ECC Mode\n        Current : Enabled\n        Pending : Enabled\n"
    assert explain_nvsmi.explain(text, "x", None).facts["gpus"][0]["unjudged"]["ecc_volatile_uncorrectable"] == "not in the capture"


MIXED = """Driver Version                            : 555.42.02
Attached GPUs                             : 4
GPU 00000000:68:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    PCI
        Device Id                         : 0x20B210DE
        Bus Id                            : 00000000:68:00.0
[...]
GPU 00000000:B8:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    ECC Errors
        Volatile
            DRAM Uncorrectable            : 0
"""


def test_an_elided_paste_is_not_mixed_models_for_a_device_id_it_cut():
    assert explain_nvsmi.explain(MIXED, "x", None).findings == []
    no_name = MIXED.replace("    Product Name                          : NVIDIA A100-SXM4-80GB\n    ECC", "    ECC")
    assert explain_nvsmi.explain(no_name, "x", None).findings == []  # a GPU of unknown model is no other model
    other = MIXED.replace("A100-SXM4-80GB\n    ECC", "H100 80GB HBM3\n    ECC")
    assert [i.summary for i in explain_nvsmi.explain(other, "x", None).findings] == ["mixed GPU models"]


def test_one_snapshots_hw_slowdown_without_a_cut_clock_is_a_warn_saying_how_to_confirm():
    e = explain("q_hand_grep-3-lines")
    assert seen(e) == [("warn", None, "the GPU: HW slowdown active in one snapshot")]
    assert "every reading" not in e.findings[0].cause and "one snapshot" in e.findings[0].cause
    assert "nvidia-smi -q -d PERFORMANCE" in e.findings[0].fix


def test_hw_slowdown_at_work_with_the_clock_at_full_speed_is_a_warn_and_cut_in_half_a_fail():
    text = ("GPU 00000000:18:00.0\n    Performance State : P0\n    Clocks Event Reasons\n        Idle : Not Active\n"
            "        HW Slowdown : Active\n    Clocks\n        SM : {sm} MHz\n    Max Clocks\n        SM : 1410 MHz\n")
    assert seen(explain_nvsmi.explain(text.format(sm=1400), "x", None)) == [
        ("warn", "00000000:18:00.0", "GPU 00000000:18:00.0: HW slowdown active in one snapshot")]
    (fail,) = explain_nvsmi.explain(text.format(sm=600), "x", None).findings
    assert (fail.severity, fail.summary) == ("fail", "GPU 00000000:18:00.0: hardware slowdown active")
    assert "every reading" not in fail.cause and "600 MHz of 1410 MHz" in fail.cause
    idle = text.format(sm=600).replace("P0", "P8")
    assert [i.severity for i in explain_nvsmi.explain(idle, "x", None).findings] == ["warn"]


def test_parse_errors_name_the_file():
    with pytest.raises(UsageError, match=r"^smi_attached\.txt: no nvidia-smi -q field"):
        explain_nvsmi.explain("Attached GPUs                             : 8\n", "smi_attached.txt", None)


def test_dcgmi_parse_errors_name_the_file():
    from preflight.outputs.explain import explain_dcgmi
    with pytest.raises(UsageError, match=r"^diag\.txt: no dcgmi diag result"):
        explain_dcgmi.explain("+----+\n| nothing |\n", "diag.txt", None)


def test_a_mig_gpu_pasted_without_its_gpu_line_fails_on_mig_alone_never_on_a_mig_devices_memory():
    """Was: each MIG Device's `FB Memory Usage` read as a GPU's, so the paste held three GPUs, two of
    40448 MiB: "less memory than the SKU" beside the MIG finding."""
    (path,) = NVSMI.glob("q_hand_h100-580_MIG-on_*")
    lines = path.read_text().splitlines()
    block = lines[lines.index("GPU 00000000:18:00.0") + 1:lines.index("GPU 00000000:2A:00.0")]
    for text in (path.read_text(), "\n".join(block) + "\n"):
        e = explain_nvsmi.explain(text, path.name, profile("h100-sxm"))
        assert {s for _, _, s in seen(e)} <= {"GPU 00000000:18:00.0: MIG enabled", "GPU 00000000:2A:00.0: MIG enabled"}
        assert all(sev == "fail" for sev, _, _ in seen(e)) and seen(e)


def test_a_driver_610_capture_s_power_cap_is_judged_from_its_ceiling_sub_section():
    e = explain("q_hand_h100-610_")
    assert seen(e) == [("warn", "00000000:06:00.0", "GPU 00000000:06:00.0: power capped")]
    assert "500 W, below its default 700 W" in e.findings[0].cause
