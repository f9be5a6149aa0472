"""How the bandwidth worker reads and sets the machine (checks/workers/_bw_machine.py),
run without torch: how it reads a CPU list, binds a rank to its GPU's NUMA node,
and finds the last-level cache."""

from __future__ import annotations

import sys

from preflight.gpuwork import launch

sys.path.insert(0, str(launch.WORKERS_DIR))  # as torchrun runs the workers: siblings import by bare name
import _bw_machine as machine  # noqa: E402


def test_cpulists_read_as_the_kernel_writes_them():
    assert machine._cpulist("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}


def test_no_binding_asked_means_none_done():
    assert machine.bind(None) is None and machine.bind({"node": 0, "cpus": None}) is None


def test_binding_to_cpus_this_process_may_use(monkeypatch):
    seen = {}
    monkeypatch.setattr(machine.os, "sched_setaffinity", lambda pid, cpus: seen.update(cpus=cpus))
    monkeypatch.setattr(machine, "_prefer_node", lambda node: f"preferred node {node}")
    assert machine.bind({"node": 1, "cpus": "4-5"}) == {"node": 1, "cpus": "4-5", "memory": "preferred node 1", "error": None}
    assert seen["cpus"] == {4, 5}


def test_a_binding_the_kernel_refuses_is_reported_not_raised(monkeypatch):
    def refuse(pid, cpus):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(machine.os, "sched_setaffinity", refuse)
    got = machine.bind({"node": 1, "cpus": "4096"})
    assert got["error"] == "sched_setaffinity(4096): Invalid argument" and got["memory"] is None


def test_the_largest_cpu_cache_is_the_last_level(monkeypatch, tmp_path):
    sizes = {"index0": "48K", "index2": "2048K", "index3": "107520K"}
    for name, size in sizes.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "size").write_text(size + "\n")
    monkeypatch.setattr(machine.glob, "glob", lambda pattern: [str(tmp_path / n / "size") for n in sizes])
    assert machine.cpu_cache() == 107520 * 1024
