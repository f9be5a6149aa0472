"""The text and JSON of `preflight topology`, from real `nvidia-smi topo -m`
captures: what a saved capture shows, a live node's shape leading the text,
fake NVML facts failing closed, and a node whose profile cannot be picked."""

import os
import subprocess

import fakes
import pytest

from preflight.base.host import Host
from conftest import no_driver
from preflight.outputs.explain import topology_text as tt
from topology_cases import FIXTURES, SPLIT, TOPO

from preflight.base.errors import UsageError
from preflight.pipeline.settings import Settings
from preflight.pipeline.shape import NodeShape

P40 = TOPO / "14_p40-8x-pcie_pix-pxb_mlx5_0-SOC_old-header-no-numa.txt"  # PCIe switches only, one NIC behind the CPU


def captured(path):
    return tt.from_text(path.read_text(), str(path))


def test_a_capture_lists_links_by_kind_and_the_nics_beside_no_gpu():
    text, data, failed = tt.explain(captured(P40), None, live=False)
    assert "\n[CPUs 0-13]\n  GPU0   GPU1   GPU2" in text  # no NUMA column: the CPU set stands for the node
    assert "\n  NICs beside no GPU: mlx5_0\n  PIX: 0-1, 0-2," in text
    assert "\n  PXB: 0-4, 0-5, 0-6, 0-7, 1-4, 1-5, 1-6, 1-7, 2-4, 2-5, 2-6, 2-7 and 4 more\n" in text
    assert "\nfindings against no profile (only what needs no SKU is judged): none\n" in text
    assert not failed and data["profile"] is None and data["shape"] is None and "machine" not in data


def test_a_live_explanation_leads_with_the_nodes_shape():
    node = NodeShape(gpus=8, gpus_from="the PCI bus", fabric="nvswitch", fabric_from="NVML")
    text, data, _ = tt.explain(captured(SPLIT), None, live=True, shape=node)
    assert text.startswith("node: 8 GPUs joined by NVSwitch, no RDMA NIC; GPUs from the PCI bus; links from NVML\n8 GPU(s), 12 NIC(s) from ")
    assert data["shape"]["gpus"] == 8 and set(data["machine"]) == {"gpus", "nics", "cpus", "cuda_visible_devices", "torch_numa_binding"}


def test_fake_nvml_facts_fail_closed_outside_a_run_too():
    _, data, failed = tt.explain(captured(SPLIT), None, live=False, fake="facts.json")
    assert failed and ("source", "FAIL") in [(f["part"], f["status"]) for f in data["findings"]]


def test_a_damaged_capture_is_a_usage_error_naming_the_file_and_line():
    bad = TOPO / "malformed" / "M1_h100-8x_nv18_12nic_PASTE-CORRUPTED-PIXNODE.txt"
    with pytest.raises(UsageError, match=rf"^--from {bad}: line 7: .*pass the unedited output of `nvidia-smi topo -m`$"):
        tt.explain_capture(bad, Settings(), profile_named=False)


def test_a_node_whose_profile_cannot_be_picked_is_noted_and_judged_without_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fakes.nvidia_smi(tmp_path / 'bin', SPLIT)}:{os.environ['PATH']}")
    notes: list[str] = []
    text, _, failed = tt.explain_host(Settings(nvml_fake=FIXTURES / "nvml" / "h100-mixed-skus.json"), notes.append)
    assert notes == ["judging without a profile: mixed GPU models on one node: NVIDIA H100 80GB HBM3 (0x2330), NVIDIA H100 PCIe (0x2331)"]
    assert "\nfindings against no profile (only what needs no SKU is judged):\n" in text
    assert failed  # the fake NVML facts fail closed


@no_driver
def test_this_machine_without_a_driver_is_unreadable_and_points_at_a_capture():
    with pytest.raises(tt.Unreadable, match="to explain a saved capture use --from FILE$") as e:
        tt.explain_host(Settings(), lambda _: None)
    text, data = e.value.shown  # the CPUs and NUMA nodes are shown all the same
    assert text.startswith("no GPU layout: NVML says no NVIDIA driver") and "[NUMA node 0  CPUs " in text
    assert data["gpus"] == [] and data["machine"]["cpus"]["nodes"]


@no_driver
def test_without_a_gpu_the_cpu_profile_shows_the_cpu_and_numa_layout_and_passes():
    text, data, failed = tt.explain_host(Settings(profile="cpu"), lambda _: None)
    assert not failed and data["profile"] == "cpu"
    assert f"CPUs online {data['machine']['cpus']['online']}; this process may use " in text and "[NUMA node 0  CPUs " in text


def test_the_cpu_layout_names_each_numa_node_its_cpus_the_quota_and_each_nic(tmp_path):
    root = tmp_path / "root"
    for node, cpus in (("0", "0-47,96-143"), ("1", "48-95,144-191")):
        (root / f"sys/devices/system/node/node{node}").mkdir(parents=True)
        (root / f"sys/devices/system/node/node{node}/cpulist").write_text(cpus + "\n")
    (root / "sys/devices/system/cpu").mkdir(parents=True)
    (root / "sys/devices/system/cpu/online").write_text("0-191\n")
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    dev = root / "sys/devices/pci0000:00/0000:1a:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("0\n")
    (root / "sys/class/infiniband/mlx5_0/device").symlink_to(dev)
    proc = root / "proc/self"
    proc.mkdir(parents=True)
    (proc / "status").write_text("Cpus_allowed_list:\t0-191\n")
    text, data = tt.cpu_layout(Host(root), "no NVIDIA driver")
    assert text.splitlines() == [
        "no GPU layout: NVML says no NVIDIA driver",
        "CPUs online 0-191; this process may use 0-191 (192 usable)",
        "[NUMA node 0  CPUs 0-47,96-143]",
        "[NUMA node 1  CPUs 48-95,144-191]",
        "NIC mlx5_0 (NUMA node 0): port 1 ACTIVE 400 Gb/sec (4X NDR)",
    ]
    assert [n["name"] for n in data["machine"]["nics"]] == ["mlx5_0"]


def test_the_same_capture_prints_the_same_text_in_every_process():
    # Links of equal NVLink count (PIX and PXB: none) once printed in hash order, which changes per process.
    capture = next(TOPO.glob("14_p40*.txt"))
    outs = {subprocess.run([*fakes.PREFLIGHT, "topology", "--from", str(capture)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(4)}
    assert len(outs) == 1 and "PIX/PXB" in next(iter(outs))


def test_this_machine_with_an_unreadable_matrix_shows_the_layout_from_nvml_and_sysfs(tmp_path, monkeypatch):
    from topology_cases import unreadable_smi

    monkeypatch.setenv("PATH", f"{unreadable_smi(tmp_path)}:{os.environ['PATH']}")
    text, data, _ = tt.explain_host(Settings(nvml_fake=FIXTURES / "nvml" / "h100-sxm-8x-affinity.json"), lambda _: None)
    assert "\n8 GPU(s), 0 NIC(s) from NVML and sysfs\n" in text
    assert "\n  GPU4  1     56-111,168-223" in text  # NVML's word: this machine's sysfs has no such GPU to place
    assert "\n  unreadable output, not the node's fault: nvidia-smi topo -m: " in text and "(read from NVML and sysfs instead)" in text
    assert data["matrix_source"] == "NVML and sysfs" and "nvidia-smi topo -m" in data["unread"]
    assert data["links"]["0-7"] == "NV18"
