"""Profile generic (preflight/pipeline/profiles/generic.toml): what `auto` runs where no profile
names the node's GPU model. It must pass a healthy node of any model, judge everything that
needs no SKU as the SKU profiles do, and claim no floor of a model it does not know."""

import json
from pathlib import Path

import pytest
from conftest import clean_env, nccl_fixture_text, run_preflight
from cuda_facts import facts

from preflight.base.findings import Status
from preflight.checkkit import transports
from preflight.checks import cuda, fabric
from preflight.gpuwork import ranks
from preflight.pipeline import profiles, shape
from preflight.readers.nccl import nccl_log
from preflight.readers.nvidia.nvml import FakeNvml

NVML = Path(__file__).parents[1] / "fixtures" / "nvml"
GENERIC = profiles.load(profiles.find("generic", None))
HGX8 = shape.NodeShape(gpus=8, gpus_from="t", fabric="nvswitch", fabric_from="t", pci_gpus=[str(i) for i in range(8)], nvswitches=4)


def judged(f: cuda.CudaFacts, node: shape.NodeShape = HGX8, pin: str | None = None):
    return [x for found in cuda.judge(f, node, GENERIC.gpu, pin).values() for x in found]


def test_it_holds_no_floor_of_a_model_and_the_floors_it_holds_need_none():
    assert GENERIC.match == [] and GENERIC.gpu is not None
    assert (GENERIC.gpu.pci_device_ids, GENERIC.gpu.driver_min, GENERIC.gpu.nvlinks, GENERIC.gpu.memory_min_bytes) == ([], None, 0, 0)
    assert sorted(GENERIC.floors) == ["shm_min_bytes", "vcpus_per_gpu"]
    assert GENERIC.train is None and "train" not in GENERIC.checks
    assert GENERIC.fabric is not None and GENERIC.fabric.nvswitches is None


def test_a_healthy_board_passes_and_an_old_driver_is_no_finding_but_a_site_pin_still_is():
    f = facts("h100-sxm-8x-healthy.json")
    assert judged(f) == []
    old = f.model_copy(update={"inventory": f.inventory.model_copy(update={"driver_version": "470.82.01"})})
    assert judged(old) == []
    assert [x.summary for x in judged(f, pin="550.90.07")] == ["driver 550.54.15, site pins 550.90.07"]


def test_a_gpu_with_fewer_nvlinks_than_its_peers_fails_naming_the_count_it_is_held_to():
    f = facts("h100-sxm-nvswitch-link-down.json")
    (x,) = judged(f)
    assert (x.status, x.summary) == (Status.FAIL, "GPU 3 (0000:61:00.0): 17 of 18 NVLinks active")
    assert x.cause.startswith("GPU 3 (0000:61:00.0) has 17 active NVLinks (down: link 5), its peers have 18 (the most any GPU of this node has (GPU 0")
    floors = {m.labels["gpu"]: m.floor for m in cuda.measurements(f, GENERIC.gpu, HGX8) if m.name == "gpu_nvlinks_active"}
    assert set(floors.values()) == {18}


@pytest.mark.parametrize("fabric_kind, fails", [("nvswitch", True), ("nvlink", True), ("pcie", False), ("unknown", False)])
def test_a_gpu_with_no_link_fails_where_the_node_joins_its_gpus_by_nvlink(fabric_kind, fails):
    # As topology's pairing says of a bridged node's card without a partner: it has lost its bridge.
    f = facts("h100-sxm-8x-healthy.json")
    gpus = [g.model_copy(update={"nvlinks_active": 0, "nvlinks_down": []}) if g.index == 6 else g for g in f.inventory.gpus]
    f = f.model_copy(update={"inventory": f.inventory.model_copy(update={"gpus": gpus})})
    node = HGX8.model_copy(update={"fabric": fabric_kind})
    found = [x.summary for x in judged(f, node)]
    assert found == (["GPU 6 (0000:d1:00.0): 0 of 18 NVLinks active"] if fails else [])


def with_links(counts: list[int | None]) -> cuda.CudaFacts:
    f = facts("h100-sxm-8x-healthy.json", init=None)  # NVML's facts alone: the GPUs cut to len(counts)
    gpus = [g.model_copy(update={"nvlinks_active": n, "nvlinks_down": []}) for g, n in zip(f.inventory.gpus, counts)]
    return f.model_copy(update={"inventory": f.inventory.model_copy(update={"gpus": gpus})})


def test_gpus_joined_directly_are_held_to_the_count_most_of_them_have_where_most_agree():
    node = lambda n: HGX8.model_copy(update={"fabric": "nvlink", "gpus": n, "pci_gpus": [str(i) for i in range(n)]})  # noqa: E731
    # A cube mesh gives some GPUs more links than others by design (4, 4, 5, 5): no count most agree on, nothing judged.
    assert judged(with_links([4, 4, 5, 5]), node(4)) == []
    # Two bridged cards and a third without its bridge: held to the two's 4.
    (x,) = judged(with_links([4, 4, 0]), node(3))
    assert x.summary == "GPU 2 (0000:52:00.0): 0 of 4 NVLinks active"
    assert "its peers have 4 (the count 2 of the node's 3 GPUs have; the profile names no count for this model)" in x.cause
    # NVML silent on every GPU (a VM that hides NVLink): nothing to hold them to.
    assert judged(with_links([None] * 8), HGX8.model_copy(update={"fabric": "nvlink"})) == []


def test_fabric_judges_the_manager_and_the_registration_but_not_a_board_it_does_not_know():
    inv = FakeNvml(NVML / "h100-sxm-8x-fabric-completed.json")
    running = fabric.Manager(state="running", how="systemd unit nvidia-fabricmanager active")
    three = HGX8.model_copy(update={"nvswitches": 3})  # a board whose count no profile gives: not judged
    parts, unjudged, _ = fabric.judge(fabric.FabricFacts(manager=running, inventory=inv), three, GENERIC.fabric)
    assert [x for found in parts.values() for x in found] == []
    assert unjudged == {"nvswitches": "no board count of NVSwitches for this GPU model (profile generic names no SKU, so no board to count the NVSwitch chips of)"}
    stuck = FakeNvml(NVML / "h100-sxm-8x-fabric-not-started.json")
    parts, _, _ = fabric.judge(fabric.FabricFacts(manager=running, inventory=stuck), HGX8, GENERIC.fabric)
    assert [x.status for x in parts["gpus"]] == [Status.FAIL]


@pytest.mark.parametrize("old, new, message", [
    ('nvswitch_source = "', 'nvswitches = 4\nnvswitch_source = "', "nvswitches and board_gpus go together"),
    ("nvlinks_from_node = true\n", "nvlinks_from_node = true\nnvlinks = 18\n", "set it or nvlinks, not both"),
    # What generic may go without, a profile of one model may not: a forgotten key must not drop its judgement.
    ("model_floors = false\n", "", "driver_min is needed where the profile describes a GPU model"),
    ("model_floors = false\n", 'model_floors = true\ndriver_min = "535.54.03"\n', r"\[fabric\] nvswitches and board_gpus are needed where the profile describes a GPU model"),
])
def test_what_only_a_profile_of_no_model_may_leave_out_exits_2_naming_it_elsewhere(tmp_path, old, new, message):
    text = profiles.find("generic", None).read_text()
    assert text.count(old) == 1
    (tmp_path / "generic.toml").write_text(text.replace(old, new))
    with pytest.raises(profiles.UsageError, match=message):
        profiles.load(tmp_path / "generic.toml")


def test_auto_runs_a_model_no_profile_names_under_generic_and_says_why():
    fake = str(NVML / "l40s-2x.json")
    r = run_preflight(["detect", "--json", "--nvml-fake", fake])
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["profile"] == "generic"
    assert data["why"].startswith("auto: 2 x NVIDIA L40S (PCI device id 0x26b9): no profile names this model, so profile generic")
    r = run_preflight(["run", "--json", "--scratch", "--level", "quick", "--only", "cuda,topology", "--nvml-fake", fake])
    report = json.loads(r.stdout)
    assert report["profile"] == "generic" and "no profile names this model" in report["profile_chosen_because"]
    checks = {c["check"]: c for c in report["checks"]}
    # Every part but the recording's own ("NVML facts are FAKE", which fails closed) passes.
    assert {p: s for p, s in checks["cuda"]["details"]["parts"].items() if p != "source" and s in ("WARN", "FAIL")} == {}
    assert r.returncode == 1 and checks["cuda"]["summary"].startswith("NVML facts are FAKE")


def four_ranks() -> list[ranks.RankOutcome]:
    return [ranks.RankOutcome(rank=r, gpu=f"GPU {r}", report=ranks.RankReport(rank=r, local_rank=r, world_size=4, host="n", pid=r, python="py",
                                                                              stage="done", backend="nccl", device="cuda")) for r in range(4)]


@pytest.mark.parametrize("fabric_kind", ["nvlink", "unknown", "pcie"])
def test_bridged_pairs_that_reach_their_non_partners_through_host_memory_pass(fabric_kind):
    # 4 x A100 in two bridged pairs (tests/fixtures/nccl 09): P2P within a pair, SHM across, as NCCL chooses on a healthy node.
    log = nccl_log.parse(nccl_fixture_text("09"))
    node = shape.NodeShape(gpus=4, gpus_from="t", fabric=fabric_kind, fabric_from="t")
    expect = transports.p2p_for_shape(GENERIC.nccl, node)
    assert transports.judge(log, four_ranks(), {}, expect, {frozenset((0, 1)), frozenset((2, 3))}, set()) == []
    # Between NVLink partners, SHM is a fault whatever the profile says.
    (x,) = transports.judge(log, four_ranks(), {}, expect, {frozenset((1, 2))}, set())
    assert x.status is Status.FAIL and "rank 1 (GPU 1) -> rank 2 (GPU 2) via SHM/direct/direct" in x.cause


def test_a_site_profile_made_from_generic_for_its_model_is_what_auto_picks_with_its_floor(tmp_path):
    # As docs/configuration.md says: a copy of generic.toml, renamed, with the model's NVML name and a floor from calibrate.
    text = profiles.find("generic", None).read_text().replace('name = "generic"', 'name = "l40s"', 1).replace("match = []", 'match = ["NVIDIA L40S"]', 1)
    text += '\n[floors.h2d_bandwidth]\nvalue = 20e9\nunit = "bytes_per_second"\nsource = "preflight calibrate on l40s-07, 2026-11-28"\n'
    (tmp_path / "l40s.toml").write_text(text)
    r = run_preflight(["detect", "--json", "--nvml-fake", str(NVML / "l40s-2x.json")], env={**clean_env(), "PREFLIGHT_PROFILES_DIR": str(tmp_path)})
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["profile"] == "l40s" and "matched profile l40s by name 'NVIDIA L40S'" in data["why"]
    r = run_preflight(["show-profile", "l40s"], env={**clean_env(), "PREFLIGHT_PROFILES_DIR": str(tmp_path)})
    assert r.returncode == 0 and "h2d_bandwidth: at least 20000000000 bytes_per_second" in r.stdout, r.stdout + r.stderr
