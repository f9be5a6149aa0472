"""The layout reader: the recorded HGX H100 sysfs tree (and edits of it), this
machine's own CPUs and cgroups, and torchrun's --numa-binding read from
torch's source."""

import os
import sys
import time
from pathlib import Path

import fakes
import pytest
from preflight.base import tooltext
from preflight.base.host import Host
from preflight.base.units import parse_cpulist
from preflight.checkkit.topology_judges import judge_pcie, pcie_held
from preflight.readers.machine import layout as t
from preflight.readers.nvidia import topo
from topology_cases import H200_TOPO, edit, gathered, host, root  # noqa: F401 (root: a fixture)


def test_gather_reads_gpus_nics_numa_and_cpus_from_the_recorded_tree(root):
    f = gathered(host(root))
    assert f.matrix is not None and f.matrix_error is None and len(f.matrix.gpus) == 8
    assert [g.numa_node for g in f.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert f.gpus[0].pci == "0000:1b:00.0" and f.gpus[0].local_cpus == "0-55,112-167"
    assert f.gpus[0].link == t.PciLink(speed="32.0 GT/s PCIe", width=16, max_speed="32.0 GT/s PCIe", max_width=16)
    assert f.cpus == t.Cpus(online="0-223", nodes={"0": "0-55,112-167", "1": "56-111,168-223"}, allowed="0-223", quota=None)
    nics = {n.name: n for n in f.nics}
    assert len(nics) == 12 and nics["mlx5_0"].pci == "0000:18:00.0" and nics["mlx5_0"].netdevs == ["ibp24s0"]
    assert nics["mlx5_6"].numa_node == 1 and nics["mlx5_6"].ports == [t.IbPort(port=1, state="ACTIVE", rate="400 Gb/sec (4X NDR)", link_layer="InfiniBand")]
    assert nics["mlx5_4"].ports[0].link_layer == "Ethernet"


def gx10_second_nic(tmp: Path) -> Path:
    """The ASUS Ascent GX10's second ConnectX-7 halves (0002:01:00.0/.1, RoCE), as sysfs shows them: each
    function's LnkCap x4 Gen5, trained x2 because the root port above them, 0002:00:00.0, has two lanes
    (NVIDIA developer forum, "ASUS Ascent GX10 - Second ConnectX-7 PCIe slot wired at Gen5 x2 instead of x4")."""
    root = tmp / "gx10"
    port = root / "sys/devices/pci0002:00/0002:00:00.0"
    for d, width, most in [(port, 2, 2), *((port / f"0002:01:00.{fn}", 2, 4) for fn in (0, 1))]:
        d.mkdir(parents=True, exist_ok=True)
        for name, value in [("current_link_speed", "32.0 GT/s PCIe"), ("current_link_width", width),
                            ("max_link_speed", "32.0 GT/s PCIe"), ("max_link_width", most)]:
            (d / name).write_text(f"{value}\n")
    for fn, name in ((0, "roceP2p1s0f0"), (1, "roceP2p1s0f1")):
        for link, target in ((f"sys/bus/pci/devices/0002:01:00.{fn}", f"../../../devices/pci0002:00/0002:00:00.0/0002:01:00.{fn}"),
                             (f"sys/class/infiniband/{name}/device", f"../../../bus/pci/devices/0002:01:00.{fn}")):
            (root / link).parent.mkdir(parents=True, exist_ok=True)
            (root / link).symlink_to(target)
    # a device straight on a root bus, as a VM shows its passed-through GPU: no port above it
    vm = root / "sys/devices/pci0000:00/0000:00:06.0"
    vm.mkdir(parents=True)
    (vm / "max_link_width").write_text("16\n")
    (root / "sys/bus/pci/devices/0000:00:06.0").symlink_to("../../../devices/pci0000:00/0000:00:06.0")
    return root


def test_a_nic_link_carries_the_port_above_it_and_is_held_to_that_port_s_two_lanes(tmp_path):
    root = gx10_second_nic(tmp_path)
    nics = t.nics(Host(root))
    assert [(n.name, n.link.width, n.link.max_width, n.link.port, n.link.port_max_width) for n in nics] == [
        ("roceP2p1s0f0", 2, 4, "0002:00:00.0", 2), ("roceP2p1s0f1", 2, 4, "0002:00:00.0", 2)]
    facts = t.TopologyFacts(nics=nics)
    assert judge_pcie(facts) == []  # x2 is all the slot has: no WARN
    assert pcie_held(facts) == [f"NIC {n} PCIe x2: held to x2 by its port 0002:00:00.0 (the device allows x4)" for n in ("roceP2p1s0f0", "roceP2p1s0f1")]


def test_a_device_on_a_root_bus_has_no_port_to_read(tmp_path):
    root = gx10_second_nic(tmp_path)
    assert t.upstream_port(root / "sys/bus/pci/devices/0000:00:06.0") is None
    assert t.device_link(root / "sys/bus/pci/devices/0000:00:06.0") == t.PciLink(max_width=16)
    assert t.upstream_port(root / "sys/bus/pci/devices/0002:01:00.1").name == "0002:00:00.0"


def test_gather_on_this_machine_counts_its_real_cpus_and_nodes():
    cpus = t.machine_cpus(Host())
    assert set(parse_cpulist(cpus.allowed)) == os.sched_getaffinity(0)
    assert cpus.nodes and set().union(*(parse_cpulist(c) for c in cpus.nodes.values())) >= os.sched_getaffinity(0)


def test_a_cgroup_v2_cpu_quota_counts_as_fewer_cpus(root):
    edit(root, "sys/fs/cgroup/system.slice/cpu.max", "1600000 100000")  # the parent's limit binds the child
    assert t.cpu_quota(Host(root)) == 16


def test_a_cgroup_v1_cpu_quota_is_read_too(root):
    edit(root, "proc/self/cgroup", "4:cpu,cpuacct:/docker/abc\n0::/")
    (root / "sys/fs/cgroup/cpu,cpuacct/docker/abc").mkdir(parents=True)
    edit(root, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "800000")
    edit(root, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000")
    assert t.cpu_quota(Host(root)) == 8


def test_torchrun_numa_binding_is_found_without_importing_torch():
    assert t.torch_numa_binding(sys.executable) is True  # torch 2.13 has --numa-binding
    assert t.torch_numa_binding("/nonexistent/python") is None


def test_an_older_torch_without_numa_binding_is_told_apart(tmp_path, monkeypatch):
    fake = tmp_path / "site" / "torch" / "distributed"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("raise SystemExit('must not be imported')\n")
    (fake / "run.py").write_text("parser.add_argument('--nproc-per-node')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    other = str(Path(sys.executable).resolve())  # another path to an interpreter: asked in a child
    assert other != sys.executable and t.torch_numa_binding(other) is False


def test_the_live_path_reads_the_h200_matrix_a_stand_in_nvidia_smi_prints_byte_for_byte(tmp_path):
    """driver 580 underlines the header even into a pipe: what Host.run hands on is the matrix
    without the escapes, and run_matrix reads one GPU on CPUs 0-15, NUMA node 0, no NIC, no NVLink."""
    h = Host(tmp_path, environ={"PATH": str(fakes.nvidia_smi(tmp_path / "bin", H200_TOPO))})
    done = h.run([str(tmp_path / "bin" / "nvidia-smi"), "topo", "-m"], timeout=30)
    assert done.returncode == 0 and "\x1b" not in done.stdout
    assert done.stdout == tooltext.clean(H200_TOPO.read_text())
    got, why = t.run_matrix(h, timeout=30)
    assert why is None and got == topo.parse(H200_TOPO.read_text())
    assert [(g.cpu_affinity, g.numa_nodes, g.gpu_numa_id, g.nics) for g in got.gpus] == [("0-15", [0], None, {})]
    assert (got.nics, got.links, got.notes) == ([], {}, [])


@pytest.mark.gpu
def test_a_real_nvidia_smi_answers_in_what_a_full_settle_wait_leaves():
    """On a real node: a settle wait that used all it may leaves settle.MARGIN_SECONDS of the
    check; nvidia-smi topo -m is given that less host.RESERVE_SECONDS, and must still answer in
    it, so a node that settled is judged on its own matrix, not the one built from NVML."""
    from preflight.checkkit import settle
    from preflight.readers.nvidia import nvml

    inventory = nvml.inventory()  # the run's reading, taken before topology's turn
    started = time.monotonic()
    f = t.gather(Host(), None, sys.executable, started + settle.MARGIN_SECONDS, inventory=inventory)
    took = time.monotonic() - started
    assert f.matrix_error is None and f.matrix is not None and len(f.matrix.gpus) == len(inventory.gpus), f.matrix_error
    print(f"layout gathered with nvidia-smi topo -m on {len(inventory.gpus)} GPU(s) in {took:.2f} s "
          f"of the {settle.MARGIN_SECONDS:g} s a full settle wait leaves")
