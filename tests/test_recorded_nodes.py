"""Real nodes, replayed (tests/recorded_node.py): what each node printed,
served to the checks as the node served it, must give the verdict a correct
preflight gives that node.

The H200 VM (tests/fixtures/node/h200-1x-vm) is the first real GPU preflight
met: 0.2.0 FAILed it (topology: driver 580's escapes in `topo -m`) and WARNed
it (shm: a tmpfs larger than RAM, the VM's own default). A correct preflight
passes it at every level with no WARN; the only FAIL a replay may show is
that its NVML facts are a recording ("NVML facts are FAKE", the `source`
part). The same holds for the recorded 8 x H100 HGX with its `topo -m` header
as driver 580 prints it.
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


def replay(node: str, tmp_path: Path, level: str, only: str = "", config: str = "") -> dict:
    cmd = ["unshare", "-m", sys.executable, str(REPLAY), node, str(tmp_path / "tree"), "--level", level]
    if only:
        cmd += ["--only", only]
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
