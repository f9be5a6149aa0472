"""The node's shape: read from the recorded HGX tree (and edits of it that
stand for VMs, containers and sandboxes), judged from recorded NVML facts."""

import shutil
from pathlib import Path

import pytest

from preflight.pipeline import profiles, shape
from preflight.base.host import Host
from preflight.readers.nvidia.nvml import FakeNvml
from preflight.pipeline.shape import NodeShape, PciNvidia

FIXTURES = Path(__file__).parents[1] / "fixtures"
TREE = FIXTURES / "sysfs" / "hgx-h100"
HEALTHY = FakeNvml(FIXTURES / "nvml" / "h100-sxm-8x-healthy.json").model_copy(update={"source": "NVML"})
SLOTS = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0", "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"]


def first(n: int, **update):
    return HEALTHY.model_copy(update={"gpus": [g.model_copy(update=update) for g in HEALTHY.gpus[:n]]})


@pytest.fixture
def root(tmp_path) -> Path:
    dest = tmp_path / "root"
    shutil.copytree(TREE, dest, symlinks=True)
    return dest


def test_the_hgx_tree_is_eight_gpus_joined_by_nvswitch_with_twelve_nics():
    node = shape.gather(Host(TREE), HEALTHY)
    assert (node.gpus, node.slots, node.fabric, len(node.nics)) == (8, SLOTS, "nvswitch", 12)
    assert node.gpus_from == "the PCI bus and /dev/nvidia{0-7}"
    assert node.fabric_from == "NVML: active NVLinks end at an NVSwitch"
    assert shape.fabric_of(first(8, nvlink_remote=None), 1, 8) == ("nvswitch", "sysfs: 1 NVSwitch bridge(s) on the PCI bus")
    assert node.describe() == "8 GPUs joined by NVSwitch, 12 RDMA NICs"
    assert node.notes == []


def test_a_container_given_two_gpus_counts_two_and_names_their_slots(root):
    for minor in range(2, 8):
        (root / f"dev/nvidia{minor}").unlink()
    node = shape.gather(Host(root), first(2))
    assert (node.gpus, node.slots, node.pci_gpus) == (2, SLOTS[:2], SLOTS)
    assert node.notes == ["6 of the host's 8 GPUs have no device node here (not given to this container)"]
    assert node.host_gpus == 8  # the node's, which Slurm's Gres names
    # A GPU the driver does not hold (NVreg_ExcludedGpus, bound to vfio-pci) has no minor: never the node's count.
    (root / "proc/driver/nvidia/gpus" / SLOTS[7]).rename(root / "excluded")
    (root / "dev/nvidia1").unlink()
    assert shape.gather(Host(root), first(1)).host_gpus is None


def test_a_gpu_excluded_from_the_driver_is_never_counted_even_with_a_device_node(root):
    # NVreg_ExcludedGpus keeps the GPU's entry and minor ("GPU Excluded: Yes"); a device node made
    # by hand (the CUDA install guide's mknod loop) must not make it one of the node's GPUs.
    info = root / "proc/driver/nvidia/gpus" / SLOTS[7] / "information"
    info.write_text(info.read_text().replace("GPU Excluded:\t No", "GPU Excluded:\t Yes"))
    node = shape.gather(Host(root), first(7))
    assert (node.gpus, node.slots) == (7, SLOTS[:7])
    assert node.notes == [f"1 GPU(s) excluded from the driver (NVreg_ExcludedGpus), not counted: {SLOTS[7]}"]
    assert node.host_gpus is None and node.pci_gpus == SLOTS[:7]


def job_cgroup(monkeypatch, given: range) -> None:
    """A Slurm job's device cgroup (ConstrainDevices): every /dev/nvidiaN is listed, only ``given`` may be opened."""
    monkeypatch.setattr(shape, "may_open", lambda path: path.name in {f"nvidia{m}" for m in given})


def test_a_slurm_job_whose_device_cgroup_refuses_six_nodes_is_given_two(root, monkeypatch):
    # `srun --gres=gpu:2` under ConstrainDevices=yes: the cgroup refuses open(), it hides no node.
    job_cgroup(monkeypatch, range(2))
    node = shape.gather(Host(root), first(2))
    assert (node.gpus, node.slots, node.device_nodes) == (2, SLOTS[:2], [0, 1])
    assert node.gpus_from == "the PCI bus and /dev/nvidia{0-1}"
    assert node.notes == ["6 GPU device node(s) here this process may not open (/dev/nvidia{2-7}: a device cgroup, "
                          "as a Slurm job's ConstrainDevices): not given to this run"]
    assert node.host_gpus == 8  # Slurm's Gres is the node's


def test_gpus_nvml_refuses_this_process_are_not_given_to_the_run(root):
    # nvmlDeviceGetCount_v2 counts all 8; the handles of the six outside the job answer NO_PERMISSION.
    refused = FakeNvml(FIXTURES / "nvml" / "h100-sxm-8x-slurm-2-given.json").model_copy(update={"source": "NVML"})
    node = shape.gather(Host(root), refused)
    assert (node.gpus, node.slots, node.host_gpus) == (2, SLOTS[:2], 8)
    assert node.notes == ["NVML refuses this process 6 GPU(s) (NVML index 2, 3, 4, 5, 6, 7: Insufficient Permissions): not given to this run"]


def test_a_gpu_of_the_job_that_nvml_no_longer_lists_is_missing_not_one_nvml_refuses():
    """Was: under ConstrainDevices with GPUs 0-3 given, NVML's refusal of 4-7 (whose device nodes
    the cgroup already refused) was taken to explain GPU 2 gone from NVML too: the run counted 3
    GPUs, and GPU 2's slot read as another job's."""
    from preflight.readers.nvidia.nvml_facts import RefusedGpu
    refused = [RefusedGpu(index=i, error="Insufficient Permissions") for i in range(4, 8)]
    inv = HEALTHY.model_copy(update={"gpus": [HEALTHY.gpus[i] for i in (0, 1, 3)], "refused": refused})
    minors = {slot: i for i, slot in enumerate(SLOTS)}
    node = shape.judge_shape(shape.PciNvidia(gpus=SLOTS), list(range(8)), minors, [], inv, refused=[4, 5, 6, 7])
    assert (node.gpus, node.slots, node.nvml_gpus) == (4, SLOTS[:4], 3)  # the cuda check FAILs GPU 2's slot as missing
    assert node.not_given() == {s.rpartition(".")[0] for s in SLOTS[4:]}
    # The cgroup unseen (a recorded tree): NVML's refusals are what tells the job's share.
    blind = shape.judge_shape(shape.PciNvidia(gpus=SLOTS), list(range(8)), minors, [], inv.model_copy(update={"gpus": HEALTHY.gpus[:4]}))
    assert (blind.gpus, blind.slots) == (4, SLOTS[:4])


def test_the_device_cgroup_is_asked_without_opening_the_gpu():
    # A recorded tree's stand-in is no device: nothing to refuse. A character device this process
    # may use reads as openable, through access(2), which runs the device cgroup's check.
    assert shape.may_open(TREE / "dev" / "nvidia0") and shape.may_open(Path("/dev/null"))
    assert shape.refused_nodes(Host(TREE), [0, 1]) == []


def test_cuda_visible_devices_gives_the_run_the_gpus_it_names(root):
    # A Slurm step given GPUs 4-7 of a node without a device cgroup: it may open all 8, CUDA shows 4.
    for cvd in ("4,5,6,7", ",".join(g.uuid for g in HEALTHY.gpus[4:])):
        node = shape.gather(Host(root, environ={"CUDA_VISIBLE_DEVICES": cvd}), HEALTHY)
        assert (node.gpus, node.slots, node.host_gpus, node.fabric) == (4, SLOTS[4:], 8, "nvswitch"), cvd
        assert node.gpus_from == f"CUDA_VISIBLE_DEVICES={cvd} (4 of the 8 GPUs from the PCI bus and /dev/nvidia{{0-7}})"
        assert node.notes == [f"CUDA_VISIBLE_DEVICES={cvd} gives this run 4 of the 8 GPUs this process may open: {', '.join(SLOTS[4:])}"]
    # The launch sizes to them: one rank per GPU CUDA will show.
    h100 = profiles.resolve(profiles.load(profiles.find("h100-sxm", None)), Path("h100-sxm.toml"), {}, "t")
    from preflight.pipeline.check import Context
    from preflight.pipeline.settings import Settings
    assert Context(profile=h100, settings=Settings(), host=Host(root), shape=node).ranks(None) == 4
    # The first entry says what the list holds (torch's model of CUDA's reading): indices after a UUID are not read.
    mixed = shape.gather(Host(root, environ={"CUDA_VISIBLE_DEVICES": "GPU-5c1b0c7e-8f2a-4d3b-9e6a-000000000004,5,6,7"}), HEALTHY)
    assert mixed.gpus == 1 and "CUDA stops at '5': not a GPU- entry like the first" in mixed.notes[0]
    # Before NVML is read (the launch's head start): indices by PCI order, UUIDs counted.
    early = shape.gather(Host(root, environ={"CUDA_VISIBLE_DEVICES": "GPU-5c1b0c7e,GPU-9"}), None, why_no_nvml="not read yet")
    assert early.gpus == 2 and early.slots == []


def test_cuda_visible_devices_names_a_lost_gpu_in_its_place():
    """Was: with GPU 2 lost, CUDA_VISIBLE_DEVICES=0,1,2,3 was read over the GPUs NVML could talk
    to, so index 2 named GPU 3 and the run's slots took GPU 4's: its Xids judged, GPU 2's not."""
    from preflight.readers.nvidia.nvml_facts import LostGpu
    lost = HEALTHY.model_copy(update={"gpus": [g for g in HEALTHY.gpus if g.index != 2],
                                      "lost": [LostGpu(index=2, pci_bus_id="00000000:52:00.0", error="GPU is lost")]})
    minors = {slot: i for i, slot in enumerate(SLOTS)}
    for usable in (list(range(8)), [0, 1, 2, 3, 4, 5, 6]):  # every device node, or one gone: the bus order, or NVML's
        pci = shape.PciNvidia(gpus=SLOTS if len(usable) == 8 else SLOTS[:7])
        node = shape.judge_shape(pci, usable, minors, [], lost, cuda_visible="0,1,2,3")
        assert (node.gpus, node.slots) == (4, SLOTS[:4]), usable
    by_uuid = ",".join(g.uuid for g in HEALTHY.gpus[4:6])  # named by UUID, the lost GPU is in no one's way
    for usable in (list(range(8)), [0, 1, 2, 3, 4, 5, 6]):
        pci = shape.PciNvidia(gpus=SLOTS if len(usable) == 8 else SLOTS[:7])
        node = shape.judge_shape(pci, usable, minors, [], lost, cuda_visible=by_uuid)
        assert (node.gpus, node.slots) == (2, SLOTS[4:6]), usable
    nameless = lost.model_copy(update={"lost": [LostGpu(index=2, error="GPU is lost")]})  # where it sat is unknown: no slots
    node = shape.judge_shape(shape.PciNvidia(gpus=None), list(range(8)), {}, [], nameless, cuda_visible="0,1,2,3")
    assert (node.gpus, node.slots, node.not_given()) == (4, [], set())


@pytest.mark.parametrize("cvd, gpus, stop", [
    ("0,2,-1,1", 2, "CUDA stops at '-1': not a GPU index or UUID"),  # the CUDA guide's own example
    ("", 0, "CUDA stops at an empty entry"),
    ("NoDevFiles", 0, "CUDA stops at 'NoDevFiles': not a GPU index or UUID"),
    ("3,3", 0, "'3' names GPU 3 a second time, and CUDA then shows no GPU"),  # torch's model of CUDA: a repeat empties the list
    ("7,8", 1, "CUDA stops at '8': there is no GPU 8 among the 8 it would show"),
    ("GPU-5c1b0c7e-8f2a-4d3b-9e6a-00000000000", 0, "CUDA stops at 'GPU-5c1b0c7e-8f2a-4d3b-9e6a-00000000000': 8 GPUs here have that UUID"),
    ("0,1,2,3,4,5,6,7", 8, None),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(root, cvd, gpus, stop):
    node = shape.gather(Host(root, environ={"CUDA_VISIBLE_DEVICES": cvd}), HEALTHY)
    assert node.gpus == gpus
    assert stop is None and node.notes == [] or stop in node.notes[0]


def test_cuda_visible_devices_under_a_device_cgroup_counts_from_the_gpus_given(root, monkeypatch):
    # Under ConstrainDevices CUDA enumerates the job's own GPUs only, from 0.
    job_cgroup(monkeypatch, range(4, 8))
    inv = HEALTHY.model_copy(update={"gpus": HEALTHY.gpus[4:]})
    node = shape.gather(Host(root, environ={"CUDA_VISIBLE_DEVICES": "0,1"}), inv)
    assert (node.gpus, node.slots, node.host_gpus) == (2, SLOTS[4:6], 8)


def test_a_gpu_missing_from_nvml_is_still_counted_whatever_cuda_visible_devices_names(root):
    # The GPU at 0000:c3:00.0 fell off the bus: sysfs and /dev still list it, NVML does not. Indices
    # past it would name other GPUs than the scheduler meant, and the count judge must see 8.
    seven = FakeNvml(FIXTURES / "nvml" / "h100-sxm-7of8.json")
    node = shape.gather(Host(root, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}), seven)
    assert node.gpus == 8 and "CUDA_VISIBLE_DEVICES=4,5,6,7 not applied: NVML sees 7 of the 8 GPUs this process may open" in node.notes


def test_a_container_whose_driver_lists_only_its_gpus_names_their_slots(root):
    # The NVIDIA container hook mounts /proc/driver/nvidia/gpus with the given GPUs' entries alone.
    for minor, slot in enumerate(SLOTS):
        if minor >= 2:
            (root / f"dev/nvidia{minor}").unlink()
            shutil.rmtree(root / "proc/driver/nvidia/gpus" / slot)
    node = shape.gather(Host(root), first(2))
    assert (node.gpus, node.slots) == (2, SLOTS[:2])
    assert node.gpus_from == "the PCI bus, the driver's entries of the given GPUs and /dev/nvidia{0-1}"
    assert node.notes == ["6 of the host's 8 GPUs are not given to this container"]
    assert node.host_gpus is None  # whether the driver holds the other six, this container cannot see
    # Entries whose minors are not the device nodes here say nothing of which is which.
    (root / "dev/nvidia1").unlink()
    (root / "dev/nvidia5").touch()
    node = shape.gather(Host(root), first(2))
    assert node.slots == [] and "the driver does not say which is which" in node.notes[0]


def test_a_container_whose_driver_does_not_say_which_node_is_which_counts_its_nodes(root):
    shutil.rmtree(root / "proc/driver")
    for minor in range(4, 8):
        (root / f"dev/nvidia{minor}").unlink()
    node = shape.gather(Host(root), first(4))
    assert node.gpus == 4 and node.slots == []
    assert "the driver does not say which is which" in node.notes[0]


def test_a_sandbox_without_pci_devices_counts_device_nodes_and_says_so(root):
    shutil.rmtree(root / "sys/bus/pci/devices")
    node = shape.gather(Host(root), HEALTHY)
    assert node.gpus == 8 and node.pci_gpus is None
    assert node.gpus_from == "/dev/nvidia{0-7} (sysfs lists no PCI device)"


def test_a_shape_nothing_can_be_read_of_is_judged_from_nvml_alone(tmp_path):
    node = shape.gather(Host(tmp_path), first(4, nvlink_remote=None))
    assert node.gpus == 4 and node.gpus_from.startswith("NVML alone")
    assert node.fabric == "nvlink" and node.fabric_from == "NVML: NVLinks active (where they end is not reported)"


def test_nvml_silent_leaves_the_shape_of_the_bus_and_says_why():
    node = shape.gather(Host(TREE), None, why_no_nvml="NVML did not answer within 20 s: the driver is wedged")
    assert node.gpus == 8 and node.nvml_gpus is None and node.fabric == "nvswitch"
    assert node.notes == ["NVML did not answer: NVML did not answer within 20 s: the driver is wedged"]


def test_nvml_seeing_more_gpus_than_the_bus_shows_wins_and_is_noted():
    node = shape.judge_shape(PciNvidia(gpus=SLOTS[:2]), None, {}, [], HEALTHY)
    assert node.gpus == 8 and node.notes == ["NVML lists 8 GPUs, more than the 2 the PCI bus (sysfs) shows"]
    node = shape.judge_shape(PciNvidia(gpus=[]), None, {}, [], HEALTHY)  # --nvml-fake on a machine without GPUs
    assert node.gpus == 8 and node.gpus_from == "NVML alone: the PCI bus lists no NVIDIA GPU and /dev has no nvidia device node"


@pytest.mark.parametrize(
    "gpus, update, switches, want",
    [
        (1, {}, 0, "single"),
        (2, {"nvlink_remote": {"switch": 18}}, 0, "nvswitch"),
        (4, {}, 4, "nvswitch"),
        (2, {"nvlinks_active": 12, "nvlink_remote": {"gpu": 12}}, 0, "nvlink"),
        (2, {"nvlinks_active": 0, "nvlink_remote": None}, 0, "pcie"),
        (2, {"nvlinks_active": None, "nvlink_remote": None}, 0, "unknown"),
    ],
)
def test_the_fabric_is_learnt_from_where_the_links_end(gpus, update, switches, want):
    assert shape.fabric_of(first(gpus, **update), switches, gpus)[0] == want


def test_a_pinned_count_rides_along():
    node = shape.judge_shape(PciNvidia(gpus=SLOTS[:4]), None, {}, [], first(4), pinned=8)
    assert node.pinned == 8 and "pinned by the site: 8 GPUs" in node.lines()


# ---- which whole-node floors judge which node -----------------------------------------

HGX = NodeShape(gpus=8, gpus_from="t", fabric="nvswitch", fabric_from="t")


def test_a_floor_measured_on_eight_nvswitch_gpus_judges_only_that_shape():
    assert shape.floor_fits(8, "nvswitch", HGX, 8) is None
    two = HGX.model_copy(update={"gpus": 2})
    assert shape.floor_fits(8, "nvswitch", two, 2) == (
        "the floor was measured on 8 GPUs; no cited floor for a 2-GPU node (joined by NVSwitch); `preflight calibrate` makes one")
    assert "a run on 4 of this node's 8 GPUs" in shape.floor_fits(8, "nvswitch", HGX, 4)
    pcie = HGX.model_copy(update={"fabric": "pcie"})
    assert "this node's are joined by PCIe only" in shape.floor_fits(8, "nvswitch", pcie, 8)
    assert shape.floor_fits(None, None, None, 2) is None  # per-GPU or cpu floors judge every node


def test_fitting_floors_keeps_per_gpu_floors_and_says_why_the_others_do_not_judge():
    h100 = profiles.resolve(profiles.load(profiles.find("h100-sxm", None)), Path("h100-sxm.toml"), {}, "t")
    two = HGX.model_copy(update={"gpus": 2})
    kept, why = shape.fitting_floors(dict(h100.floors), ("allreduce_bus_bandwidth", "allreduce_latency"), two, 2, None)
    assert {"hbm_copy_bandwidth", "h2d_bandwidth", "p2p_bandwidth", "gemm_throughput"} <= set(kept)
    assert {"allreduce_bus_bandwidth", "allreduce_latency", "allreduce_latency_p99", "internode_allreduce_bus_bandwidth"} <= set(why)
    assert shape.unjudged_lines({k: why[k] for k in ("allreduce_bus_bandwidth", "allreduce_latency")}) == [
        "allreduce_bus_bandwidth, allreduce_latency: not judged: the floor was measured on 8 GPUs; no cited floor for a 2-GPU node "
        "(joined by NVSwitch); `preflight calibrate` makes one"]


def test_a_site_floor_without_a_shape_judges_the_whole_node_of_any_size():
    site = {"allreduce_bus_bandwidth": profiles.SiteFloor(2e11, "config c.toml line 3")}
    h100 = profiles.resolve(profiles.load(profiles.find("h100-sxm", None)), Path("h100-sxm.toml"), site, "t")
    two = HGX.model_copy(update={"gpus": 2})
    kept, why = shape.fitting_floors(dict(h100.floors), ("allreduce_bus_bandwidth",), two, 2, None)
    assert "allreduce_bus_bandwidth" in kept
    kept, why = shape.fitting_floors(dict(h100.floors), ("allreduce_bus_bandwidth",), two, 1, None)
    assert why["allreduce_bus_bandwidth"] == "a whole-node floor for 2 GPUs, and this run had 1"
