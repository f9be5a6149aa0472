"""The bandwidth worker's own pure parts (checks/workers/bandwidth.py), run
without torch: how it shrinks sizes that do not fit, how many buffer sets it
rotates through, and how it reads a CPU list. Its timing runs for real in
test_bandwidth.py."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from preflight.gpuwork import launch

sys.path.insert(0, str(launch.WORKERS_DIR))  # the worker imports _rank from beside it, as torchrun runs it
_spec = importlib.util.spec_from_file_location("bandwidth_worker", launch.WORKERS_DIR / "bandwidth.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

GIB, MIB = 1 << 30, 1 << 20


def test_a_size_that_fits_is_used_as_asked():
    assert worker.fit("hbm_copy", GIB, 2, 80 * GIB, "cuda:0") == (GIB, None)


def test_a_size_past_the_free_memory_is_clamped_and_says_so():
    # 4 GiB x 2 (src + dst) x 2 sets = 16 GiB needed; 10 GiB free, 70% usable -> 1.75 GiB buffers
    nbytes, said = worker.fit("hbm_copy", 4 * GIB, 2, 10 * GIB, "cuda:3")
    assert nbytes == int(0.7 * 10 * GIB / 4) // MIB * MIB and nbytes % MIB == 0
    assert said == "hbm_copy: 4.00 GiB asked, 1.75 GiB used: 10.00 GiB free on cuda:3"


def test_memory_too_small_for_even_a_mebibyte_is_an_error_naming_the_device():
    with pytest.raises(MemoryError, match=r"all_reduce: 0.00 GiB free on cuda:1, not enough"):
        worker.fit("all_reduce", GIB, 1, 2 * MIB, "cuda:1")


def test_unknown_free_memory_uses_the_size_asked():
    assert worker.fit("memcpy", 64 * MIB + 3, 2, None, "this host") == (64 * MIB, None)


def test_cpulists_read_as_the_kernel_writes_them():
    assert worker._cpulist("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}


def test_no_binding_asked_means_none_done():
    assert worker.bind(None) is None and worker.bind({"node": 0, "cpus": None}) is None


def test_binding_to_cpus_this_process_may_use(monkeypatch):
    seen = {}
    monkeypatch.setattr(worker.os, "sched_setaffinity", lambda pid, cpus: seen.update(cpus=cpus))
    monkeypatch.setattr(worker, "_prefer_node", lambda node: f"preferred node {node}")
    assert worker.bind({"node": 1, "cpus": "4-5"}) == {"node": 1, "cpus": "4-5", "memory": "preferred node 1", "error": None}
    assert seen["cpus"] == {4, 5}


def test_a_binding_the_kernel_refuses_is_reported_not_raised(monkeypatch):
    def refuse(pid, cpus):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(worker.os, "sched_setaffinity", refuse)
    got = worker.bind({"node": 1, "cpus": "4096"})
    assert got["error"] == "sched_setaffinity(4096): Invalid argument" and got["memory"] is None


def test_the_largest_cpu_cache_is_the_last_level(monkeypatch, tmp_path):
    sizes = {"index0": "48K", "index2": "2048K", "index3": "107520K"}
    for name, size in sizes.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "size").write_text(size + "\n")
    monkeypatch.setattr(worker.glob, "glob", lambda pattern: [str(tmp_path / n / "size") for n in sizes])
    assert worker._cpu_cache() == 107520 * 1024
