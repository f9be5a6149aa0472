"""The cuda check: the judge with recorded facts (FakeNvml files, worker
reports, Xid logs), and the gatherer with the real worker on CPU torch and
with interpreters made to hang, crash or talk nonsense."""

import json
import os
import subprocess
import sys
import time

import fakes
import psutil
import pytest
from cuda_facts import FIXTURES, INIT, NVML, facts, loaded_reading, python_script
from preflight.checkkit import gpu_health
from preflight.checks import cuda
from preflight.gpuwork.cuda_init import InitOutcome, InitReport

from preflight.readers.nvidia import nvml, nvml_facts
from preflight.readers.kernel import log_sources, xid
from preflight.pipeline import profiles, shape
from preflight.pipeline.check import Context
from preflight.pipeline.settings import Settings
from preflight.base.actions import Action, Domain
from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.readers.nvidia.nvml import FakeNvml
from preflight.readers.nvidia.nvml_facts import PcieLink
from preflight.pipeline.shape import NodeShape

H100 = profiles.load(profiles.BUILTIN_DIR / "h100-sxm.toml")
A100 = profiles.load(profiles.BUILTIN_DIR / "a100-sxm4-80gb.toml")


# A healthy HGX board as the node shows it: eight GPUs on the PCI bus, joined by NVSwitch.
HGX8 = NodeShape(gpus=8, gpus_from="the PCI bus (sysfs)", fabric="nvswitch", fabric_from="NVML: active NVLinks end at an NVSwitch")
TREE = FIXTURES / "sysfs" / "hgx-h100"


def judged(f: cuda.CudaFacts, profile=H100, pin=None, node: NodeShape | None = HGX8):
    parts = cuda.judge(f, node, profile.gpu, pin)
    return [finding for found in parts.values() for finding in found]


def tree_shape(f: cuda.CudaFacts, root=TREE, pinned=None) -> NodeShape:
    return shape.gather(Host(root), f.inventory, pinned)


def only(findings, status=Status.FAIL):
    return [f for f in findings if f.status == status]


def test_a_healthy_h100_node_passes():
    f = facts("h100-sxm-8x-healthy.json")
    assert judged(f) == []
    assert "8 x NVIDIA H100 80GB HBM3, driver 550.54.15" in cuda.summary(f)


def test_healthy_node_exports_per_gpu_measurements_with_dcgm_labels():
    values = cuda.measurements(facts("h100-sxm-8x-healthy.json"))
    width = [m for m in values if m.name == "gpu_pcie_link_width"]
    assert len(width) == 8 and width[0].labels == {"gpu": "0", "UUID": "GPU-5c1b0c7e-8f2a-4d3b-9e6a-000000000000"}
    assert {m.name for m in values} >= {"gpu_cuda_init_duration", "gpu_nvlinks_active", "gpu_temperature"}


def test_seven_of_eight_names_the_missing_slot_from_sysfs():
    f = facts("h100-sxm-7of8.json")
    node = tree_shape(f)
    assert node.gpus == 8 and "0000:05:00.0" not in node.slots  # the NVSwitch is not a GPU
    fails = only(judged(f, node=node))
    assert fails[0].summary == "7 of 8 GPUs visible"
    assert "on the PCI bus but not in NVML: 0000:c3:00.0" in fails[0].cause
    # A fleet's automation reads what to do: a GPU gone from the node is hardware to service.
    assert (fails[0].next.action.value, fails[0].next.domain.value) == ("service", "node")


def test_seven_of_eight_without_sysfs_still_fails_from_the_device_nodes():
    # A gVisor-style sandbox: no PCI device in sysfs, but eight /dev/nvidiaN.
    f = facts("h100-sxm-7of8.json")
    node = shape.judge_shape(shape.PciNvidia(gpus=None), list(range(8)), {}, [], f.inventory)
    fails = only(judged(f, node=node))
    assert [x.summary for x in fails][0] == "7 of 8 GPUs visible"
    assert "/dev/nvidia{0-7} (sysfs lists no PCI device)" in fails[0].cause


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_a_healthy_h100_sxm_node_of_any_size_passes(n):
    # The 8-GPU facts cut to n GPUs, as a 1-GPU VM, a partition, or a pod given n GPUs reports them.
    whole = facts("h100-sxm-8x-healthy.json").inventory
    inv = whole.model_copy(update={"gpus": whole.gpus[:n]})
    node = shape.judge_shape(shape.PciNvidia(gpus=[nvml_facts.short_pci(g.pci_bus_id) for g in inv.gpus], nvswitches=4 if n > 1 else 0), None, {}, [], inv)
    report = InitReport.model_validate_json((INIT / "healthy-8x.json").read_text())
    report = report.model_copy(update={"devices": report.devices[:n], "pci_bus_ids": report.pci_bus_ids[:n], "device_count": n})
    init = InitOutcome(python=report.python, ended="exit 0", returncode=0, timed_out=False, seconds=1.0, report=report)
    assert judged(cuda.CudaFacts(inventory=inv, kernel_log="/dev/kmsg", init=init), node=node) == []


def test_pending_row_remap_says_reset_required():
    # GPU 00000000:10:1C.0 as captured in shared/fixtures/nvsmi/q_01.
    fails = only(judged(facts("a100-sxm4-8x-remap-pending.json", init=None), A100))
    assert len(fails) == 1
    assert fails[0].summary == "GPU 2 (0000:10:1c.0): row remap pending"
    assert "reset required" in fails[0].remedy and "nvidia-smi -r -i 2" in fails[0].remedy


def test_volatile_uncorrectable_ecc_fails():
    fails = only(judged(facts("h100-sxm-ecc-uncorrectable.json")))
    assert [f.summary for f in fails] == ["GPU 3 (0000:61:00.0): uncorrectable ECC errors"]
    assert "2 uncorrectable (volatile) ECC errors" in fails[0].cause


def test_the_bounds_the_check_holds_gpus_to_ride_along_as_floors():
    # So a dashboard's `preflight_gpu_pcie_link_width_lanes < preflight_gpu_pcie_link_width_floor_lanes` finds the x8 link.
    got = {(m.name, m.labels["gpu"]): m for m in cuda.measurements(facts("h100-sxm-pcie-x8.json"), H100.gpu, HGX8)}
    assert (got[("gpu_pcie_link_width", "2")].value, got[("gpu_pcie_link_width", "2")].floor) == (8, 16)
    assert got[("gpu_pcie_link_width", "0")].value == got[("gpu_pcie_link_width", "0")].floor == 16
    assert got[("gpu_nvlinks_active", "0")].floor == H100.gpu.nvlinks == 18
    assert got[("gpu_pcie_link", "0")].floor is None  # generation is judged only under load: an idle link drops to Gen1
    assert got[("gpu_temperature", "0")].floor is None


def test_a_generation_floor_only_for_the_gpus_read_under_load():
    # CUDA_VISIBLE_DEVICES=0: the worker copied to GPU 0 only; the others idle at Gen1 and were not judged.
    f = facts("h100-sxm-8x-healthy.json")
    idle = [g.model_copy(update={"pcie": PcieLink(gen=1, width=16, gen_max=5, width_max=16)}) for g in f.inventory.gpus]
    f = f.model_copy(update={"inventory": f.inventory.model_copy(update={"gpus": idle}), "pcie_loaded": {idle[0].pci_bus_id: PcieLink(gen=5, width=None)}})
    assert [x for x in judged(f) if "PCIe" in x.summary] == []
    got = {(m.name, m.labels["gpu"]): m for m in cuda.measurements(f, H100.gpu)}
    assert (got[("gpu_pcie_link", "0")].value, got[("gpu_pcie_link", "0")].floor) == (5, 5)
    assert (got[("gpu_pcie_link", "1")].value, got[("gpu_pcie_link", "1")].floor) == (1, None)  # never "below floor" on a passing node
    assert got[("gpu_pcie_link_width", "0")].value == 16  # a loaded reading without a width: the idle width, as the judge reads it


@pytest.mark.parametrize("report", ["no-pci-bus-id-8x", "no-pci-bus-id-no-uuid-8x"])
def test_without_pci_addresses_from_torch_the_loaded_generation_is_still_judged(report):
    # By UUID where torch gives one, else by CUDA's PCI_BUS_ID order; the reading used to be dropped.
    f = facts("h100-sxm-8x-healthy.json", init=report)
    loaded, why = cuda.loaded_links(f.init, loaded_reading(f.inventory, slow=2), f.inventory)
    assert why is None and loaded is not None and len(loaded) == 8
    fails = only(judged(f.model_copy(update={"pcie_loaded": loaded})))
    assert [x.summary for x in fails] == ["GPU 2 (0000:52:00.0): PCIe Gen3 of Gen5 under load"]


@pytest.mark.parametrize(
    "update, why",
    [
        ({"cuda_visible_devices": "7,6"}, "CUDA_VISIBLE_DEVICES=7,6 renumbers the devices"),
        ({"cuda_device_order": None}, "CUDA_DEVICE_ORDER was unset, not PCI_BUS_ID"),
        ({"device_count": 7}, "CUDA sees 7 devices where NVML lists 8"),
    ],
)
def test_where_no_route_ties_cuda_to_nvml_the_generation_is_unjudged_and_says_why(update, why):
    f = facts("h100-sxm-8x-healthy.json", init="no-pci-bus-id-no-uuid-8x")
    f.init.report = f.init.report.model_copy(update=update)
    loaded, unjudged = cuda.loaded_links(f.init, loaded_reading(f.inventory, slow=2), f.inventory)
    assert loaded is None
    assert unjudged.startswith("the CUDA devices the worker loaded cannot be matched to NVML's GPUs: torch 2.5.1+cu124 gives no PCI address and no UUID")
    assert unjudged.endswith(why)
    said = cuda.pcie_generation(f.model_copy(update={"pcie_unjudged": unjudged}))
    assert said.startswith("not judged: the CUDA devices the worker loaded cannot be matched")


def test_an_x8_link_fails_from_the_idle_reading():
    fails = only(judged(facts("h100-sxm-pcie-x8.json")))
    assert [f.summary for f in fails] == ["GPU 2 (0000:52:00.0): PCIe link x8 of x16"]
    assert "50% speed" in fails[0].cause


def test_hw_slowdown_fails_thermal_warns_power_brake_fails():
    assert [f.summary for f in only(judged(facts("h100-sxm-hw-slowdown.json")))] == ["GPU 6 (0000:d1:00.0): hardware slowdown active"]
    g = facts("h100-sxm-8x-healthy.json").inventory.gpus[0]
    thermal = gpu_health.judge_gpu(g.model_copy(update={"clocks_events": ["hw_slowdown", "hw_thermal_slowdown"]}), H100.gpu)
    assert [(f.status, f.summary) for f in thermal] == [(Status.WARN, "GPU 0 (0000:1b:00.0): thermal slowdown")]
    brake = gpu_health.judge_gpu(g.model_copy(update={"clocks_events": ["hw_slowdown", "hw_power_brake_slowdown"]}), H100.gpu)
    assert [(f.status, f.summary) for f in brake] == [(Status.FAIL, "GPU 0 (0000:1b:00.0): power brake active")]


def test_hw_slowdown_in_some_readings_only_passes_as_nvml_reads_it(tmp_path, monkeypatch):
    # Through the NVML child: the bit is set in the first of its readings only,
    # as NVML documents it during clock changes. One reading used to FAIL the node.
    import fakes

    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML_FACTS", str(NVML / "h100-sxm-hw-slowdown-transient.json"))
    inv = nvml.inventory()
    assert inv.gpus[6].clocks_events_transient == ["hw_slowdown"]
    assert gpu_health.judge_inventory(inv, HGX8, H100.gpu) == []


def test_mig_on_fails_where_whole_gpus_are_expected():
    fails = only(judged(facts("h100-sxm-mig.json")))
    assert [f.summary for f in fails] == ["GPU 1 (0000:43:00.0): MIG enabled"]
    assert "-mig 0" in fails[0].remedy


def test_mixed_skus_fail():
    summaries = [f.summary for f in only(judged(facts("h100-mixed-skus.json")))]
    assert "mixed GPU models" in summaries
    assert "NVIDIA H100 PCIe is not this profile's GPU" in summaries


def test_a_lost_gpu_is_named_with_reset_or_drain():
    f = facts("h100-sxm-gpu-lost.json", init=None)
    fails = only(judged(f))
    assert fails[0].summary == "GPU 4 (0000:9d:00.0) is lost"
    assert (fails[0].next.action.value, fails[0].next.domain.value) == ("reboot", "node")  # nvidia-smi -r cannot reach it
    assert "nvidia-smi -r -i 4" in fails[0].remedy and "drain" in fails[0].remedy


def test_zero_gpus_fails():
    assert only(judged(facts("zero-gpus.json", init=None)))[0].summary == "0 of 8 GPUs visible"


def test_driver_below_the_profile_minimum_or_off_the_site_pin_fails():
    f = facts("h100-sxm-8x-healthy.json")
    old = f.model_copy(update={"inventory": f.inventory.model_copy(update={"driver_version": "470.82.01"})})
    assert [x.summary for x in only(judged(old))] == ["driver 470.82.01 is too old"]
    assert [x.summary for x in only(judged(f, pin="550.90.07"))] == ["driver 550.54.15, site pins 550.90.07"]
    assert judged(f, pin="550.54.15") == []


def test_fatal_xid_fails_and_the_jobs_own_xid_is_said_not_judged():
    # Was: Xid 13 (RESTART_APP) a WARN of the node. The catalog puts it in the job's domain.
    events = xid.parse((FIXTURES / "xid" / "05_dmesg-ctime_xid13-SM-exceptions_xid109-CTX-SWITCH-TIMEOUT_nvidia-peermem_gpud-46.txt").read_text())
    f = facts("h100-sxm-8x-healthy.json", xid_events=events)
    assert [(x.status, x.summary.split(" on ")[0]) for x in judged(f)] == [(Status.FAIL, "Xid 109")]
    (xid13,) = cuda.job_xids(events, f.inventory)
    assert xid13.startswith("Xid 13 on 0000:cb:00 (3 times since boot): graphics engine exception: the job's, not the node's")


# A healthy node after one job hit an illegal address (Xid 13, then its page fault, 31) and was
# cancelled (43, 45): the lines stay in the kernel log until a reboot.
JOB_FAULT = (
    "[ 1234.567890] NVRM: Xid (PCI:0000:1b:00): 13, pid=4242, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address\n"
    "[ 1234.567891] NVRM: Xid (PCI:0000:1b:00): 31, pid=4242, name=python, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ\n"
    "[ 1300.000001] NVRM: Xid (PCI:0000:1b:00): 43, pid=4242, name=python, Ch 00000008\n"
    "[ 1300.000002] NVRM: Xid (PCI:0000:1b:00): 45, pid=4242, name=python, Ch 00000008\n"
)


def test_a_jobs_own_xids_since_boot_leave_a_healthy_node_passing_and_are_said_in_its_lines():
    f = facts("h100-sxm-8x-healthy.json", init=None, xid_events=xid.parse(JOB_FAULT))
    assert judged(f) == []
    ctx = Context(profile=H100, settings=Settings(), host=Host(), shape=HGX8)
    r = cuda.Cuda().judged(ctx, f)
    assert r.status == Status.PASS and r.details["parts"]["xid"] == Status.PASS
    said = [line for line in r.lines if line.startswith("a job's own Xid since boot, not the node's: ")]
    assert [line.split(": ")[1].split(",")[0] for line in said] == ["Xid 13 on GPU 0 (0000:1b:00)", "Xid 31 on GPU 0 (0000:1b:00)",
                                                                   "Xid 43 on GPU 0 (0000:1b:00)", "Xid 45 on GPU 0 (0000:1b:00)"]
    assert all("pid 4242 (python)" in line for line in said) and len(r.details["xid_jobs"]) == 4


def test_a_channel_reset_that_follows_no_jobs_xid_is_still_the_nodes():
    # Xid 43 and 45 are the job's only after its own Xid on that GPU, from that process.
    other_gpu = JOB_FAULT.replace("0000:1b:00): 43", "0000:43:00): 43")
    other_pid = JOB_FAULT.replace("45, pid=4242", "45, pid=777")
    assert [x.summary for x in xid_findings(other_gpu)] == ["Xid 43 on GPU 1 (0000:43:00)"]
    assert [x.summary for x in xid_findings(other_pid)] == ["Xid 45 on GPU 0 (0000:1b:00)"]
    alone = "NVRM: Xid (PCI:0000:1b:00): 43, pid=4242, name=python, Ch 00000008\n"
    assert [(x.status, x.next.domain) for x in xid_findings(alone)] == [(Status.WARN, Domain.NODE)]
    # A node's own Xid beside a job's keeps its finding.
    found = xid_findings(JOB_FAULT + "NVRM: Xid (PCI:0000:1b:00): 48, An uncorrectable double bit error (DBE) has been detected\n")
    assert [(x.status, x.summary) for x in found] == [(Status.FAIL, "Xid 48 on GPU 0 (0000:1b:00)")]


def test_xid_on_a_known_gpu_names_its_index():
    line = "NVRM: Xid (PCI:0000:9d:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    f = facts("h100-sxm-8x-healthy.json", xid_events=xid.parse(line))
    (fail,) = judged(f)
    assert fail.status == Status.FAIL and fail.summary == "Xid 79 on GPU 4 (0000:9d:00)"


# The kernel log is the host's: a pod or job given GPUs 0-3 of eight reads the Xids of GPUs 4-7 too.
OTHERS = ("NVRM: Xid (PCI:0000:9d:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
          "NVRM: Xid (PCI:0000:c3:00): 48, An uncorrectable double bit error (DBE) has been detected\n"
          "NVRM: Xid (PCI:0000:d1:00): 13, pid=99, name=python, Graphics SM Warp Exception\n")


def given_four(how: str, f: cuda.CudaFacts) -> tuple[NodeShape, cuda.CudaFacts]:
    """A run given GPUs 0-3 of the healthy 8x board the way ``how`` gives them: its shape, and
    ``f`` with the inventory NVML then gives."""
    inv, buses = f.inventory, [nvml_facts.short_pci(g.pci_bus_id) for g in f.inventory.gpus]
    minors, pci = {bus: i for i, bus in enumerate(buses)}, shape.PciNvidia(gpus=buses, nvswitches=4)
    if how == "container":  # the NVIDIA hook mounts the given GPUs' driver entries and device nodes alone
        inv = inv.model_copy(update={"gpus": inv.gpus[:4]})
        node = shape.judge_shape(pci, [0, 1, 2, 3], dict(list(minors.items())[:4]), [], inv)
    elif how == "cgroup":  # Slurm's ConstrainDevices: every node listed, four refused, by the cgroup and by NVML
        refused = [nvml_facts.RefusedGpu(index=i, error="Insufficient Permissions") for i in range(4, 8)]
        inv = inv.model_copy(update={"gpus": inv.gpus[:4], "refused": refused})
        node = shape.judge_shape(pci, list(range(8)), minors, [], inv, refused=[4, 5, 6, 7])
    else:  # a Slurm step without a device cgroup: it may open all eight, CUDA sees four
        node = shape.judge_shape(pci, list(range(8)), minors, [], inv, cuda_visible="0,1,2,3")
    return node, f.model_copy(update={"inventory": inv})


@pytest.mark.parametrize("how", ["container", "cgroup", "CUDA_VISIBLE_DEVICES"])
def test_xids_on_gpus_given_to_another_run_are_said_not_judged(how):
    """Was: Xid 79 and 48 on GPUs 4 and 5, which another pod or job holds, FAILed this run with a
    reboot, though its four GPUs were healthy."""
    node, f = given_four(how, facts("h100-sxm-8x-healthy.json", init=None, xid_events=xid.parse(OTHERS)))
    assert node.gpus == 4 and node.not_given() == {"0000:9d:00", "0000:c3:00", "0000:d1:00", "0000:df:00"}
    assert judged(f, node=node) == []
    r = cuda.Cuda().judged(Context(profile=H100, settings=Settings(), host=Host(), shape=node), f)
    assert r.status == Status.PASS and r.details["parts"]["xid"] == Status.PASS
    said = [line for line in r.lines if line.startswith("Xid since boot not judged here: ")]
    # NVML names GPUs 4 and 5 where it lists them (CUDA_VISIBLE_DEVICES hides them from CUDA alone).
    named = how == "CUDA_VISIBLE_DEVICES"
    assert [line.split(": ")[1] for line in said] == ["Xid 79 on GPU 4 (0000:9d:00)" if named else "Xid 79 on 0000:9d:00",
                                                     "Xid 48 on GPU 5 (0000:c3:00)" if named else "Xid 48 on 0000:c3:00"]
    assert all(line.endswith("on a GPU not given to this run, judged by the run that holds it") for line in said)
    assert r.details["xid_elsewhere"] == [line.removeprefix("Xid since boot not judged here: ") for line in said]
    assert r.details["xid_jobs"] == []  # another job's own Xid 13 is neither this run's nor said as its job's


def test_an_xid_on_a_gpu_given_to_this_run_still_fails_beside_another_runs():
    mine = "NVRM: Xid (PCI:0000:43:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    node, f = given_four("cgroup", facts("h100-sxm-8x-healthy.json", init=None, xid_events=xid.parse(OTHERS + mine)))
    assert [(x.status, x.summary) for x in judged(f, node=node)] == [(Status.FAIL, "Xid 79 on GPU 1 (0000:43:00)")]


def test_an_xid_on_a_gpu_of_this_run_nvml_no_longer_lists_still_fails():
    # The job's GPU 2 fell off the bus and NVML lists it no more; NVML refuses 4-7, whose device
    # nodes the cgroup refuses: GPU 2 is the run's own and missing, never another job's.
    off = "NVRM: Xid (PCI:0000:52:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    f = facts("h100-sxm-8x-healthy.json", init=None, xid_events=xid.parse(off))
    buses = [nvml_facts.short_pci(g.pci_bus_id) for g in f.inventory.gpus]
    refused = [nvml_facts.RefusedGpu(index=i, error="Insufficient Permissions") for i in range(4, 8)]
    f = f.model_copy(update={"inventory": f.inventory.model_copy(update={"gpus": [f.inventory.gpus[i] for i in (0, 1, 3)], "refused": refused})})
    node = shape.judge_shape(shape.PciNvidia(gpus=buses, nvswitches=4), list(range(8)), {b: i for i, b in enumerate(buses)}, [], f.inventory,
                             refused=[4, 5, 6, 7])
    assert node.gpus == 4 and "0000:52:00" not in node.not_given()
    assert ("Xid 79 on 0000:52:00", Status.FAIL) in [(x.summary, x.status) for x in judged(f, node=node)]


def test_xids_are_all_judged_where_the_run_has_every_gpu_or_its_own_are_not_each_named():
    f = facts("h100-sxm-8x-healthy.json", init=None, xid_events=xid.parse(OTHERS))
    buses = [nvml_facts.short_pci(g.pci_bus_id) for g in f.inventory.gpus]
    whole = shape.judge_shape(shape.PciNvidia(gpus=buses, nvswitches=4), list(range(8)), {b: i for i, b in enumerate(buses)}, [], f.inventory)
    # The bus lists eight, /dev four, and the driver names no minor: which four are this run's is unknown.
    unnamed = shape.judge_shape(shape.PciNvidia(gpus=buses, nvswitches=4), [0, 1, 2, 3], {}, [], f.inventory.model_copy(update={"gpus": f.inventory.gpus[:4]}))
    for node in (whole, unnamed, None):
        assert node is None or node.not_given() == set()
        assert [x.summary for x in only(judged(f, node=node))] == ["Xid 79 on GPU 4 (0000:9d:00)", "Xid 48 on GPU 5 (0000:c3:00)"]
    # A slot the bus does not list (a log from another boot, a GPU gone from sysfs) is still judged.
    node, gone = given_four("cgroup", facts("h100-sxm-8x-healthy.json", init=None,
                                            xid_events=xid.parse("NVRM: Xid (PCI:0000:ee:00): 79, GPU has fallen off the bus.\n")))
    assert [x.summary for x in only(judged(gone, node=node))] == ["Xid 79 on 0000:ee:00"]


def test_a_fatal_xid_read_only_through_syslog2_warns_as_another_user_could_have_written_it():
    """No /dev/kmsg and no journal (a container), dmesg through syslog(2): a message's end is lost,
    so a user's newline makes a line that reads as the driver's. Not enough to drain a node."""
    line = "[  219.470994] NVRM: Xid (PCI:0000:9d:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    f = facts("h100-sxm-8x-healthy.json", xid_events=xid.parse(line), kernel_log_note=log_sources.SYSLOG_NOTE)
    (warn,) = judged(f)
    assert warn.status == Status.WARN and warn.summary == "Xid 79 on GPU 4 (0000:9d:00)"
    assert "syslog(2)" in warn.cause and "journalctl -k -b" in warn.cause


def test_xid63_after_the_remap_was_activated_only_warns():
    line = "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.\n"
    pending = facts("a100-sxm4-8x-remap-pending.json", init=None, xid_events=xid.parse(line))
    assert any(x.status == Status.FAIL and x.summary.startswith("Xid 63") for x in judged(pending, A100))
    inv = pending.inventory
    activated = nvml_facts.RemappedRows(correctable=1, uncorrectable=0, pending=False, failure=False)
    gpus = [g.model_copy(update={"remapped_rows": activated}) for g in inv.gpus]
    done = pending.model_copy(update={"inventory": inv.model_copy(update={"gpus": gpus})})
    assert [(x.status, x.summary) for x in judged(done, A100)] == [(Status.WARN, "Xid 63 on GPU 2 (0000:10:1c)")]
    unknown = [g.model_copy(update={"remapped_rows": None}) for g in inv.gpus]  # NVML cannot say: not done
    still = pending.model_copy(update={"inventory": inv.model_copy(update={"gpus": unknown})})
    assert [(x.status, x.summary) for x in judged(still, A100)] == [(Status.FAIL, "Xid 63 on GPU 2 (0000:10:1c)")]


def test_an_unreadable_kernel_log_leaves_the_xids_unjudged_saying_why_never_a_warning():
    # A container without CAP_SYSLOG on a dmesg_restrict host: the reader's trouble, not the node's.
    f = facts("h100-sxm-8x-healthy.json", init=None).model_copy(update={"kernel_log": "unavailable: permission denied"})
    assert judged(f) == []
    assert cuda.xid_unjudged(f).startswith("not judged: the kernel log could not be read (unavailable: permission denied); give preflight CAP_SYSLOG")
    assert cuda.xid_unjudged(facts("h100-sxm-8x-healthy.json", init=None)) is None


def test_a_summary_never_vouches_for_xids_the_kernel_log_did_not_show():
    # Was "...; no fatal Xid since boot" on a PASS whose kernel log no source could read: the line a
    # person reads first claimed a clean log preflight never saw (an Xid 79 there would read the same).
    f = facts("h100-sxm-8x-healthy.json", init=None).model_copy(update={"kernel_log": "unavailable: permission denied"})
    assert "no fatal Xid" not in cuda.summary(f)
    assert "Xid errors since boot not judged (kernel log unreadable)" in cuda.summary(f)
    assert cuda.summary(facts("h100-sxm-8x-healthy.json", init=None)).endswith("; no fatal Xid since boot")


@pytest.mark.parametrize(
    "report, summary, remedy",
    [
        ("unknown-error", "CUDA init failed: CUDA could not initialise a GPU (`CUDA unknown error`)", "CUDA_VISIBLE_DEVICES"),
        ("fabric-manager-down", "CUDA init failed: the NVSwitch fabric is not up", "nvidia-fabricmanager"),
        ("hung-on-3", "CUDA init hung on GPU 3 (0000:61:00.0)", "nvidia-smi -r -i 3"),
        ("wrong-matmul-on-6", "GPU 6 (0000:d1:00.0) computes wrong results", "dcgmi diag"),
        # CUDA device 1 is NVML's GPU 5 here (CUDA_VISIBLE_DEVICES=4,5,6,7): the PCI address decides, not the index.
        # Was led by "CUDA sees 4 GPUs, NVML 8": the four the variable names are what CUDA should see.
        ("visible-4-7-nan-on-cuda1", "GPU 5 (0000:c3:00.0) computes wrong results", "dcgmi diag"),
    ],
)
def test_cuda_init_failures_name_cause_and_remedy(report, summary, remedy):
    f = facts("h100-sxm-8x-healthy.json", init=report)
    if report.startswith("hung"):
        f.init.timed_out, f.init.returncode, f.init.ended = True, None, "killed at the deadline after 55 s"
    fails = only(judged(f))
    assert fails[0].summary == summary
    assert remedy in fails[0].remedy
    assert len(fails) == 1


def test_error_803_names_a_cuda_library_that_does_not_match_the_kernel_module():
    # torch's words for cudaErrorSystemDriverMismatch (803), as users paste them (e.g. NVIDIA/nvidia-docker#1256,
    # llm-d/llm-d#706): libcuda from another driver than the loaded module, or cuda-compat on a branch it does not
    # support. Was the generic "CUDA init failed" with a GPU reset and dcgmi diag: hardware blamed for a library.
    f = facts("h100-sxm-8x-healthy.json", init="unknown-error")
    error = ("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
             "NumCudaDevices() that might have already set an error? Error 803: system has unsupported display driver / "
             "cuda driver combination")
    f.init.report.error = error
    (fail,) = only(judged(f))
    assert fail.summary == "CUDA init failed: the CUDA driver library does not match the loaded kernel module"
    assert "Error 803" in fail.cause and "cuda-compat" in fail.remedy and "/proc/driver/nvidia/version" in fail.remedy
    assert "dcgmi" not in fail.remedy


def visible(cvd: str, count: int, first: int = 0) -> cuda.CudaFacts:
    """The healthy node's worker run under CUDA_VISIBLE_DEVICES=``cvd``, CUDA showing ``count`` devices: NVML's GPUs from ``first``."""
    f = facts("h100-sxm-8x-healthy.json")
    r = f.init.report
    r = r.model_copy(update={"cuda_visible_devices": cvd, "device_count": count, "devices": [d.model_copy(update={"index": i}) for i, d in enumerate(r.devices[first:first + count])],
                             "pci_bus_ids": r.pci_bus_ids[first:first + count]})
    return f.model_copy(update={"init": f.init.model_copy(update={"report": r})})


@pytest.mark.parametrize("cvd, count, first", [
    ("0,1,2,3", 4, 0),  # tests/fixtures/cuda_init/cuda-visible-4.json's; was "CUDA sees 4 GPUs, NVML 8", a FAIL that drained
    ("4,5,6,7", 4, 4),  # a Slurm step given GPUs 4-7 of a node without a device cgroup
    ("GPU-5c1b0c7e-8f2a-4d3b-9e6a-000000000004,GPU-5c1b0c7e-8f2a-4d3b-9e6a-000000000005", 2, 4),  # Slurm 25.11 writes UUIDs
    ("GPU-5c1b0c7e-8f2a-4d3b-9e6a-000000000006", 1, 6),
    ("6,7,-1,0", 2, 6),  # CUDA stops at the first invalid entry
])
def test_cuda_showing_the_gpus_cuda_visible_devices_names_passes(cvd, count, first):
    assert judged(visible(cvd, count, first)) == []


def test_cuda_showing_other_than_cuda_visible_devices_names_still_fails():
    (fail,) = only(judged(visible("4,5,6,7", 3, 4)))
    assert fail.summary == "CUDA sees 3 GPUs, CUDA_VISIBLE_DEVICES names 4"
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7 names 4 of the 8 GPUs NVML lists" in fail.cause and "dcgmi diag" in fail.remedy
    (fail,) = only(judged(visible("4,5,-1,6", 3, 4)))
    assert fail.summary == "CUDA sees 3 GPUs, CUDA_VISIBLE_DEVICES names 2" and "CUDA stops at '-1'" in fail.cause
    (fail,) = only(judged(visible("GPU-5c1b0c7e-8f2a-4d3b-9e6a-00000000000", 1, 0)))  # a prefix that names every GPU
    assert fail.summary == "CUDA sees 1 GPUs, CUDA_VISIBLE_DEVICES names 0"
    # Unset, CUDA is held to every GPU NVML lists, as before.
    unset = visible("x", 4, 0)
    unset.init.report.cuda_visible_devices = None
    assert [x.summary for x in only(judged(unset))] == ["CUDA sees 4 GPUs, NVML 8"]


def test_a_run_on_fake_facts_never_passes():
    f = facts("h100-sxm-8x-healthy.json")
    fake = f.model_copy(update={"inventory": f.inventory.model_copy(update={"source": "fake /tmp/x.json"})})
    parts = cuda.judge(fake, HGX8, H100.gpu, None)
    assert parts["inventory"] == [] and [x.summary for x in parts["source"]] == ["NVML facts are FAKE"]


def test_xid_severity_is_the_worst_of_its_events_and_154_the_last():
    log = (
        "NVRM: Xid (PCI:0000:1b:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 02\n"
        "NVRM: Xid (PCI:0000:1b:00): 145, RLW_REMAP Fatal XC0 i0 Link 02\n"
        "NVRM: Xid (PCI:0000:43:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)\n"
        "NVRM: Xid (PCI:0000:43:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)\n"
    )
    found = judged(facts("h100-sxm-8x-healthy.json", xid_events=xid.parse(log)))
    assert [(x.status, x.summary) for x in found] == [(Status.FAIL, "Xid 145 on GPU 0 (0000:1b:00)")]
    assert "fails until the node reboots" in found[0].remedy


def xid_findings(log: str, **kw):
    return judged(facts("h100-sxm-8x-healthy.json", xid_events=xid.parse(log), **kw))


@pytest.mark.parametrize("line, status, action, domain, bucket", [
    ("NVRM: Xid (PCI:0000:9d:00): 79, pid=1234, name=python, GPU has fallen off the bus.", Status.FAIL, Action.REBOOT, Domain.NODE, "79 RESTART_BM"),
    ("NVRM: Xid (PCI:0000:9d:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 7, subpartition 1.",
     # The catalog's reset would mend the GPU, but the event stays in the log this check reads until a reboot.
     Status.FAIL, Action.REBOOT, Domain.NODE, "48 WORKFLOW_XID_48"),
    ("NVRM: Xid (PCI:0000:9d:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     Status.FAIL, Action.RESET_GPU, Domain.NODE, "154 XID_154"),
])
def test_each_xid_finding_carries_its_catalog_action(line, status, action, domain, bucket):
    (found,) = xid_findings(line + "\n")
    assert (found.status, found.next.action, found.next.domain) == (status, action, domain)
    assert found.next.source.startswith(f"NVIDIA Xid catalog (2026-11-22): Xid {bucket}")


@pytest.mark.parametrize("line, bucket", [
    # Were WARN findings (fix-job, job): the catalog's RESTART_APP is the job's, and the node is fine.
    ("NVRM: Xid (PCI:0000:9d:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address", "13 RESTART_APP"),
    ("NVRM: Xid (PCI:0000:9d:00): 31, pid=1942, name=llama-bench, Ch 00000008, intr 00000000. MMU Fault", "31 RESTART_APP"),
])
def test_an_xid_the_catalog_lays_to_the_job_is_no_finding_and_carries_its_catalog_source(line, bucket):
    assert xid_findings(line + "\n") == []
    (said,) = cuda.job_xids(xid.parse(line + "\n"), facts("h100-sxm-8x-healthy.json").inventory)
    assert "GPU 4 (0000:9d:00)" in said and f"NVIDIA Xid catalog (2026-11-22): Xid {bucket}" in said


def test_a_run_with_several_xids_takes_the_highest_action():
    log = ("NVRM: Xid (PCI:0000:9d:00): 13, Graphics SM Warp Exception\n"
           "NVRM: Xid (PCI:0000:1b:00): 48, An uncorrectable double bit error (DBE) has been detected\n"
           "NVRM: Xid (PCI:0000:43:00): 79, GPU has fallen off the bus.\n")
    r = cuda.Cuda().conclude(xid_findings(log), "ok")
    assert (r.status, r.action, r.domain) == (Status.FAIL, Action.REBOOT, Domain.NODE)
    # Xid 48 asks a reboot too here (its reset would not clear this since-boot check): the first of equals names it.
    assert r.action_source.startswith("NVIDIA Xid catalog (2026-11-22): Xid 48 WORKFLOW_XID_48") and "until the node reboots" in r.action_source
    # Was WARN (fix-job, job): a job's own Xid is no finding of the node.
    app_only = cuda.Cuda().conclude(xid_findings("NVRM: Xid (PCI:0000:9d:00): 13, Graphics SM Warp Exception\n"), "ok")
    assert (app_only.status, app_only.action) == (Status.PASS, Action.NONE)


def test_an_xid_the_judge_only_warns_of_asks_no_more_than_a_watch():
    line = "[  219.470994] NVRM: Xid (PCI:0000:9d:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    (forged,) = xid_findings(line, kernel_log_note=log_sources.SYSLOG_NOTE)
    assert (forged.status, forged.next.action) == (Status.WARN, Action.WATCH) and "syslog(2)" in forged.next.source
    line = "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.\n"
    pending = facts("a100-sxm4-8x-remap-pending.json", init=None, xid_events=xid.parse(line))
    (fail,) = [x for x in judged(pending, A100) if x.summary.startswith("Xid 63")]
    assert fail.next.action == Action.RESET_GPU and "reset gpu to activate" in fail.next.source
    activated = nvml_facts.RemappedRows(correctable=1, uncorrectable=0, pending=False, failure=False)
    gpus = [g.model_copy(update={"remapped_rows": activated}) for g in pending.inventory.gpus]
    done = pending.model_copy(update={"inventory": pending.inventory.model_copy(update={"gpus": gpus})})
    (warn,) = judged(done, A100)
    assert (warn.status, warn.next.action) == (Status.WARN, Action.WATCH) and "remap is active" in warn.next.source


def test_an_unknown_xid_warns():
    found = judged(facts("h100-sxm-8x-healthy.json", xid_events=xid.parse("NVRM: Xid (PCI:0000:1b:00): 999, something new\n")))
    assert [(x.status, x.summary) for x in found] == [(Status.WARN, "Xid 999 on GPU 0 (0000:1b:00)")]


def test_a_lost_gpu_without_an_address_is_named_from_sysfs():
    f = facts("all-lost.json", init=None)
    lost1 = next(x for x in judged(f, node=tree_shape(f)) if x.summary.startswith("GPU 1 "))
    assert lost1.summary == "GPU 1 (PCI address unknown) is lost"
    # GPUs 0 and 2 were lost with their addresses: the candidates for GPU 1 are the rest.
    assert "not answering NVML: 0000:43:00.0, 0000:61:00.0, 0000:9d:00.0" in lost1.cause


# ---- the gatherer, for real ------------------------------------------------


def sleeping(seconds: int) -> list[psutil.Process]:
    """Every `sleep SECONDS` on the machine (each test uses its own number)."""
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", str(seconds)]]


def test_the_real_worker_on_cpu_torch_reports_no_cuda_device():
    outcome, loaded = cuda.run_init(sys.executable, timeout=60, read_links=False)
    assert outcome.report is not None and outcome.report.error_kind == "cpu_build"
    assert outcome.report.torch_version and outcome.report.torch_version.startswith("2.")
    (fail,) = cuda.judge_init(outcome, FakeNvml(NVML / "h100-sxm-8x-healthy.json"))
    assert fail.summary == "no CUDA device: torch is a CPU-only build"
    assert sys.executable in fail.cause and loaded is None


def test_an_interpreter_without_torch_fails_naming_it(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    outcome, _ = cuda.run_init(python, timeout=30, read_links=False)
    (fail,) = cuda.judge_init(outcome, FakeNvml(NVML / "h100-sxm-8x-healthy.json"))
    assert fail.cause.startswith(f"torch not importable by {python}: ModuleNotFoundError")


def test_a_hanging_worker_is_killed_at_its_deadline_with_everything_it_started(tmp_path):
    # The stand-in starts a grandchild and hangs, as a wedged CUDA init would.
    python = python_script(tmp_path, "sleep 3013 &\nsleep 3013\n")
    start = time.monotonic()
    outcome, _ = cuda.run_init(python, timeout=1.5, read_links=False)
    assert time.monotonic() - start < 6
    assert outcome.timed_out and outcome.report is None
    assert not sleeping(3013)  # searched machine-wide: an escaped grandchild is not our descendant
    (fail,) = cuda.judge_init(outcome, FakeNvml(NVML / "h100-sxm-8x-healthy.json"))
    assert fail.summary == "CUDA init hung" and "killed at the deadline" in fail.cause


def test_a_crashing_worker_fails_with_how_it_ended(tmp_path):
    python = python_script(tmp_path, 'echo "Fatal Python error: Segmentation fault" >&2\nkill -SEGV $$\n')
    outcome, _ = cuda.run_init(python, timeout=10, read_links=False)
    (fail,) = cuda.judge_init(outcome, FakeNvml(NVML / "h100-sxm-8x-healthy.json"))
    assert "killed by SIGSEGV" in fail.cause and "Segmentation fault" in fail.cause


def test_a_worker_printing_garbage_fails_cleanly(tmp_path):
    # Prints nonsense, writes nonsense where its report belongs, and exits 0.
    python = python_script(tmp_path, 'echo "garbage \\x00\\x01 out"\nprintf "{not json" > "$3/rank0.json"\nexit 0\n')
    outcome, _ = cuda.run_init(python, timeout=10, read_links=False)
    (fail,) = cuda.judge_init(outcome, FakeNvml(NVML / "h100-sxm-8x-healthy.json"))
    assert fail.summary == "the CUDA init worker failed"
    assert "rank0.json is not JSON" in fail.cause and "exit 0" in fail.cause


def test_a_worker_report_of_the_wrong_shape_fails_cleanly(tmp_path):
    python = python_script(tmp_path, 'echo \'{"stage": 5}\' > "$3/rank0.json"\n')
    outcome, _ = cuda.run_init(python, timeout=10, read_links=False)
    (fail,) = cuda.judge_init(outcome, FakeNvml(NVML / "h100-sxm-8x-healthy.json"))
    assert "does not fit the expected shape" in fail.cause


def test_no_torch_import_in_the_agent():
    # Workers import torch; the agent must not (seconds of startup, and the user's CUDA build).
    code = "import preflight.checks.cuda, sys; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


@pytest.mark.gpu
def test_cuda_init_on_every_real_gpu():
    from preflight.readers.nvidia import nvml

    inv = nvml.inventory()
    outcome, loaded = cuda.run_init(sys.executable, timeout=120, read_links=True)
    assert outcome.report and outcome.report.stage == "done", outcome
    assert cuda.judge_init(outcome, inv) == []
    assert loaded and set(loaded) == {g.pci_bus_id for g in inv.gpus}
    print({d.index: d.seconds for d in outcome.report.devices}, outcome.seconds, loaded)


@pytest.mark.gpu
def test_cuda_init_in_the_shared_launch_leaves_each_rank_its_own_gpu():
    # One rank per GPU, as the run starts them: each probes and loads only its own, so
    # on a node in EXCLUSIVE_PROCESS mode the next stage's ranks can still take theirs.
    from preflight.gpuwork.world import Worlds
    from preflight.readers.nvidia import nvml

    inv = nvml.inventory()
    worlds = Worlds()
    try:
        outcome, loaded = cuda.run_init(sys.executable, timeout=180, read_links=True, worlds=worlds, nproc=len(inv.gpus))
    finally:
        worlds.close()
    r = outcome.report
    assert r and r.stage == "done" and cuda.judge_init(outcome, inv) == [], outcome
    assert r.probed == {k: [k] for k in range(len(inv.gpus))} and [d.rank for d in r.devices] == list(range(len(inv.gpus)))
    assert loaded and set(loaded) == {g.pci_bus_id for g in inv.gpus}



# ---- through the CLI, as the "done when" reads -------------------------

from conftest import no_driver, run_preflight  # noqa: E402

from preflight.pipeline.report import Report  # noqa: E402


@no_driver
def test_h100_profile_on_a_machine_without_a_driver_fails_with_the_cause():
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "cuda", "--json"])
    assert p.returncode == 1, p.stderr
    (c,) = Report.model_validate_json(p.stdout).checks
    assert c.check == "cuda" and c.status == Status.FAIL and c.cause.startswith("no NVIDIA driver")


def test_fake_healthy_node_passes_the_inventory_and_fails_cuda_init_on_cpu_torch(tmp_path):
    report = tmp_path / "r.json"
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "cuda", "--report", str(report), "--nvml-fake", str(NVML / "h100-sxm-8x-healthy.json")])
    assert p.returncode == 1 and "Traceback" not in p.stderr
    (c,) = Report.model_validate_json(report.read_text()).checks
    parts = c.details["parts"]
    assert (parts["inventory"], parts["cuda_init"], parts["source"]) == ("PASS", "FAIL", "FAIL")
    assert parts["xid"] in ("PASS", "WARN")  # this machine's own kernel log: unreadable in some containers
    assert c.summary.startswith("no CUDA device: torch is a CPU-only build (+1 more) (inventory")
    assert "the NVML facts came from" in c.cause and "not from this node's driver" in c.cause
    assert c.details["init"]["report"]["torch_version"].startswith("2.")
    assert c.details["pcie_generation"] == "not judged: the cuda_init worker never loaded the links"
    assert "PCIe generation not judged: the cuda_init worker never loaded the links" in c.lines


def test_fake_x8_link_fails_the_inventory_naming_the_gpu(tmp_path):
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "cuda", "--json", "--nvml-fake", str(NVML / "h100-sxm-pcie-x8.json")])
    (c,) = Report.model_validate_json(p.stdout).checks
    assert p.returncode == 1 and c.details["parts"]["inventory"] == "FAIL"
    assert "GPU 2 (0000:52:00.0)'s PCIe link trained at x8" in c.cause


def test_a_malformed_fake_exits_2_naming_the_field_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.json"
    data = json.loads((NVML / "h100-sxm-8x-healthy.json").read_text())
    data["gpus"][1]["pcie"]["width"] = "sixteen"
    bad.write_text(json.dumps(data))
    report = tmp_path / "r.json"
    p = run_preflight(["run", "--profile", "h100-sxm", "--report", str(report), "--nvml-fake", str(bad)])
    assert p.returncode == 2
    assert p.stderr.strip().endswith("field gpus.1.pcie.width: Input should be a valid integer, unable to parse string as an integer")
    assert p.stderr.count("\n") == 1 and not report.exists()


def test_nvml_asking_for_a_gpu_reset_makes_a_quick_runs_action_reset_gpu(tmp_path):
    # The driver's recovery action outranks the fake facts' own FAIL (a drain): the run asks for the reset.
    report = tmp_path / "r.json"
    p = run_preflight(["run", "--profile", "h100-sxm", "--level", "quick", "--only", "cuda", "--report", str(report),
                       "--nvml-fake", str(NVML / "h100-sxm-gpu2-recovery-reset.json")])
    assert p.returncode == 1 and "Traceback" not in p.stderr
    data = json.loads(report.read_text())
    assert (data["action"], data["domain"], data["action_check"]) == ("reset-gpu", "node", "cuda")
    assert data["action_source"] == "NVML recovery action on GPU 2: GPU reset (nvmlDeviceGetFieldValues, field 230)"
    (c,) = data["checks"]
    assert c["details"]["parts"]["inventory"] == "FAIL" and c["details"]["recovery_action"]["2"] == "GPU reset"
    assert c["details"]["recovery_action"]["0"] == "none"


def test_a_recovery_action_nvml_did_not_give_is_said_in_details_and_judged_no_further():
    f = facts("h100-sxm-gpu3-recovery-unanswered.json", init=None)
    assert judged(f) == []
    r = cuda.Cuda().judged(Context(profile=H100, settings=Settings(level="quick"), host=Host(), shape=HGX8), f)
    assert r.details["recovery_action"]["3"].startswith("unknown (driver does not report it")
    assert r.status == Status.PASS and str(r.action) == "none"


def test_python_that_does_not_exist_is_a_usage_error(tmp_path):
    p = run_preflight(["run", "--profile", "h100-sxm", "--python", str(tmp_path / "nope" / "python")])
    assert p.returncode == 2 and "no such file; point it at the training environment's interpreter" in p.stderr


def test_python_that_is_no_python_fails_naming_it_with_its_exit_status(tmp_path):
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "cuda", "--json", "--python", "/bin/false", "--nvml-fake", str(NVML / "h100-sxm-8x-healthy.json")])
    (c,) = Report.model_validate_json(p.stdout).checks
    assert p.returncode == 1 and c.status == "FAIL"
    assert "/bin/false exited 1 with no output; the cuda_init worker under /bin/false exit 1" in c.cause, c.cause
    assert "point --python (PREFLIGHT_PYTHON, or python in the config file) at the training environment's interpreter" in c.remedy


def test_python_without_torch_fails_naming_the_interpreter(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "cuda", "--json", "--python", python, "--nvml-fake", str(NVML / "h100-sxm-8x-healthy.json")])
    (c,) = Report.model_validate_json(p.stdout).checks
    assert p.returncode == 1 and c.cause.startswith(f"torch not importable by {python}")


def test_a_hung_worker_fails_within_the_profiles_deadline_and_leaves_nothing(tmp_path):
    site = tmp_path / "profiles"
    site.mkdir()
    text = (profiles.BUILTIN_DIR / "h100-sxm.toml").read_text()
    (site / "h100-sxm.toml").write_text(text + "\n[timeouts]\ncuda = 8\n")
    python = python_script(tmp_path, "sleep 3011 &\nexec sleep 3011\n")  # a child, then hang
    env = {**os.environ, "PREFLIGHT_PROFILES_DIR": str(site)}
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "cuda", "--json", "--python", python, "--nvml-fake", str(NVML / "h100-sxm-8x-healthy.json")], env=env, timeout=60)
    (c,) = Report.model_validate_json(p.stdout).checks
    assert p.returncode == 1 and c.summary.startswith("CUDA init hung")
    # Ended by its own 8 s deadline (the check's time, kill and sweep included; not the
    # interpreter's start-up, which a loaded machine stretches), not by the 60 s guard.
    assert c.duration_seconds < 8 + 10
    assert not sleeping(3011)


def test_a_relative_python_is_found_from_where_preflight_was_started(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "cuda", "--json", "--python", "venv/bin/python", "--nvml-fake", str(NVML / "h100-sxm-8x-healthy.json")], cwd=tmp_path)
    (c,) = Report.model_validate_json(p.stdout).checks
    assert c.cause.startswith(f"torch not importable by {venv}/bin/python")


def test_a_health_query_nvml_cannot_answer_fails_others_warn():
    fails = only(judged(facts("h100-sxm-ecc-unanswered.json")))
    assert [f.summary for f in fails] == ["GPU 3 (0000:61:00.0): NVML queries failed"]
    assert "nvmlDeviceGetTotalEccErrors (Unknown Error)" in fails[0].cause and "memory health is unknown" in fails[0].cause
    g = facts("h100-sxm-8x-healthy.json").inventory.gpus[0].model_copy(update={"unanswered": {"nvmlDeviceGetTemperature": "Unknown Error"}})
    assert [f.status for f in gpu_health.judge_gpu(g, H100.gpu)] == [Status.WARN]


def test_a_fake_file_cannot_claim_to_be_nvml(tmp_path):
    data = json.loads((NVML / "h100-sxm-8x-healthy.json").read_text())
    data["source"] = "NVML"
    path = tmp_path / "sneaky.json"
    path.write_text(json.dumps(data))
    assert FakeNvml(path).source == f"fake {path}"


def test_a_one_gpu_h100_pcie_without_bridges_passes():
    # One H100 PCIe card and no NVLink bridge: every link answers "inactive", NVML reports no far end.
    pcie = profiles.load(profiles.BUILTIN_DIR / "h100-pcie.toml")
    g = facts("h100-sxm-8x-healthy.json").inventory.gpus[0].model_copy(
        update={"name": "NVIDIA H100 PCIe", "pci_device_id": "0x2331", "nvlinks_active": 0, "nvlink_remote": None, "power_limit_w": 350.0, "power_default_limit_w": 350.0})
    inv = facts("h100-sxm-8x-healthy.json").inventory.model_copy(update={"gpus": [g]})
    node = shape.judge_shape(shape.PciNvidia(gpus=["0000:1b:00.0"]), [0], {"0000:1b:00.0": 0}, [], inv)
    assert (node.gpus, node.fabric) == (1, "single")
    report = InitReport.model_validate_json((INIT / "healthy-8x.json").read_text())
    report = report.model_copy(update={"devices": report.devices[:1], "pci_bus_ids": report.pci_bus_ids[:1], "device_count": 1})
    init = InitOutcome(python=report.python, ended="exit 0", returncode=0, timed_out=False, seconds=1.0, report=report)
    assert judged(cuda.CudaFacts(inventory=inv, kernel_log="/dev/kmsg", init=init), profile=pcie, node=node) == []


def test_prohibited_compute_mode_fails_naming_the_mode_and_the_fix():
    f = facts("h100-sxm-8x-prohibited.json", init=None)
    fails = only(judged(f))
    assert len(fails) == 8 and fails[0].summary == "GPU 0 (0000:1b:00.0): compute mode PROHIBITED"
    assert "no process can create a CUDA context" in fails[0].cause and "`nvidia-smi -i 0 -c DEFAULT`" in fails[0].remedy
    assert [g.index for g in gpu_health.prohibited(f.inventory)] == list(range(8))  # CUDA init is not tried there


def test_exclusive_process_compute_mode_is_what_a_job_of_one_process_per_gpu_needs():
    f = facts("h100-sxm-8x-exclusive-process.json")
    assert {g.compute_mode for g in f.inventory.gpus} == {"exclusive_process"}
    assert judged(f) == [] and gpu_health.prohibited(f.inventory) == []


def test_a_fake_prohibited_node_fails_naming_the_mode_and_tries_no_cuda_init(tmp_path):
    report = tmp_path / "r.json"
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "cuda", "--report", str(report), "--nvml-fake", str(NVML / "h100-sxm-8x-prohibited.json")])
    assert p.returncode == 1 and "Traceback" not in p.stderr
    (c,) = Report.model_validate_json(report.read_text()).checks
    assert c.details["parts"]["inventory"] == "FAIL" and c.details["init"] is None
    assert c.details["parts"]["cuda_init"] == "not run: NVML reports compute mode PROHIBITED on " + ", ".join(
        f"GPU {g.index} ({nvml_facts.short_pci(g.pci_bus_id)})" for g in FakeNvml(NVML / "h100-sxm-8x-prohibited.json").gpus)
    assert "compute mode PROHIBITED" in c.summary and "`nvidia-smi -i 0 -c DEFAULT`" in c.remedy


# ---- the Xid scan when journalctl's output cannot be read --------------------------------------


@pytest.mark.parametrize("bad", ["nothing", "garbage", "binary"])
def test_an_unreadable_journalctl_is_named_and_dmesg_answers_for_the_xid_scan(tmp_path, bad):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=fakes.BAD_OUTPUT[bad])
    fakes.tool(bin_dir, "dmesg", prints=FIXTURES / "xid" / "no-gpu-event_dmesg_dev-machine-boot.txt")
    ctx = Context(profile=H100, settings=Settings(level="quick", nvml_fake=NVML / "h100-sxm-8x-healthy.json"),
                  host=Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), deadline=time.monotonic() + 60, shape=HGX8)
    r = cuda.Cuda().run(ctx)
    assert r.details["parts"]["xid"] == Status.PASS and r.details["kernel_log"] == "dmesg"
    assert r.details["sources"] == {"kernel log": "dmesg"}
    assert set(r.details["unread"]) == {str(tmp_path / "root" / "dev" / "kmsg"), "journalctl"}
    assert {m.labels["tool"]: m.labels["fallback"] for m in r.measurements if m.name == "tool_unreadable"}["journalctl"] == "dmesg"
    assert any(line.startswith("unreadable output, not the node's fault") and "journalctl" in line for line in r.lines)


def test_no_readable_kernel_log_leaves_xids_unjudged_and_names_every_source(tmp_path):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=fakes.BAD_OUTPUT["garbage"])
    fakes.tool(bin_dir, "dmesg", prints=b"", exit_code=1)
    ctx = Context(profile=H100, settings=Settings(level="quick", nvml_fake=NVML / "h100-sxm-8x-healthy.json"),
                  host=Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), deadline=time.monotonic() + 60, shape=HGX8)
    r = cuda.Cuda().run(ctx)
    assert r.details["parts"]["xid"].startswith("not judged: the kernel log could not be read") and "sources" not in r.details
    assert any(line.startswith("Xid errors since boot: not judged") for line in r.lines)
    assert r.summary.endswith("(inventory passed)"), r.summary  # not judged is not passed
    assert {m.labels["tool"]: m.labels["fallback"] for m in r.measurements if m.name == "tool_unreadable"} == {
        str(tmp_path / "root" / "dev" / "kmsg"): "none", "journalctl": "none", "dmesg": "none"}


# ---- a kernel ring a user flushed: the journal still holds the Xid -------------------------------------


def _wrapped_ring_ctx(tmp_path, kmsg: str, journal=None) -> Context:
    # Both /dev/kmsg texts start past record #0: the ring wrapped since boot (a flood of messages can push an Xid out).
    (tmp_path / "root" / "dev").mkdir(parents=True)
    (tmp_path / "root" / "dev" / "kmsg").write_text((FIXTURES / "xid" / kmsg).read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if journal is not None:
        fakes.tool(bin_dir, "journalctl", prints=journal)
    return Context(profile=H100, settings=Settings(level="quick", nvml_fake=NVML / "h100-sxm-8x-healthy.json"),
                   host=Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), deadline=time.monotonic() + 60, shape=HGX8)


def test_an_xid_pushed_out_of_a_wrapped_ring_is_read_from_the_journal(tmp_path):
    r = cuda.Cuda().run(_wrapped_ring_ctx(tmp_path, "kmsg_xid79_fell-off-bus_xid154_sxid_handmade.txt",
                                          FIXTURES / "journal" / "journalctl-json_ring-wrapped_xid48-at-3s_xid79-also-in-ring_handmade.txt"))
    assert r.details["parts"]["xid"] == Status.FAIL
    assert [e["code"] for e in r.details["xid_events"]] == [48, 79, None, 154, 24007]
    assert r.details["kernel_log"].endswith(" + journalctl -k -b --no-pager -o json")
    assert any(line.startswith("kernel log: the kernel ring had wrapped") for line in r.lines)


def test_a_wrapped_ring_without_a_journal_is_a_note_not_a_warning(tmp_path):
    r = cuda.Cuda().run(_wrapped_ring_ctx(tmp_path, "no-gpu-event_kmsg_dev-machine-boot.txt"))
    assert r.details["parts"]["xid"] == Status.PASS
    assert "cannot be seen" in r.details["kernel_log_note"]
