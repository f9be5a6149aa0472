"""`auto`'s choice of profile (preflight.pipeline.profile_detect): the pure rule and its failures."""

import pytest
from conftest import no_driver

from preflight.pipeline import profile_detect, profiles
from preflight.pipeline.profile_detect import DetectionFailed
from preflight.pipeline.profiles import Profile


def _p(name: str, *match: str, ids: tuple[str, ...] = ()) -> Profile:
    gpu = {"driver_min": "525.60.13", "driver_source": "test", "pci_device_ids": list(ids)}
    return Profile(name=name, description="", match=list(match), checks=["shm"], gpu=gpu)


CANDIDATES = {
    "h100-sxm": _p("h100-sxm", "H100 80GB HBM3", ids=("0x2330",)),
    "h100-nvl": _p("h100-nvl", "H100 NVL"),
    "any-h100": _p("any-h100", "H100"),
    "h200-sxm": _p("h200-sxm", "H200", ids=("0x2335",)),
}


def test_pick_chooses_the_most_specific_match():
    assert profile_detect.pick([("NVIDIA H100 NVL", None)] * 2, CANDIDATES)[0] == "h100-nvl"
    assert profile_detect.pick([("NVIDIA H100 80GB HBM3", "0x2330")] * 8, CANDIDATES) == (
        "h100-sxm",
        "auto: 8 x NVIDIA H100 80GB HBM3 matched profile h100-sxm by name 'H100 80GB HBM3' and PCI device id 0x2330",
    )
    assert profile_detect.pick([("NVIDIA H100 PCIe", "0x2331")], CANDIDATES)[0] == "any-h100"


def test_the_device_id_confirms_the_name():
    # "H200" is in "NVIDIA H200 NVL", but 0x233b is not the SXM board's id.
    assert profile_detect.pick([("NVIDIA H200", "0x2335")], CANDIDATES)[0] == "h200-sxm"
    with pytest.raises(DetectionFailed, match=r"no profile matches GPU model 'NVIDIA H200 NVL' \(PCI device id 0x233b\)"):
        profile_detect.pick([("NVIDIA H200 NVL", "0x233b")], CANDIDATES)
    assert profile_detect.pick([("NVIDIA H200", None)], CANDIDATES)[0] == "h200-sxm"  # the name alone, when the id is unknown
    # ... but then the pattern must end the name: an nccl-tests header names no id, and the H200 NVL is not the SXM board.
    with pytest.raises(DetectionFailed, match="no profile matches GPU model 'NVIDIA H200 NVL' \\(PCI device id unknown\\)"):
        profile_detect.pick([("NVIDIA H200 NVL", None)], CANDIDATES)


@pytest.mark.parametrize(
    "gpus, cause",
    [
        ([], "NVML reports no GPU"),
        ([("NVIDIA H100 NVL", "0x2321"), ("NVIDIA A100-SXM4-80GB", "0x20b2")], "mixed GPU models"),
        ([("Tesla T4", "0x1eb8")], "no profile matches GPU model 'Tesla T4'"),
    ],
)
def test_pick_fails_with_a_cause(gpus, cause):
    with pytest.raises(DetectionFailed, match=cause):
        profile_detect.pick(gpus, CANDIDATES)


BUILTIN_NAMES = [
    ("NVIDIA H100 80GB HBM3", "0x2330", "h100-sxm"),
    ("NVIDIA H100 PCIe", "0x2331", "h100-pcie"),
    ("NVIDIA H100 NVL", "0x2321", "h100-nvl"),
    ("NVIDIA H200", "0x2335", "h200-sxm"),
    ("NVIDIA A100-SXM4-80GB", "0x20b2", "a100-sxm4-80gb"),
    ("NVIDIA A100 80GB PCIe", "0x20b5", "a100-pcie"),
    ("NVIDIA A100-PCIE-40GB", "0x20f1", "a100-pcie"),
    ("NVIDIA GB10", None, "gb10"),
    # Drivers before R470 print no "NVIDIA " prefix; R450 named the 80GB SXM board "A100-SXM-80GB"
    # (the profiles' match comments): the same boards, the same profiles.
    ("A100-SXM-80GB", "0x20b2", "a100-sxm4-80gb"),
    ("A100-PCIE-40GB", "0x20f1", "a100-pcie"),
]


@pytest.mark.parametrize("name, device, expected", BUILTIN_NAMES)
def test_builtin_profiles_pick_every_sku_by_its_nvml_name(name, device, expected):
    builtin = {n: profiles.load(p) for n, p in profiles.available(None).items()}
    assert profile_detect.pick([(name, device)], builtin)[0] == expected


# Models no built-in profile names, as NVML and pci.ids name them: each runs under generic,
# never under another SKU's floors (H200 NVL shares "H200" with the SXM board's pattern).
UNKNOWN_MODELS = [
    ("NVIDIA L40S", "0x26b9"),
    ("NVIDIA B200", "0x2901"),
    ("Tesla T4", "0x1eb8"),
    # Look-alikes of the profiled boards (ids as the profiles' pci.ids comments give them): the
    # export H800 and A800, the 40GB and 64GB A100 SXM boards, with and without the "NVIDIA " prefix.
    ("NVIDIA H800 80GB HBM3", "0x2324"),
    ("NVIDIA A100-SXM4-40GB", "0x20b0"),
    ("A100-SXM4-40GB", "0x20b0"),
    ("NVIDIA A100-SXM-64GB", "0x20b3"),
    ("NVIDIA A800-SXM4-80GB", "0x20f3"),
]


@pytest.mark.parametrize("name, device", UNKNOWN_MODELS)
def test_builtin_profiles_run_a_sku_they_do_not_describe_under_generic_and_say_so(name, device):
    builtin = {n: profiles.load(p) for n, p in profiles.available(None).items()}
    chosen, why = profile_detect.pick([(name, device)] * 4, builtin)
    assert chosen == "generic"
    assert why == (f"auto: 4 x {name} (PCI device id {device}): no profile names this model, so profile generic: what needs no SKU "
                   "is judged, no floor of the model is; add a profile for the model (`preflight calibrate` on a healthy node measures its floors)")


def test_a_model_a_profile_names_but_not_its_pci_id_runs_under_generic_naming_that_profile():
    builtin = {n: profiles.load(p) for n, p in profiles.available(None).items()}
    chosen, why = profile_detect.pick([("NVIDIA H200 NVL", "0x233b")] * 2, builtin)
    assert chosen == "generic"
    assert why.startswith("auto: 2 x NVIDIA H200 NVL (PCI device id 0x233b): profile h200-sxm names 'NVIDIA H200 NVL' ('NVIDIA H200') "
                          "but not PCI device id 0x233b (0x2335), so profile generic: what needs no SKU is judged")


def test_a_gpu_a_driver_too_old_to_name_is_picked_by_its_pci_id_so_its_driver_floor_judges():
    builtin = {n: profiles.load(p) for n, p in profiles.available(None).items()}
    chosen, why = profile_detect.pick([("NVIDIA Graphics Device", "0x2330")] * 8, builtin)
    assert chosen == "h100-sxm" and "matched profile h100-sxm by PCI device id 0x2330" in why


def test_generic_is_never_picked_by_name_and_mixed_models_still_fail():
    builtin = {n: profiles.load(p) for n, p in profiles.available(None).items()}
    assert builtin["generic"].match == []
    assert profile_detect.pick([("NVIDIA H100 80GB HBM3", "0x2330")], builtin)[0] == "h100-sxm"
    with pytest.raises(DetectionFailed, match="mixed GPU models"):
        profile_detect.pick([("NVIDIA L40S", "0x26b9"), ("NVIDIA B200", "0x2901")], builtin)
    with pytest.raises(DetectionFailed, match="NVML reports no GPU"):
        profile_detect.pick([], builtin)


def test_a_site_generic_profile_is_the_one_auto_falls_back_to(tmp_path):
    text = profiles.find("generic", None).read_text().replace("[floors.vcpus_per_gpu]\n", "[floors.vcpus_per_gpu]\n# the site's own\n")
    text = text.replace("value = 3\n", "value = 6\n", 1)
    (tmp_path / "generic.toml").write_text(text)
    found = {n: profiles.load(p) for n, p in profiles.available(tmp_path).items()}
    assert profile_detect.pick([("NVIDIA L40S", "0x26b9")], found)[0] == "generic"
    assert found["generic"].floors["vcpus_per_gpu"].value == 6


@no_driver
def test_auto_on_a_machine_without_a_driver_fails_and_suggests_the_cpu_profile():
    with pytest.raises(DetectionFailed) as e:
        profile_detect.detect(None)
    assert "no NVIDIA driver" in e.value.cause
    assert "--profile cpu" in e.value.remedy
