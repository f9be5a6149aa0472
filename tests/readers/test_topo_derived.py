"""The `nvidia-smi topo -m` facts built from NVML and sysfs where the matrix cannot
be read: the recorded DGX H100 (its sysfs tree with the PCI tree of capture 03, its
NVML facts) must give back the very matrix nvidia-smi printed, and a fact no
source answers must be said unanswered, never guessed."""

import json
import shutil
import sys
import time
from pathlib import Path

from preflight.base.host import Host
from preflight.readers.machine import layout
from preflight.readers.nvidia import topo
from preflight.readers.machine import topo_derived
from topology_cases import FIXTURES, HEALTHY, SPLIT, pci_tree, root, unreadable_smi  # noqa: F401 (root: a fixture)

AFFINITY = FIXTURES / "nvml" / "h100-sxm-8x-affinity.json"


def derived(root: Path, nvml_file: Path = AFFINITY) -> layout.TopologyFacts:
    h = Host(root, environ={"PATH": str(unreadable_smi(root.parent))})
    facts = layout.gather(h, nvml_file, sys.executable, time.monotonic() + 30)
    assert facts.matrix is None and "cannot read" in (facts.matrix_error or "")
    return topo_derived.complete(h, facts)


def nvml_with(tmp: Path, base: Path = AFFINITY, **by_gpu: dict) -> Path:
    """``base``'s facts with GPU N's fields replaced by ``by_gpu["gN"]``."""
    data = json.loads(base.read_text())
    for g in data["gpus"]:
        g.update(by_gpu.get(f"g{g['index']}", {}))
    path = tmp / "nvml-edited.json"
    path.write_text(json.dumps(data))
    return path


def test_nvml_and_the_pci_tree_give_back_the_matrix_nvidia_smi_printed(root):
    f = derived(pci_tree(root))
    printed = topo.parse(SPLIT.read_text())
    assert f.matrix_source == "NVML and sysfs" and f.unanswered == {}
    assert f.matrix.links == printed.links
    assert [(g.cpu_affinity, g.numa_nodes, g.nics) for g in f.matrix.gpus] == [(g.cpu_affinity, g.numa_nodes, g.nics) for g in printed.gpus]
    assert f.answered == {"CPUs of each GPU": "NVML (CPU affinity)", "NUMA node of each GPU": "sysfs numa_node",
                          "GPU links (NVLink)": "NVML (each NVLink's state and far end)", "GPU-NIC distance": "sysfs (the PCI tree above each GPU and NIC)"}


def test_without_nvml_affinity_the_cpus_come_from_sysfs(root):
    f = derived(pci_tree(root), HEALTHY)  # NVML facts recorded before the affinity calls
    assert f.answered["CPUs of each GPU"] == "sysfs local_cpulist"
    assert [g.cpu_affinity for g in f.matrix.gpus] == [g.cpu_affinity for g in topo.parse(SPLIT.read_text()).gpus]


def test_a_hidden_pci_tree_leaves_the_nic_distance_unanswered_not_guessed(root):
    f = derived(root)  # the recorded tree is flat, as in many VMs
    assert "GPU-NIC distance" not in f.answered and "hidden" in f.unanswered["GPU-NIC distance"]
    assert f.matrix.nics == [] and f.matrix.links["0-7"] == "NV18"


def test_devices_on_a_flat_root_bus_leave_the_nic_distance_unanswered(root):
    """A VM's passthrough devices sit on the root bus with no bridge above them: the
    tree says nothing of which NIC shares a GPU's switch, so nothing is guessed from NUMA."""
    devices = root / "sys/bus/pci/devices"
    for dev in sorted(devices.iterdir()):
        where = root / "sys/devices/pci0000:00" / dev.name
        where.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(dev), str(where))
        dev.symlink_to(Path("../../..") / where.relative_to(root / "sys"))
    f = derived(root)
    assert "GPU-NIC distance" not in f.answered and "hidden" in f.unanswered["GPU-NIC distance"] and f.matrix.nics == []


def test_nvlinks_whose_far_end_nvml_cannot_name_leave_the_pairs_unanswered(root, tmp_path):
    f = derived(root, nvml_with(tmp_path, g2={"nvlink_remote": None}))
    assert "GPU 2" in f.unanswered["GPU links (NVLink)"] and "GPU links (NVLink)" not in f.answered


def test_a_gpu_with_a_link_down_reaches_its_peers_over_fewer_links(root, tmp_path):
    f = derived(root, nvml_with(tmp_path, g3={"nvlinks_active": 17, "nvlinks_down": [5], "nvlink_remote": {"switch": 17}}))
    assert {k: v for k, v in f.matrix.links.items() if "3" in k.split("-")} == {k: "NV17" for k in ("0-3", "1-3", "2-3", "3-4", "3-5", "3-6", "3-7")}
    assert f.matrix.links["0-1"] == "NV18"


def test_bridged_pairs_are_told_by_the_far_end_of_each_link(root, tmp_path):
    # Four PCIe GPUs joined in pairs by NVLink bridges (H100 NVL): 0-1 and 2-3, 12 links each.
    bus = ["00000000:1B:00.0", "00000000:43:00.0", "00000000:52:00.0", "00000000:61:00.0"]
    bridged = {f"g{i}": {"nvlinks_active": 12, "nvlink_remote": {"gpu": 12}, "nvlink_peers": {bus[i ^ 1]: 12}} for i in range(4)}
    f = derived(root, nvml_with(tmp_path, **bridged, **{f"g{i}": {"nvlinks_active": 0, "nvlink_remote": None} for i in range(4, 8)}))
    assert (f.matrix.links["0-1"], f.matrix.links["2-3"], f.matrix.links["1-2"], f.matrix.links["0-4"]) == ("NV12", "NV12", "NODE", "SYS")
    assert f.unanswered == {"GPU-NIC distance": f.unanswered["GPU-NIC distance"]}


def test_the_numa_node_of_a_gpu_the_kernel_does_not_place_comes_from_its_cpus(root):
    (root / "sys/bus/pci/devices/0000:c3:00.0/numa_node").write_text("-1\n")
    f = derived(root, HEALTHY)
    assert f.matrix.gpus[5].numa_nodes == [1]
    assert f.answered["NUMA node of each GPU"] == "sysfs numa_node; sysfs: the NUMA node whose CPUs hold its local_cpulist"


def test_links_of_unknown_kind_that_end_at_no_gpu_here_leave_the_pairs_unanswered(root, tmp_path):
    # A driver that cannot name the far end's kind: the links may end at an NVSwitch, so no pair is read as unlinked.
    odd = {"nvlink_remote": {"unknown": 18}, "nvlink_peers": {"00000000:05:00.0": 18}}  # the NVSwitch's bus id
    f = derived(root, nvml_with(tmp_path, **{f"g{i}": odd for i in range(8)}))
    assert "GPU 0, 1, 2, 3, 4, 5, 6, 7" in f.unanswered["GPU links (NVLink)"]
