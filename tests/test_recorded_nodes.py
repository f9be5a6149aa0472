"""Real nodes, replayed (tests/recorded_node.py): what each node printed,
served to the checks as the node served it, must give the verdict a correct
preflight gives that node.

The H200 VM (tests/fixtures/node/h200-1x-vm) is the first real GPU preflight
met: 0.2.0 FAILed it (topology: driver 580's escapes in `topo -m`) and WARNed
it (shm: a tmpfs larger than RAM, the VM's own default). A correct preflight
passes it at every level with no WARN; the only FAIL a replay may show is
that its NVML facts are a recording ("NVML facts are FAKE", the `source`
part). The same holds for the recorded 8 x H100 HGX with its `topo -m` header
as driver 580 prints it, and for the node shapes built around a real `topo -m`
capture of tests/fixtures/topo (2 x A100 PCIe on two sockets, a DGX Spark, 8 x
H100 SXM on one NUMA node, a Kubernetes pod given 2 of an HGX H100 board's 8
GPUs): each is a healthy node of its shape, its facts cited in
tests/fixtures/node-shapes/SOURCE.md. Each passes the quick level under profile
generic too, which `auto` runs where no profile names the GPU model: a healthy
node of a model we hold no profile for is a node of one of these shapes (the
standard level's GPU work under generic is judged in tests/pipeline/test_generic_profile.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPLAY = HERE / "recorded_node.py"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the replay mounts a tmpfs in a private mount namespace (unshare -m): root only")

READING = "topology,pcie,rdma,fabric,firmware,shm"  # the standard level's checks that start no GPU work
QUICK = ["cuda", "topology", "pcie", "rdma", "fabric", "firmware", "shm"]  # the quick level's checks, in order


def replay(node: str, tmp_path: Path, level: str, only: str = "", config: str = "", profile: str = "") -> dict:
    cmd = ["unshare", "-m", sys.executable, str(REPLAY), node, str(tmp_path / "tree"), "--level", level]
    if only:
        cmd += ["--only", only]
    if profile:
        cmd += ["--profile", profile]
    if config:
        (tmp_path / "site.toml").write_text(config)
        cmd += ["--config", str(tmp_path / "site.toml")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def findings(report: dict) -> list[str]:
    """Every WARN or FAIL of the report but the recording's own ("NVML facts are FAKE")."""
    out = []
    for c in report["checks"]:
        parts = c["details"].get("parts")
        if c["status"] in ("PASS", "SKIP"):
            continue
        if parts is None:
            out.append(f"{c['check']} {c['status']}: {c['summary']}")
            continue
        for part, status in parts.items():
            if part != "source" and status in ("WARN", "FAIL", "ERROR"):
                out.append(f"{c['check']}.{part} {status}: {c['summary']} / {c.get('cause')}")
        if c["status"] == "FAIL" and not c["summary"].startswith("NVML facts are FAKE") and not any(p != "source" and s == "FAIL" for p, s in parts.items()):
            out.append(f"{c['check']} FAIL: {c['summary']}")
    return out


def by_name(report: dict) -> dict[str, dict]:
    return {c["check"]: c for c in report["checks"]}


# This machine is not the node: its /dev/shm segment is written for real. Below the full level it
# is 64 MiB at the profile's own floor (16 GiB on h200-sxm), which the node's recorded MemAvailable backs.


def test_the_h200_vm_passes_the_quick_level_with_no_warn(tmp_path):
    report = replay("h200-1x-vm", tmp_path, "quick")
    assert findings(report) == []
    checks = by_name(report)
    assert [c["check"] for c in report["checks"]] == ["cuda", "topology", "pcie", "rdma", "fabric", "firmware", "shm"]
    # the SKIPs a correct preflight gives this node, each with its reason (SOURCE.md)
    assert checks["pcie"]["status"] == "SKIP" and "not visible" in checks["pcie"]["summary"]
    assert checks["rdma"]["status"] == "SKIP" and "no InfiniBand/RoCE device" in checks["rdma"]["summary"]
    assert checks["fabric"]["status"] == "SKIP" and "one GPU" in checks["fabric"]["summary"]
    # the matrix as driver 580 printed it, read: one GPU, CPUs 0-15, NUMA node 0, no NIC, no NVLink
    matrix = checks["topology"]["details"]["matrix"]
    assert matrix is not None, checks["topology"]["details"].get("matrix_error")
    assert [(g["cpu_affinity"], g["numa_affinity"], g["gpu_numa_id"]) for g in matrix["gpus"]] == [("0-15", "0", None)]
    assert matrix["nics"] == [] and matrix["links"] == {}
    # /dev/shm: 128 GiB on 125.8 GiB of RAM, written for real, no finding
    shm = checks["shm"]
    assert shm["status"] == "PASS" and shm["details"]["size_bytes"] == 128 << 30 and shm["details"]["mem_total_bytes"] == 135148564480


def test_the_h200_vm_passes_the_standard_levels_reading_checks_with_no_warn(tmp_path):
    report = replay("h200-1x-vm", tmp_path, "standard", only=READING)
    assert findings(report) == []
    shm = by_name(report)["shm"]
    assert shm["status"] == "PASS" and shm["details"]["segment_bytes"] == 64 << 20
    # One GPU: its share of the profile's 8-GPU floor, said where it is read.
    assert "; memory for the 2 GiB floor: " in shm["summary"]
    assert shm["summary"].endswith("; floor 2 GiB: the profile's 16 GiB for 8 GPUs' ranks, this node gives the run 1")


def test_the_hgx_h100_with_a_driver_580_header_passes_the_quick_level_with_no_warn(tmp_path):
    report = replay("hgx-h100-8x", tmp_path, "quick")
    assert findings(report) == []
    checks = by_name(report)
    matrix = checks["topology"]["details"]["matrix"]
    assert matrix is not None, checks["topology"]["details"].get("matrix_error")
    assert len(matrix["gpus"]) == 8 and set(matrix["links"].values()) == {"NV18"} and len(matrix["nics"]) == 12
    assert checks["rdma"]["status"] == "PASS" and checks["shm"]["status"] == "PASS"
    # the advice still says how to pin each rank on this two-socket board
    assert checks["topology"]["details"]["advice"]["bind"] is True


def test_the_hgx_h100_passes_the_standard_levels_reading_checks_with_no_warn(tmp_path):
    report = replay("hgx-h100-8x", tmp_path, "standard", only=READING)
    assert findings(report) == []


# ---- node shapes around a real `nvidia-smi topo -m` capture (tests/fixtures/node-shapes/SOURCE.md) ----
# Their PCI entries are flat, as the two nodes' above: no bridge shows above a GPU, so pcie SKIPs.


def _placement(matrix: dict) -> list[tuple]:
    return [(g["cpu_affinity"], g["numa_affinity"], g["gpu_numa_id"]) for g in matrix["gpus"]]


def test_two_a100_pcie_on_two_sockets_pass_the_quick_level_with_no_warn(tmp_path):
    report = replay("a100-pcie-2x", tmp_path, "quick")
    assert findings(report) == []
    checks = by_name(report)
    assert [c["check"] for c in report["checks"]] == QUICK
    shape = report["shape"]
    assert (shape["gpus"], shape["fabric"], shape["nics"]) == (2, "pcie", ["mlx5_0", "mlx5_1"])
    assert checks["fabric"]["status"] == "SKIP" and "not built on an NVSwitch board" in checks["fabric"]["summary"]
    assert checks["pcie"]["status"] == "SKIP" and "not visible" in checks["pcie"]["summary"]
    # della-i14g20's matrix (topo/08): one GPU per socket, SYS between them, an mlx5 beside each
    matrix = checks["topology"]["details"]["matrix"]
    assert matrix is not None, checks["topology"]["details"].get("matrix_error")
    assert _placement(matrix) == [("0-63", "0", None), ("64-127", "1", None)]
    assert matrix["links"] == {"0-1": "SYS"} and matrix["nics"] == ["mlx5_0", "mlx5_1"]
    # two NUMA nodes is this board's design (a100-pcie's numa_warn_above = 2): no finding, and the advice pins each rank
    assert checks["topology"]["details"]["parts"]["numa"] == "PASS" and checks["topology"]["details"]["advice"]["bind"] is True
    assert checks["rdma"]["status"] == "PASS" and checks["rdma"]["summary"].startswith("2/2 RDMA ports ACTIVE")
    assert checks["rdma"]["details"]["compute_ports"]["ports"] == ["mlx5_0 port 1", "mlx5_1 port 1"]
    shm = checks["shm"]
    assert shm["status"] == "PASS" and shm["details"]["size_bytes"] == 264006212 * 1024


def test_two_a100_pcie_on_two_sockets_pass_the_standard_levels_reading_checks_with_no_warn(tmp_path):
    report = replay("a100-pcie-2x", tmp_path, "standard", only=READING)
    assert findings(report) == []
    shm = by_name(report)["shm"]
    assert shm["status"] == "PASS" and shm["details"]["segment_bytes"] == 64 << 20
    assert shm["summary"].endswith("; floor 4 GiB: the profile's 16 GiB for 8 GPUs' ranks, this node gives the run 2")


def test_the_dgx_spark_passes_the_quick_level_with_no_warn(tmp_path):
    report = replay("gb10-1x", tmp_path, "quick")
    assert findings(report) == []
    checks = by_name(report)
    assert [c["check"] for c in report["checks"]] == QUICK
    shape = report["shape"]
    assert (shape["gpus"], shape["fabric"], shape["slots"]) == (1, "single", ["000f:01:00.0"])
    # NVML says nothing of GB10's memory, ECC or power cap (unified memory): unknown, never a finding
    assert checks["cuda"]["details"]["parts"]["inventory"] == "PASS"
    assert checks["fabric"]["status"] == "SKIP" and "not built on an NVSwitch board" in checks["fabric"]["summary"]
    # topo/24 with its header as driver 580 prints it: one GPU on CPUs 0-19, four RoCE devices by their udev names
    matrix = checks["topology"]["details"]["matrix"]
    assert matrix is not None, checks["topology"]["details"].get("matrix_error")
    assert _placement(matrix) == [("0-19", "0", None)] and matrix["links"] == {}
    assert matrix["nics"] == ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]
    # one QSFP port cabled (its two halves ACTIVE), the other unplugged: RoCE ports are no compute port of the gb10
    # profile, so the unplugged pair is reported, not judged, and GPUDirect RDMA is not asked for
    rdma = checks["rdma"]
    assert rdma["status"] == "PASS" and rdma["summary"].startswith("2/4 RDMA ports ACTIVE")
    assert rdma["details"]["compute_ports"]["ports"] == []
    assert sorted(rdma["details"]["other_ports"]) == ["roceP2p1s0f1 port 1 (Ethernet) DOWN (physical state Disabled)",
                                                      "rocep1s0f1 port 1 (Ethernet) DOWN (physical state Disabled)"]
    assert rdma["details"]["gpudirect"] == "not judged: profile gb10 does not expect GPUDirect RDMA"
    shm = checks["shm"]
    assert shm["status"] == "PASS" and shm["details"]["size_bytes"] == 62744752 * 1024


def test_the_dgx_spark_passes_the_standard_levels_reading_checks_with_no_warn(tmp_path):
    report = replay("gb10-1x", tmp_path, "standard", only=READING)
    assert findings(report) == []
    shm = by_name(report)["shm"]
    # gb10's 2 GiB floor is for its one GPU already: not scaled
    assert shm["status"] == "PASS" and "; memory for the 2 GiB floor: " in shm["summary"] and "; floor " not in shm["summary"]


def test_eight_h100_sxm_on_one_numa_node_pass_the_quick_level_with_no_warn(tmp_path):
    report = replay("h100-sxm-8x-1numa", tmp_path, "quick")
    assert findings(report) == []
    checks = by_name(report)
    assert [c["check"] for c in report["checks"]] == QUICK
    shape = report["shape"]
    assert (shape["gpus"], shape["fabric"], shape["nvswitches"], len(shape["nics"])) == (8, "nvswitch", 4, 12)
    # topo/02: every pair NV18, every GPU on CPUs 0-191 and NUMA node 0 (numa=off), its own NIC at PIX
    matrix = checks["topology"]["details"]["matrix"]
    assert matrix is not None, checks["topology"]["details"].get("matrix_error")
    assert set(matrix["links"].values()) == {"NV18"} and len(matrix["links"]) == 28
    assert _placement(matrix) == [("0-191", "0", None)] * 8
    assert matrix["nearest_nics"] == {"0": ["mlx5_0"], "1": ["mlx5_1"], "2": ["mlx5_2"], "3": ["mlx5_5"],
                                      "4": ["mlx5_6"], "5": ["mlx5_7"], "6": ["mlx5_8"], "7": ["mlx5_11"]}
    topology = checks["topology"]["details"]
    assert all(topology["parts"][p] == "PASS" for p in ("nvlink", "numa", "nics", "cpus", "agreement"))
    assert topology["advice"]["bind"] is False  # one NUMA node: nothing to pin
    fabric = checks["fabric"]["details"]
    assert fabric["parts"] == {"gpus": "PASS", "nvswitches": "PASS", "manager": "PASS", "source": "FAIL"}
    assert checks["rdma"]["status"] == "PASS" and checks["rdma"]["summary"].startswith("12/12 RDMA ports ACTIVE")
    # RoCE where the profile expects InfiniBand: no compute port, so GPUDirect RDMA is neither judged nor claimed.
    assert "GPUDirect RDMA not judged" in checks["rdma"]["summary"] and "GPUDirect RDMA by" not in checks["rdma"]["summary"]
    assert checks["rdma"]["details"]["gpudirect"].startswith("not judged: no port carries the job's traffic")
    assert checks["shm"]["status"] == "PASS"


def test_eight_h100_sxm_on_one_numa_node_pass_the_standard_levels_reading_checks_with_no_warn(tmp_path):
    report = replay("h100-sxm-8x-1numa", tmp_path, "standard", only=READING)
    assert findings(report) == []
    shm = by_name(report)["shm"]
    assert shm["status"] == "PASS" and "; memory for the 16 GiB floor: " in shm["summary"]


# A Kubernetes pod given 2 of the HGX H100's 8 GPUs (tests/fixtures/node-shapes/SOURCE.md): the run's shape is the pod's,
# what the kernel shows of the host (the PCI bus, the NUMA nodes, /proc/meminfo) is the host's.


def test_a_pod_given_two_of_eight_h100_sxm_passes_the_quick_level_with_no_warn(tmp_path):
    report = replay("h100-sxm-pod-2of8", tmp_path, "quick")
    assert findings(report) == []
    checks = by_name(report)
    assert [c["check"] for c in report["checks"]] == QUICK
    # two GPUs (their /dev nodes), joined by the NVSwitches their NVLinks end at, beside the two NICs given to the pod;
    # sysfs shows the whole board's PCI bus: all eight GPUs and the four NVSwitches
    shape = report["shape"]
    assert (shape["gpus"], shape["fabric"], shape["nics"], shape["device_nodes"]) == (2, "nvswitch", ["mlx5_0", "mlx5_1"], [0, 1])
    assert len(shape["pci_gpus"]) == 8 and shape["nvswitches"] == 4 and shape["nvml_gpus"] == 2
    # the container hook lists the given GPUs' driver entries alone: the pod's own slots, for pcie and rdma
    assert shape["slots"] == ["0000:1b:00.0", "0000:43:00.0"]
    assert shape["notes"] == ["6 of the host's 8 GPUs are not given to this container"]
    # topo/03 cut to the pod's GPUs and NICs, its header as driver 580 prints it, CPU Affinity cut to the pod's cpuset
    topology = checks["topology"]["details"]
    matrix = topology["matrix"]
    assert matrix is not None, topology.get("matrix_error")
    assert matrix["links"] == {"0-1": "NV18"} and matrix["nics"] == ["mlx5_0", "mlx5_1"]
    assert _placement(matrix) == [("1-12,113-124", "0", None)] * 2
    assert matrix["nearest_nics"] == {"0": ["mlx5_0"], "1": ["mlx5_1"]}
    assert all(topology["parts"][p] == "PASS" for p in ("matrix", "nvlink", "numa", "nics", "cpus", "pcie", "agreement"))
    # 24 CPUs of the cpuset, a 24-CPU quota: 12 vCPUs for each of the run's 2 GPUs, the floor 11
    assert (topology["cpus"]["allowed"], topology["cpus"]["quota"]) == ("1-12,113-124", 24.0)
    vcpus = next(m for m in checks["topology"]["measurements"] if m["name"] == "vcpus_per_gpu")
    assert (vcpus["value"], vcpus["floor"]) == (12.0, 11.0)
    # The pod's sysfs shows the board's whole PCI bus, so its four NVSwitches are counted against the board's four
    # (a missing one would cut this pod's NVLinks too); the manager runs on the host, its work seen in the GPUs' registration.
    fabric = checks["fabric"]["details"]
    assert fabric["parts"] == {"gpus": "PASS", "nvswitches": "PASS", "manager": "PASS", "source": "FAIL"}
    assert fabric["nvswitches"] == 4 and "nvswitches" not in fabric["not_judged"]
    assert fabric["manager"]["state"] == "unknown" and "every GPU's fabric registration completed" in fabric["notes"]["manager"]
    # its two InfiniBand NDR ports, GPUDirect RDMA by dma-buf (the open driver on Linux 5.15, no peer-memory module)
    rdma = checks["rdma"]
    assert rdma["status"] == "PASS" and rdma["summary"].startswith("2/2 RDMA ports ACTIVE")
    assert rdma["details"]["compute_ports"]["ports"] == ["mlx5_0 port 1", "mlx5_1 port 1"]
    assert rdma["summary"].endswith("GPUDirect RDMA by dma-buf")
    # no kernel log a pod may read: the Xid scan is said not judged, never a finding
    assert checks["cuda"]["details"]["parts"]["inventory"] == "PASS"
    assert checks["cuda"]["details"]["parts"]["xid"].startswith("not judged: the kernel log could not be read")
    # /dev/shm: the 16Gi memory-backed emptyDir, in a pod (KUBERNETES_SERVICE_HOST), held to 2 GPUs' share of the 16 GiB floor
    shm = checks["shm"]
    assert shm["status"] == "PASS" and shm["details"]["size_bytes"] == 16 << 30
    assert shm["details"]["container"] == "a Kubernetes pod (KUBERNETES_SERVICE_HOST is set)"
    assert (shm["details"]["mount"]["fstype"], shm["details"]["mount"]["mount_point"]) == ("tmpfs", "/dev/shm")
    assert next(m for m in shm["measurements"] if m["name"] == "shm_size")["floor"] == 4 << 30
    assert shm["summary"].endswith("; floor 4 GiB: the profile's 16 GiB for 8 GPUs' ranks, this node gives the run 2")


def test_a_pod_given_two_of_eight_h100_sxm_passes_the_standard_levels_reading_checks_with_no_warn(tmp_path):
    report = replay("h100-sxm-pod-2of8", tmp_path, "standard", only=READING)
    assert findings(report) == []
    checks = by_name(report)
    assert all(checks["topology"]["details"]["parts"][p] == "PASS" for p in ("nvlink", "numa", "nics", "cpus", "agreement"))
    assert checks["fabric"]["details"]["parts"]["nvswitches"] == "PASS"
    # the figures must back the 4 GiB floor before the small segment is written: the memory limit's headroom does
    shm = checks["shm"]
    assert shm["status"] == "PASS" and shm["details"]["segment_bytes"] == 64 << 20
    assert "; memory for the 4 GiB floor: the memory limit's headroom (" in shm["summary"]
    assert shm["summary"].endswith("; floor 4 GiB: the profile's 16 GiB for 8 GPUs' ranks, this node gives the run 2")


# ---- every node again under profile generic, as `auto` runs a model no profile names ----


@pytest.mark.parametrize("node", ["h200-1x-vm", "hgx-h100-8x", "a100-pcie-2x", "gb10-1x", "h100-sxm-8x-1numa", "h100-sxm-pod-2of8"])
def test_every_recorded_healthy_node_passes_the_quick_level_under_generic_with_no_warn(tmp_path, node):
    report = replay(node, tmp_path, "quick", profile="generic")
    assert report["profile"] == "generic"
    assert findings(report) == []
    assert [c["check"] for c in report["checks"]] == QUICK


def test_the_hgx_h100_under_generic_holds_its_gpus_to_their_peers_links_and_leaves_the_switch_count_unjudged(tmp_path):
    assert findings(replay("hgx-h100-8x", tmp_path / "standard", "standard", only=READING, profile="generic")) == []
    report = replay("hgx-h100-8x", tmp_path / "quick", "quick", profile="generic")
    checks = by_name(report)
    fabric = checks["fabric"]["details"]
    assert (fabric["parts"]["gpus"], fabric["parts"]["manager"], fabric["parts"]["nvswitches"]) == ("PASS", "PASS", "SKIP")
    assert fabric["not_judged"]["nvswitches"].startswith("no board count of NVSwitches for this GPU model")
    links = [m for m in checks["cuda"]["measurements"] if m["name"] == "gpu_nvlinks_active"]
    assert len(links) == 8 and {(m["value"], m["floor"]) for m in links} == {(18, 18)}
