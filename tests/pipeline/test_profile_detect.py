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
]


@pytest.mark.parametrize("name, device, expected", BUILTIN_NAMES)
def test_builtin_profiles_pick_every_sku_by_its_nvml_name(name, device, expected):
    builtin = {n: profiles.load(p) for n, p in profiles.available(None).items()}
    assert profile_detect.pick([(name, device)], builtin)[0] == expected


def test_builtin_profiles_refuse_a_sku_they_do_not_describe():
    builtin = {n: profiles.load(p) for n, p in profiles.available(None).items()}
    with pytest.raises(DetectionFailed, match="no profile matches"):
        profile_detect.pick([("NVIDIA H200 NVL", "0x233b")], builtin)


@no_driver
def test_auto_on_a_machine_without_a_driver_fails_and_suggests_the_cpu_profile():
    with pytest.raises(DetectionFailed) as e:
        profile_detect.detect(None)
    assert "no NVIDIA driver" in e.value.cause
    assert "--profile cpu" in e.value.remedy
