"""The h2d and d2h floors fitted to the host's PCIe link (preflight/checkkit/host_link.py):
a card in an older or narrower slot is the host's design, not a slow node."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.checkkit import host_link
from preflight.pipeline import profiles
from preflight.pipeline.profiles import SiteFloor
from preflight.readers.nvidia.nvml import FakeNvml

NVML = Path(__file__).parents[1] / "fixtures" / "nvml" / "h100-sxm-8x-healthy.json"


def profile(name: str, site: dict | None = None) -> profiles.ResolvedProfile:
    path = profiles.find(name, Path("/nonexistent"))
    return profiles.resolve(profiles.load(path), path, site or {}, f"--profile {name}")


def node(gen_max: int | None, width_max: int | None = 16, gpus: int = 8):
    inv = FakeNvml(NVML)
    cut = [g.model_copy(update={"pcie": g.pcie.model_copy(update={"gen_max": gen_max, "width_max": width_max})}) for g in inv.gpus[:gpus]]
    return inv.model_copy(update={"gpus": cut})


def test_an_h100_pcie_in_a_gen4_server_is_held_to_half_the_gen5_floor():
    # Dell's R750xa, a Gen4 host, takes H100 PCIe cards: about 25 GB/s host copies, healthy.
    p = profile("h100-pcie")
    floors, said = host_link.fit(dict(p.floors), p.gpu, node(4))
    assert floors["h2d_bandwidth"].value == pytest.approx(24e9) and floors["d2h_bandwidth"].value == pytest.approx(24e9)
    assert said == "this host's PCIe link is Gen4 x16 (NVML's maximum for GPU and slot), the SKU's Gen5 x16: h2d and d2h floors x0.50"
    assert floors["h2d_bandwidth"].source.endswith(said) and floors["hbm_copy_bandwidth"] == p.floors["hbm_copy_bandwidth"]


@pytest.mark.parametrize("name, gen, width", [("h100-sxm", 5, 16), ("a100-pcie", 4, 16), ("h200-sxm", 6, 16), ("h100-pcie", None, 16), ("h100-pcie", 5, None)])
def test_the_sku_s_whole_link_or_an_unknown_one_leaves_the_floors_as_they_are(name, gen, width):
    p = profile(name)
    assert host_link.fit(dict(p.floors), p.gpu, node(gen, width)) == (dict(p.floors), None)


def test_a_narrow_slot_counts_as_well_as_an_old_one():
    p = profile("a100-sxm4-80gb")
    floors, said = host_link.fit(dict(p.floors), p.gpu, node(4, 8))
    assert "Gen4 x8" in said and floors["h2d_bandwidth"].value == pytest.approx(p.floors["h2d_bandwidth"].value / 2)


def test_gpus_of_uneven_links_a_link_below_gen3_x8_or_a_vm_keep_the_sku_s_floor():
    # One GPU in a narrower slot must not lower the bar of the seven beside it.
    p = profile("h100-pcie")
    uneven = node(4)
    uneven.gpus[3] = uneven.gpus[3].model_copy(update={"pcie": uneven.gpus[3].pcie.model_copy(update={"width_max": 8})})
    assert host_link.fit(dict(p.floors), p.gpu, uneven) == (dict(p.floors), None)
    assert host_link.fit(dict(p.floors), p.gpu, node(1, 1)) == (dict(p.floors), None)  # an emulated port's Gen1 x1
    assert host_link.fit(dict(p.floors), p.gpu, node(3, 4)) == (dict(p.floors), None)
    assert host_link.fit(dict(p.floors), p.gpu, node(4), virtual=True) == (dict(p.floors), None)


def test_a_site_s_own_floor_is_never_scaled():
    p = profile("h100-pcie", {"h2d_bandwidth": SiteFloor(20e9, "config /etc/preflight/config.toml line 4")})
    floors, said = host_link.fit(dict(p.floors), p.gpu, node(4))
    assert floors["h2d_bandwidth"].value == 20e9 and said.endswith("d2h floors x0.50")
    assert floors["d2h_bandwidth"].value == pytest.approx(24e9)
