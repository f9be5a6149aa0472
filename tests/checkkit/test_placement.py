"""Per-rank pinning advice, run for real (the advised numactl line binds each
rank on this machine), on the recorded HGX H100 tree and small matrices; and
the GPU pairs the topology check found linked, as nccl and bandwidth read them."""

import shutil
import subprocess
import sys

import pytest
from conftest import make_ctx
from preflight.checkkit import placement as t
from preflight.checkkit.placement import linked_pairs, numa_nodes
from topology_cases import edit, gathered, host, matrix, root  # noqa: F401 (root: a fixture)

from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.pipeline.check import Result
from preflight.readers.nvidia import topo


def test_advice_follows_cuda_visible_devices_by_index_and_uuid(root):
    f = gathered(host(root, CUDA_VISIBLE_DEVICES="4,5"))
    assert [(r.local_rank, r.gpu, r.numa_node) for r in t.advise(f).ranks] == [(0, 4, 1), (1, 5, 1)]
    uuid = f.gpus[6].uuid
    f = gathered(host(root, CUDA_VISIBLE_DEVICES=f"{uuid},{f.gpus[0].uuid}"))
    assert [r.gpu for r in t.advise(f).ranks] == [6, 0]
    # CUDA stops at the first entry it cannot resolve: an ambiguous UUID prefix, or one of another kind than the first
    f = gathered(host(root, CUDA_VISIBLE_DEVICES=f"1,{uuid[:-1]},0"))
    assert [r.gpu for r in t.advise(f).ranks] == [1]
    for hidden in ("", "-1", "MIG-4b3e6b3a-0000", "\u00b2"):  # empty hides every GPU; CUDA stops at -1; no whole GPU; not a digit
        advice = t.advise(gathered(host(root, CUDA_VISIBLE_DEVICES=hidden)))
        assert advice.ranks == [] and "leaves the job no GPU of this machine" in advice.summary


def test_advice_says_when_the_cpuset_forbids_a_gpus_node_and_numactl_is_missing(root):
    edit(root, "proc/self/status", "Cpus_allowed_list:\t0-55")
    f = gathered(host(root, CUDA_VISIBLE_DEVICES="4,5")).model_copy(update={"numactl": False})
    advice = t.advise(f)
    assert [r.cpus for r in advice.ranks] == [None, None]
    assert "cpuset has no CPU on NUMA node 1 (GPU 4-5)" in advice.summary and "numactl is not installed here" in advice.summary


def test_the_numactl_launch_line_binds_each_rank_for_real(tmp_path):
    """Run the advised torchrun wrapper on this machine (one NUMA node, so
    every rank goes to node 0) and read back where each rank was bound."""
    if shutil.which("numactl") is None:
        pytest.fail("numactl is missing; .ci/run installs it (apt-get install numactl)")
    f = t.TopologyFacts(matrix=topo.parse(matrix(2, {"0-1": "NV4"}, [0, 1])))
    line = t.advise(f).launch[-1]
    assert "echo 0 1 |" in line
    probe = tmp_path / "train.py"
    probe.write_text(
        "import os, pathlib\n"
        "status = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        f"pathlib.Path({str(tmp_path)!r}, 'rank' + os.environ['LOCAL_RANK']).write_text(status['Mems_allowed_list'])\n"
    )
    runnable = (line.replace("echo 0 1 |", "echo 0 0 |")  # this machine has node 0 only
                .replace("torchrun ", f"{sys.executable} -m torch.distributed.run --master-port=0 ", 1)
                .replace("python train.py", f"{sys.executable} {probe}"))
    done = subprocess.run(["sh", "-c", runnable], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["0", "0"]


# ---- linked_pairs ----------------------------------------------------------------


def test_nvlink_pairs_come_from_the_topology_matrix():
    ctx = make_ctx()
    ctx.results["topology"] = Result(check="topology", status=Status.PASS, summary="ok",
                                     details={"matrix": {"links": {"0-1": "NV18", "0-2": "SYS", "1-2": "PIX", "2-3": "NV4"}}})
    assert (linked_pairs(ctx.results.get("topology"), ("NV",)) or set()) == {frozenset({0, 1}), frozenset({2, 3})}


def test_nvlink_pairs_exactly_as_in_the_brief():
    ctx = make_ctx()
    ctx.results["topology"] = Result(check="topology", status=Status.PASS, summary="ok", details={"matrix": {"links": {"0-1": "NV18", "0-2": "SYS"}}})
    assert (linked_pairs(ctx.results.get("topology"), ("NV",)) or set()) == {frozenset({0, 1})}


@pytest.mark.parametrize("details", [{}, {"matrix": None}, {"matrix": {}}, {"matrix": {"links": None}}, {"matrix": {"links": {"GPU0-NIC0": "NV1"}}}])
def test_nvlink_pairs_without_a_usable_matrix_are_none(details):
    ctx = make_ctx()
    ctx.results["topology"] = Result(check="topology", status=Status.FAIL, summary="x", details=details)
    assert (linked_pairs(ctx.results.get("topology"), ("NV",)) or set()) == set()


def test_nvlink_pairs_without_a_topology_result_are_none():
    assert linked_pairs(make_ctx().results.get("topology"), ("NV",)) is None


def test_nvlink_pairs_no_source_told_are_none_not_an_empty_set():
    # A matrix built from sysfs alone fills its cells with PCIe distances: they say nothing of NVLink.
    details = {"matrix": {"links": {"0-1": "SYS"}}, "unanswered": {"GPU links (NVLink)": "NVML does not say ..."}}
    result = Result(check="topology", status=Status.WARN, summary="x", details=details)
    assert linked_pairs(result, ("NV",)) is None and linked_pairs(result, ("PIX", "PXB")) == set()


def test_the_numa_nodes_come_from_the_topology_check_else_from_sysfs(tmp_path):
    from topology_cases import TREE, h200_vm

    assert numa_nodes(Result(check="topology", status=Status.PASS, summary="ok", details={"cpus": {"nodes": {"0": "0-15"}}}), Host(TREE)) == 1
    assert numa_nodes(None, Host(TREE)) == 2 and numa_nodes(None, Host(h200_vm(tmp_path))) == 1
