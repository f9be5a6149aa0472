"""The NVML inventory's judges (checkkit/gpu_health.py) on recorded NVML facts
(tests/fixtures/nvml) and a recorded HGX H100 sysfs tree; the cuda check's
tests (tests/checks/test_cuda.py) judge the same facts through the whole check."""

import shutil
from typing import get_args

import pytest
from conftest import FIXTURES

from preflight.base.actions import Action, Domain, Next
from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.checkkit import gpu_health
from preflight.pipeline import profiles, shape
from preflight.readers.nvidia.nvml import FakeNvml
from preflight.readers.nvidia.nvml_facts import Gpu, Inventory, LostGpu, PcieLink
from preflight.readers.nvidia.nvml_inventory import RECOVERY_ACTIONS

H100 = profiles.load(profiles.BUILTIN_DIR / "h100-sxm.toml")
NVML = FIXTURES / "nvml"
TREE = FIXTURES / "sysfs" / "hgx-h100"


def inventory(name: str) -> Inventory:
    """Recorded facts, judged as if NVML had said them."""
    return FakeNvml(NVML / name).model_copy(update={"source": "NVML"})


def test_a_site_pin_fails_a_node_that_shows_fewer_gpus():
    f = inventory("h100-sxm-8x-healthy.json")
    four = f.model_copy(update={"gpus": f.gpus[:4]})
    node = shape.judge_shape(shape.PciNvidia(gpus=None), None, {}, [], four, pinned=8)
    fails = gpu_health.judge_count(four, node)
    assert [x.summary for x in fails] == ["4 of 8 pinned GPUs visible"]
    assert "the site pins 8 ([node] gpus" in fails[0].cause
    assert gpu_health.judge_count(four, node.model_copy(update={"pinned": 4})) == []


def test_a_lone_sxm_gpu_whose_links_all_read_inactive_passes():
    # One H100 SXM in a VM: no NVLink peer, so every link answers "inactive" (DCGM says the same of a bridge-less card).
    g = inventory("h100-sxm-8x-healthy.json").gpus[0].model_copy(update={"nvlinks_active": 0, "nvlinks_down": []})
    assert gpu_health.judge_gpu(g, H100.gpu, fabric="single") == []
    assert gpu_health.judge_gpu(g, H100.gpu, fabric="pcie") == []
    (fail,) = gpu_health.judge_gpu(g, H100.gpu, fabric="nvswitch")  # on a board whose other GPUs are joined, it is a fault
    assert fail.summary == "GPU 0 (0000:1b:00.0): 0 of 18 NVLinks active"


def test_an_idle_gen1_link_is_not_judged_but_a_loaded_one_is():
    idle = inventory("h100-sxm-8x-healthy.json").gpus[0].model_copy(update={"pcie": PcieLink(gen=1, width=16, gen_max=5, width_max=16)})
    assert gpu_health.judge_link(idle, None) == []  # idle links drop to Gen1 to save power
    assert gpu_health.judge_link(idle, PcieLink(gen=5, width=16)) == []
    (fail,) = gpu_health.judge_link(idle, PcieLink(gen=3, width=16))
    assert fail.summary == "GPU 0 (0000:1b:00.0): PCIe Gen3 of Gen5 under load"


def test_transient_power_brake_or_thermal_warns_naming_it_transient():
    g = inventory("h100-sxm-8x-healthy.json").gpus[0]
    brake = gpu_health.judge_gpu(g.model_copy(update={"clocks_events_transient": ["hw_slowdown", "hw_power_brake_slowdown"]}), H100.gpu)
    assert [(f.status, f.summary) for f in brake] == [(Status.WARN, "GPU 0 (0000:1b:00.0): power brake asserted (transient)")]
    hot = gpu_health.judge_gpu(g.model_copy(update={"clocks_events": ["hw_slowdown"], "clocks_events_transient": ["hw_thermal_slowdown"]}), H100.gpu)
    assert [f.status for f in hot] == [Status.WARN] and "in some readings (transient)" in hot[0].cause


def test_warnings_persistence_ecc_off_power_cap():
    g = inventory("h100-sxm-8x-healthy.json").gpus[0]
    slow = g.model_copy(update={"persistence_mode": False, "ecc_mode": False, "power_limit_w": 500.0})
    warns = gpu_health.judge_gpu(slow, H100.gpu)
    assert {f.status for f in warns} == {Status.WARN}
    assert [f.summary.split(": ", 1)[1] for f in warns] == ["ECC is off", "persistence mode off", "power capped"]


def test_ecc_off_warns_where_the_card_ships_with_it_on_or_nvml_does_not_say_but_not_where_it_ships_off():
    # A workstation card (RTX A6000's kind) ships with ECC off: as sold, not changed by anyone.
    g = inventory("h100-sxm-8x-healthy.json").gpus[0].model_copy(update={"ecc_mode": False})
    said = {default: [f.summary for f in gpu_health.judge_gpu(g.model_copy(update={"ecc_default": default}), H100.gpu)] for default in (True, None, False)}
    assert said == {True: ["GPU 0 (0000:1b:00.0): ECC is off"], None: ["GPU 0 (0000:1b:00.0): ECC is off"], False: []}


def test_a_corrupted_inforom_fails_naming_the_gpu_and_an_unknown_one_is_no_finding():
    g = inventory("h100-sxm-8x-healthy.json").gpus[3]
    (fail,) = gpu_health.judge_gpu(g.model_copy(update={"inforom_valid": False}), H100.gpu)
    assert (fail.status, fail.summary) == (Status.FAIL, "GPU 3 (0000:61:00.0): InfoROM corrupted")
    assert "nvmlDeviceValidateInforom" in fail.cause and "RMA" in fail.remedy
    assert fail.next.action == Action.SERVICE
    assert gpu_health.judge_gpu(g.model_copy(update={"inforom_valid": None}), H100.gpu) == []
    assert gpu_health.judge_gpu(g.model_copy(update={"inforom_valid": True}), H100.gpu) == []


def test_a_missing_nvlink_fails_naming_the_link():
    g = inventory("h100-sxm-8x-healthy.json").gpus[3]
    (fail,) = gpu_health.judge_gpu(g.model_copy(update={"nvlinks_active": 17, "nvlinks_down": [5]}), H100.gpu, fabric="nvswitch")
    assert fail.summary == "GPU 3 (0000:61:00.0): 17 of 18 NVLinks active" and "link 5" in fail.cause


def test_nvlink_state_unknown_on_an_nvlink_sku_warns():
    g = inventory("h100-sxm-8x-healthy.json").gpus[0].model_copy(update={"nvlinks_active": None})
    assert [(f.status, f.summary) for f in gpu_health.judge_gpu(g, H100.gpu, fabric="nvswitch")] == [(Status.WARN, "GPU 0 (0000:1b:00.0): NVLink state unknown")]
    assert gpu_health.judge_gpu(g, H100.gpu, fabric="unknown") == []  # a VM that hides NVLink and shows no NVSwitch: nothing to say


def test_a_container_given_two_of_eight_gpus_is_not_failed_for_the_hosts_other_six(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(TREE, root, symlinks=True)
    for minor in range(2, 8):
        (root / f"dev/nvidia{minor}").unlink()
    whole = inventory("h100-sxm-8x-healthy.json")
    two = whole.model_copy(update={"gpus": whole.gpus[:2]})
    node = shape.gather(Host(root), two)
    assert node.gpus == 2 and gpu_health.judge_count(two, node) == []
    # ... but one of its own two missing from NVML is named by its slot.
    one = whole.model_copy(update={"gpus": whole.gpus[1:2]})
    (fail,) = gpu_health.judge_count(one, shape.gather(Host(root), one))
    assert fail.summary == "1 of 2 GPUs visible" and "on the PCI bus but not in NVML: 0000:1b:00.0" in fail.cause


def test_a_slurm_job_under_a_device_cgroup_is_judged_on_the_gpus_it_was_given(tmp_path, monkeypatch):
    # `srun --gres=gpu:2` with ConstrainDevices=yes: /dev lists all 8 nodes, the cgroup lets it open two.
    root = tmp_path / "root"
    shutil.copytree(TREE, root, symlinks=True)
    monkeypatch.setattr(shape, "may_open", lambda path: path.name in ("nvidia0", "nvidia1"))
    whole = inventory("h100-sxm-8x-healthy.json")
    two = whole.model_copy(update={"gpus": whole.gpus[:2]})  # NVML lists the two it may open...
    assert gpu_health.judge_count(two, shape.gather(Host(root), two)) == []
    refused = inventory("h100-sxm-8x-slurm-2-given.json")  # ... or counts 8 and refuses six (NO_PERMISSION)
    assert gpu_health.judge_count(refused, shape.gather(Host(root), refused)) == []
    # A site's pin is the node's count: the six the job was not given are the node's all the same,
    # whether NVML refuses them or lists only the two.
    pinned = shape.gather(Host(root), refused).model_copy(update={"pinned": 8})
    assert gpu_health.judge_count(refused, pinned) == []
    assert gpu_health.judge_count(two, shape.gather(Host(root), two).model_copy(update={"pinned": 8})) == []
    assert [x.summary for x in gpu_health.judge_count(refused.model_copy(update={"refused": refused.refused[1:]}), pinned)] == [
        "7 of 8 pinned GPUs visible"]
    # One of its own two really lost (GPU_IS_LOST) still fails, and asks the reboot only that mends.
    lost = refused.model_copy(update={"gpus": refused.gpus[:1], "lost": [LostGpu(index=1, pci_bus_id="00000000:43:00.0", error="GPU is lost")]})
    (fail,) = gpu_health.judge_count(lost, shape.gather(Host(root), lost))
    assert fail.summary == "GPU 1 (0000:43:00.0) is lost" and fail.next.action == Action.REBOOT


def test_a_gpu_gone_from_nvml_fails_under_cuda_visible_devices_too():
    # A Slurm step given GPUs 4-7; the GPU at 0000:c3:00.0, one of them, fell off the bus.
    seven = inventory("h100-sxm-7of8.json")
    (fail,) = gpu_health.judge_count(seven, shape.gather(Host(TREE, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}), seven))
    assert fail.summary == "7 of 8 GPUs visible" and "on the PCI bus but not in NVML: 0000:c3:00.0" in fail.cause
    healthy = inventory("h100-sxm-8x-healthy.json")
    assert gpu_health.judge_count(healthy, shape.gather(Host(TREE, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}), healthy)) == []


# ---- the driver's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) ----------------------------


def _acting(action):
    g = inventory("h100-sxm-gpu2-recovery-reset.json").gpus[2]
    return g.model_copy(update={"recovery_action": action})


@pytest.mark.parametrize("action, words, rung, remedy", [
    ("gpu_reset", "GPU reset", Action.RESET_GPU, "`nvidia-smi -r -i 2`"),
    ("node_reboot", "node reboot", Action.REBOOT, "reboot the node"),
    ("drain_p2p", "drain P2P", Action.DRAIN, "take no new job on the node; stop the processes doing P2P"),
    ("drain_and_reset", "drain P2P and reset the GPU", Action.RESET_GPU, "take no new job on the node; stop every process on the GPU, then `nvidia-smi -r -i 2`"),
    ("bus_reset", "PCIe bus reset", Action.RESET_GPU, "reset its PCIe bus"),
    ("system_reboot", "system reboot", Action.REBOOT, "reboot the system"),
])
def test_each_recovery_action_the_driver_reports_fails_at_its_rung(action, words, rung, remedy):
    (fail,) = gpu_health.judge_gpu(_acting(action), H100.gpu, fabric="nvswitch")
    assert fail.status == Status.FAIL and fail.summary == f"GPU 2 (0000:52:00.0): NVML asks for {words}"
    assert f"the driver reports recovery action {words}" in fail.cause and remedy in fail.remedy
    assert fail.next == Next(rung, Domain.NODE, f"NVML recovery action on GPU 2: {words} (nvmlDeviceGetFieldValues, field 230)")


def test_an_imex_domain_to_recover_is_a_drain_in_the_software_domain():
    (fail,) = gpu_health.judge_recovery(_acting("recover_imex_domain"))
    assert (fail.next.action, fail.next.domain) == (Action.DRAIN, Domain.SOFTWARE) and "nvidia-imex" in fail.remedy


def test_recovery_action_none_or_unsaid_is_no_finding_and_details_say_which():
    inv = inventory("h100-sxm-gpu3-recovery-unanswered.json")
    assert gpu_health.judge_inventory(inv, None, H100.gpu) == []  # GPU 3's field "Unknown Error": unknown, not a WARN
    older = inventory("h100-sxm-8x-healthy.json")  # driver 550: older than the field
    assert gpu_health.judge_inventory(older, None, H100.gpu) == []
    said = gpu_health.recovery_actions(inv)
    assert said["0"] == "none" and said["3"] == "unknown (driver does not report it: NVML answered Unknown Error)"
    assert set(gpu_health.recovery_actions(older).values()) == {"unknown (driver does not report it)"}
    assert gpu_health.recovery_actions(inventory("h100-sxm-gpu2-recovery-reset.json"))["2"] == "GPU reset"


def test_every_recovery_action_the_child_can_name_has_a_rung():
    assert set(get_args(get_args(Gpu.model_fields["recovery_action"].annotation)[0])) == set(RECOVERY_ACTIONS.values())
    assert set(RECOVERY_ACTIONS.values()) == set(gpu_health.RECOVERY_WORDS)
