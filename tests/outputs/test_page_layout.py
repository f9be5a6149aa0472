"""The layout picture, from the topology check's details: recorded `nvidia-smi
topo -m` captures in the report a run would write, and the recorded report
of a run that could not read the matrix."""

from __future__ import annotations

import re
from pathlib import Path

from preflight.outputs.html import page_layout
from preflight.pipeline.report import Report
from preflight.readers.nvidia import topo

HERE = Path(__file__).parent.parent / "fixtures"


def with_matrix(capture: str) -> Report:
    """The fake 8x H100 report, its topology details holding the capture's matrix as a run records it."""
    r = Report.model_validate_json((HERE / "reports" / "h100-fake-hw-slowdown.json").read_bytes())
    t = topo.parse((HERE / "topo" / capture).read_text())
    c = next(c for c in r.checks if c.check == "topology")
    gpus = [{"index": g.index, "nvlinks_active": None} for g in t.gpus]
    c.details.update({"matrix": t.model_dump(mode="json"), "gpus": gpus, "nics": [{"name": n} for n in t.nics]})
    return r


def test_two_numa_nodes_hold_their_own_gpus_and_a_full_mesh_is_one_bar():
    lay = page_layout.layout(with_matrix("03_h100-sxm-8x_nv18_12nic_2numa_no-leading-tab-header.txt"))
    assert lay is not None
    on = {p.name: p.numa for p in lay.parts if p.kind == "gpu"}
    assert on == {**{f"GPU {i}": "0" for i in range(4)}, **{f"GPU {i}": "1" for i in range(4, 8)}}
    assert len(lay.links) == 28 and set(lay.links.values()) == {"NV18"}
    svg = page_layout.picture(lay)
    assert "every GPU pair joined by NV18" in svg and 'class="nvlink"' not in svg
    assert len(re.findall(r'<g class="gpu"', svg)) == 8 and len(re.findall(r'<g class="numa"', svg)) >= 2


def test_a_partial_mesh_draws_each_nvlink():
    lay = page_layout.layout(with_matrix("11_dgx1-v100_8x_hybrid-cube-mesh_nv1-nv2_4mlx5-unordered_no-numa-col.txt"))
    svg = page_layout.picture(lay)
    pairs = re.findall(r'<g class="nvlink" data-pair="(\d)-(\d)"', svg)
    assert {(int(a), int(b)) for a, b in pairs} == set(lay.links) and 0 < len(pairs) < 28  # a hybrid cube mesh: some pairs unlinked


def test_without_a_matrix_the_gpus_stand_on_an_unknown_numa_node():
    r = Report.model_validate_json((HERE / "reports" / "h100-fake-hw-slowdown.json").read_bytes())
    lay = page_layout.layout(r)
    assert lay is not None and {p.numa for p in lay.parts} == {"?"}
    assert "no link matrix: nvidia-smi is not on PATH" in lay.source
    svg = page_layout.picture(lay)
    assert "NUMA node unknown" in svg and "18 NVLinks" in svg


def test_a_gpu_with_a_link_down_is_drawn_red():
    r = Report.model_validate_json((HERE / "reports" / "h100-fake-hw-slowdown.json").read_bytes())
    c = next(c for c in r.checks if c.check == "topology")
    c.details["gpus"][3] = {**c.details["gpus"][3], "nvlinks_active": 16, "nvlinks_down": [4, 9]}
    lay = page_layout.layout(r)
    bad = [p.name for p in lay.parts if p.bad]
    assert bad == ["GPU 3"]
    assert "16 NVLinks, 2 down" in page_layout.picture(lay)


def test_no_topology_check_no_picture():
    r = Report.model_validate_json((HERE / "reports" / "cpu-pass.json").read_bytes())
    assert page_layout.layout(r) is None


def test_a_matrix_built_from_nvml_and_sysfs_says_so_and_why():
    r = with_matrix("03_h100-sxm-8x_nv18_12nic_2numa_no-leading-tab-header.txt")
    c = next(c for c in r.checks if c.check == "topology")
    c.details.update({"matrix_source": "NVML and sysfs", "matrix_error": "nvidia-smi is not on PATH"})
    lay = page_layout.layout(r)
    assert lay.source == "NVML and sysfs (`nvidia-smi topo -m` unreadable: nvidia-smi is not on PATH)"
    assert len(lay.links) == 28
    assert page_layout.layout(with_matrix("03_h100-sxm-8x_nv18_12nic_2numa_no-leading-tab-header.txt")).source == "nvidia-smi topo -m, sysfs and NVML"
