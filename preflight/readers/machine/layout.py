"""Where the GPUs, NICs and CPUs of this machine sit relative to each other,
as facts: `nvidia-smi topo -m` (the links), sysfs (what the kernel knows: NUMA
nodes, CPU lists, PCIe links, InfiniBand/RoCE ports), NVML (NVLink per-link
state), this process's cpuset and its cgroups' CPU quota, and whether the
installed torchrun can bind ranks to NUMA nodes. The topology check judges
these facts; checkkit.placement turns them into per-rank pinning advice.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from preflight.base.host import Host, read_stripped, tool_time
from preflight.base.units import format_cpulist, parse_cpulist
from preflight.readers.nvidia import nvml, nvml_facts, topo
from preflight.readers.nvidia.nvml_facts import Inventory
from preflight.readers.nvidia.topo import Topo, TopoParseError

# A PCI address as sysfs names it; VMD domains have five hex digits (10000:e0:01.0).
BDF = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
NVIDIA_SMI_TIMEOUT = 15.0  # topo -m answers in well under a second; a wedged driver never does
TORCHRUN_TIMEOUT = 10.0  # another interpreter asked where its torch is: a Python start, no torch import
TORCHRUN_LOOKUP = "torchrun --numa-binding lookup"


# ---- facts -------------------------------------------------------------------


class PciLink(BaseModel):
    speed: str | None = None  # "32.0 GT/s PCIe", as the kernel prints it
    width: int | None = None
    max_speed: str | None = None  # sysfs max_link_*: the device's own capability (LnkCap), not its slot's
    max_width: int | None = None
    # The other end of the link: the port above the device (a root port or a switch's downstream
    # port, its PCI address) and its own max_link_*. A link trains to the narrower and slower of
    # its two ends, so an x16 card in a slot wired x8 runs x8 by design. None: sysfs shows no
    # port above the device (a VM's GPU on the root bus), or the port gives no link files.
    port: str | None = None
    port_max_speed: str | None = None
    port_max_width: int | None = None


class GpuPlace(BaseModel):
    index: int
    pci: str  # "0000:1b:00.0"
    uuid: str
    numa_node: int | None = None  # sysfs; None: the kernel does not know (-1) or no file
    local_cpus: str | None = None  # sysfs local_cpulist
    link: PciLink | None = None
    # NVML's maximum link width, "possible with this device and system" (nvml.h,
    # nvmlDeviceGetMaxPcieLinkWidth): the card's and its slot's, where sysfs shows no port.
    nvml_width_max: int | None = None
    nvlinks_active: int | None = None  # NVML; None: unknown
    nvlinks_down: list[int] = []
    # NVML's word on where the GPU sits and what its links reach (nvml_facts.Gpu's fields of the
    # same names, bus ids in sysfs form): readers.topo_derived builds the matrix from them
    # where `nvidia-smi topo -m` cannot be read.
    cpu_affinity: str | None = None
    numa_affinity: list[int] | None = None
    gpu_numa_id: int | None = None
    nvlink_remote: dict[str, int] | None = None
    nvlink_peers: dict[str, int] | None = None


class IbPort(BaseModel):
    port: int
    state: str  # "ACTIVE", "DOWN", ... without the kernel's "4: " prefix
    rate: str | None = None  # "400 Gb/sec (4X NDR)"
    link_layer: str | None = None  # InfiniBand or Ethernet (RoCE)


class Nic(BaseModel):
    name: str  # the RDMA device (mlx5_0): the name `topo -m` and NCCL_IB_HCA use
    pci: str | None = None
    numa_node: int | None = None
    netdevs: list[str] = []
    ports: list[IbPort] = []
    link: PciLink | None = None


class Cpus(BaseModel):
    online: str
    nodes: dict[str, str]  # NUMA node -> its CPU list
    allowed: str  # this process's cpuset (sched_getaffinity)
    quota: float | None = None  # CPUs' worth of time the cgroup grants (cpu.max); None: no limit
    # NUMA node -> the socket (physical package) its CPUs are on; a node whose socket sysfs does not
    # say is left out. NPS2/NPS4 and SNC2/3/4 split one socket into several nodes (topology_judges).
    packages: dict[str, str] = {}

    def usable(self) -> float:
        n = len(set(parse_cpulist(self.allowed)) & set(parse_cpulist(self.online)))
        return min(n, self.quota) if self.quota is not None else float(n)


class TopologyFacts(BaseModel):
    matrix: Topo | None = None
    matrix_error: str | None = None  # why there is no matrix
    matrix_source: str = "nvidia-smi topo -m"
    # Where the matrix came from other sources (readers.topo_derived): each of its facts ->
    # the source that answered it, and the facts no source answered -> why.
    answered: dict[str, str] = {}
    unanswered: dict[str, str] = {}
    gpus: list[GpuPlace] = []  # empty when explaining a saved capture
    nics: list[Nic] = []
    cpus: Cpus | None = None
    cuda_visible_devices: str | None = None
    torch_numa_binding: bool | None = None  # the installed torchrun has --numa-binding
    numactl: bool | None = None  # numactl is installed here; None: a capture from elsewhere
    not_run: dict[str, str] = {}  # tool -> why it was not started (too little time left): its fact is unknown
    hypervisor: bool | None = None  # a virtual machine (the CPU's hypervisor flag, /sys/hypervisor); None: a capture

    @property
    def live(self) -> bool:
        """Read on this machine (sysfs, cpuset), not from a saved capture alone."""
        return self.cpus is not None


# ---- gathering -----------------------------------------------------------------


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def pci_link(dev: Path) -> PciLink | None:
    raw = {f: read_stripped(dev / f) for f in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")}
    if all(v is None for v in raw.values()):
        return None
    return PciLink(speed=raw["current_link_speed"], width=_int(raw["current_link_width"]),
                   max_speed=raw["max_link_speed"], max_width=_int(raw["max_link_width"]))


def upstream_port(dev: Path) -> Path | None:
    """The port above a PCI device: the parent of its resolved /sys/devices entry, where that is a PCI
    address (a root port or a switch's downstream port); None where the device sits on a root bus
    (pci0000:00: a VM's passed-through GPU) or its entry is no link into /sys/devices."""
    try:
        parent = dev.resolve(strict=True).parent
    except OSError:
        return None
    return parent if BDF.match(parent.name) else None


def device_link(dev: Path) -> PciLink | None:
    """A GPU's or NIC's link, with the max_link_* of the port at its other end where sysfs shows one."""
    link = pci_link(dev)
    port = upstream_port(dev)
    if link is None or port is None:
        return link
    above = pci_link(port)
    if above is None or (above.max_width is None and above.max_speed is None):
        return link
    return link.model_copy(update={"port": port.name, "port_max_speed": above.max_speed, "port_max_width": above.max_width})


def _numa_node(dev: Path) -> int | None:
    node = _int(read_stripped(dev / "numa_node"))
    return node if node is not None and node >= 0 else None  # -1: the firmware did not say


def gpu_places(host: Host, inventory: Inventory) -> list[GpuPlace]:
    out = []
    for g in inventory.gpus:
        pci = nvml_facts.short_pci(g.pci_bus_id)
        dev = host.path(f"/sys/bus/pci/devices/{pci}")
        out.append(GpuPlace(index=g.index, pci=pci, uuid=g.uuid, numa_node=_numa_node(dev),
                            local_cpus=read_stripped(dev / "local_cpulist"), link=device_link(dev),
                            nvml_width_max=g.pcie.width_max if g.pcie else None,
                            nvlinks_active=g.nvlinks_active, nvlinks_down=g.nvlinks_down,
                            cpu_affinity=g.cpu_affinity, numa_affinity=g.numa_affinity, gpu_numa_id=g.gpu_numa_id, nvlink_remote=g.nvlink_remote,
                            nvlink_peers={nvml_facts.short_pci(bus): n for bus, n in g.nvlink_peers.items()} if g.nvlink_peers else None))
    return out


def nics(host: Host) -> list[Nic]:
    """RDMA devices (InfiniBand and RoCE) under /sys/class/infiniband."""
    root = host.path("/sys/class/infiniband")
    out = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        dev = entry / "device"
        ports = []
        for p in sorted((entry / "ports").iterdir()) if (entry / "ports").is_dir() else []:
            state = read_stripped(p / "state") or "unknown"
            ports.append(IbPort(port=_int(p.name) or 0, state=state.split(":", 1)[-1].strip(),
                                rate=read_stripped(p / "rate"), link_layer=read_stripped(p / "link_layer")))
        netdevs = sorted(n.name for n in (dev / "net").iterdir()) if (dev / "net").is_dir() else []
        pci = dev.resolve().name if dev.exists() else None
        out.append(Nic(name=entry.name, pci=pci, numa_node=_numa_node(dev), netdevs=netdevs, ports=ports, link=device_link(dev)))
    return out


def cpu_quota(host: Host) -> float | None:
    """The tightest CPU bandwidth limit on this process's cgroup and its ancestors."""
    quota = None
    for v2, levels in host.cgroup_levels("cpu"):
        for level in levels:
            if v2:
                parts = (read_stripped(level / "cpu.max") or "max").split()
                limit, period = (parts + ["100000"])[:2]
            else:
                limit, period = read_stripped(level / "cpu.cfs_quota_us") or "-1", read_stripped(level / "cpu.cfs_period_us") or "100000"
            if limit in ("max", "-1") or not limit.isdigit() or not period.isdigit() or int(period) == 0:
                continue
            cpus = int(limit) / int(period)
            quota = cpus if quota is None else min(quota, cpus)
    return quota


def machine_cpus(host: Host) -> Cpus:
    base = host.path("/sys/devices/system/node")
    nodes = {}
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])) if base.is_dir() else []:
        if text := read_stripped(d / "cpulist"):  # a memory-only node (CXL, HBM) has an empty list
            nodes[d.name[4:]] = text
    online = read_stripped(host.path("/sys/devices/system/cpu/online")) or format_cpulist(host.allowed_cpus())
    packages = {}
    for node, cpus in nodes.items():
        first = parse_cpulist(cpus)[:1]
        if first and (pkg := read_stripped(host.path(f"/sys/devices/system/cpu/cpu{first[0]}/topology/physical_package_id"))):
            packages[node] = pkg
    return Cpus(online=online, nodes=nodes, allowed=format_cpulist(host.allowed_cpus()), quota=cpu_quota(host), packages=packages)


def run_matrix(host: Host, timeout: float) -> tuple[Topo | None, str | None]:
    """`nvidia-smi topo -m`, parsed; or why not."""
    exe = shutil.which("nvidia-smi", path=host.environ.get("PATH", os.defpath))
    if exe is None:
        return None, "nvidia-smi is not on PATH (no NVIDIA driver userspace here?)"
    try:
        done = host.run([exe, "topo", "-m"], timeout=timeout, cwd="/")
    except OSError as e:
        return None, f"{exe} could not be started: {e.strerror or e}"
    if done.timed_out:
        return None, f"`nvidia-smi topo -m` did not answer in {timeout:.0f} s: the driver may be wedged"
    if done.returncode != 0:
        last = (done.stdout.strip() or done.stderr.strip() or "no output").splitlines()[-1]
        return None, f"`nvidia-smi topo -m` failed (exit {done.returncode}): {last}"
    try:
        return topo.parse(done.stdout), None
    except TopoParseError as e:
        return None, f"`nvidia-smi topo -m` printed a matrix preflight cannot read ({e}); run it by hand and report the output"


def torch_numa_binding(python: str, timeout: float = TORCHRUN_TIMEOUT) -> bool | None:
    """Does this interpreter's torchrun have --numa-binding? Read from its
    source, so torch is never imported (seconds, and a CUDA context)."""
    if python == sys.executable:
        spec = importlib.util.find_spec("torch")
        where = list(spec.submodule_search_locations or []) if spec else []
    else:
        code = "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0] if s else '')"
        try:
            done = Host().run([python, "-c", code], timeout=timeout, cwd="/")
        except OSError:
            return None
        if done.returncode != 0:
            return None
        where = [line for line in done.stdout.splitlines() if line.strip()][-1:]
    if not where:
        return None
    text = read_stripped(Path(where[0]) / "distributed" / "run.py")
    return None if text is None else "--numa-binding" in text


def gather(host: Host, nvml_fake: Path | None, python: str, deadline: float, smi_timeout: float = NVIDIA_SMI_TIMEOUT,
           inventory: nvml_facts.Inventory | None = None) -> TopologyFacts:
    """This machine's layout; ``python`` is the interpreter whose torchrun the
    job uses; ``inventory``: NVML's facts already read this run (else read here).
    Raises NvmlUnavailable when NVML cannot answer at all."""
    if inventory is None:
        inventory = nvml.inventory(nvml_fake, timeout=min(20.0, max(1.0, deadline - time.monotonic())))
    # Each tool's time is reckoned as it starts, from what is left then (a settle wait may have
    # used most of the check's), with host.RESERVE_SECONDS kept for the fallback and the judges.
    not_run: dict[str, str] = {}
    if (smi := tool_time(deadline, smi_timeout)) is None:
        matrix, error = None, f"`nvidia-smi topo -m` not run: {no_time(deadline)}"
    else:
        matrix, error = run_matrix(host, smi)
    binding = None
    if python == sys.executable:  # read in this process, no child to wait for
        binding = torch_numa_binding(python)
    elif (lookup := tool_time(deadline, TORCHRUN_TIMEOUT)) is None:
        not_run[TORCHRUN_LOOKUP] = f"not run: {no_time(deadline)}"
    else:
        binding = torch_numa_binding(python, timeout=lookup)
    return TopologyFacts(
        matrix=matrix,
        matrix_error=error,
        gpus=gpu_places(host, inventory),
        nics=nics(host),
        cpus=machine_cpus(host),
        cuda_visible_devices=host.environ.get("CUDA_VISIBLE_DEVICES"),
        torch_numa_binding=binding,
        numactl=shutil.which("numactl", path=host.environ.get("PATH", os.defpath)) is not None,
        not_run=not_run,
        hypervisor=under_hypervisor(host),
    )


def under_hypervisor(host: Host) -> bool:
    """Whether this machine is a virtual machine: x86's CPUID hypervisor bit (a "hypervisor" flag
    in /proc/cpuinfo), or Xen's /sys/hypervisor/type. Its hardware layout is then the host's to set."""
    try:
        if read_stripped(host.path("/sys/hypervisor/type")):
            return True
        with open(host.path("/proc/cpuinfo"), "rb") as f:
            for line in f:
                if line.startswith(b"flags"):
                    return b"hypervisor" in line.split(b":", 1)[-1].split()
    except OSError:
        pass
    return False


def no_time(deadline: float) -> str:
    return (f"{max(0.0, deadline - time.monotonic()):.1f} s were left before the check's deadline, kept for "
            "the facts from NVML and sysfs and the judges")
