"""Where the GPUs, NICs and CPUs sit relative to each other, judged against
the SKU, and how to pin each rank.

A node can pass every yes/no test and still train at half speed: GPUs split
4+4 across sockets with NCCL's threads on the wrong one, a missing NVLink
between a pair, a NIC two hops from its GPU, too few CPUs for eight ranks.
This check reads `nvidia-smi topo -m` (the links), sysfs (what the kernel
knows: NUMA nodes, CPU lists, PCIe links, InfiniBand/RoCE ports), NVML
(NVLink per-link state) and this process's cpuset and CPU quota, then judges
them in pure functions and writes per-rank pinning advice into the report.
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

from preflight.readers import nvml, topo
from preflight.pipeline.check import Check, Context, Result
from preflight.base.findings import Finding, Measurement, Status, worst
from preflight.base.host import Host
from preflight.readers.nvml import Inventory
from preflight.pipeline.profiles import ResolvedProfile, TopologyExpect
from preflight.pipeline.settings import Settings
from preflight.pipeline.shape import NodeShape
from preflight.readers.topo import NEAR, Topo, TopoParseError
from preflight.base.units import format_cpulist, parse_cpulist

FAIL, WARN = Status.FAIL, Status.WARN
NVIDIA_SMI_TIMEOUT = 15.0  # topo -m answers in well under a second; a wedged driver never does
PIN = "bind each rank to its GPU's NUMA node (the advice, details.advice in the report, has the exact command)"


# ---- facts -------------------------------------------------------------------


class PciLink(BaseModel):
    speed: str | None = None  # "32.0 GT/s PCIe", as the kernel prints it
    width: int | None = None
    max_speed: str | None = None
    max_width: int | None = None


class GpuPlace(BaseModel):
    index: int
    pci: str  # "0000:1b:00.0"
    uuid: str
    numa_node: int | None = None  # sysfs; None: the kernel does not know (-1) or no file
    local_cpus: str | None = None  # sysfs local_cpulist
    link: PciLink | None = None
    nvlinks_active: int | None = None  # NVML; None: unknown
    nvlinks_down: list[int] = []


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

    def usable(self) -> float:
        n = len(set(parse_cpulist(self.allowed)) & set(parse_cpulist(self.online)))
        return min(n, self.quota) if self.quota is not None else float(n)


class TopologyFacts(BaseModel):
    matrix: Topo | None = None
    matrix_error: str | None = None  # why there is no matrix
    matrix_source: str = "nvidia-smi topo -m"
    gpus: list[GpuPlace] = []  # empty when explaining a saved capture
    nics: list[Nic] = []
    cpus: Cpus | None = None
    cuda_visible_devices: str | None = None
    torch_numa_binding: bool | None = None  # the installed torchrun has --numa-binding
    numactl: bool | None = None  # numactl is installed here; None: a capture from elsewhere

    @property
    def live(self) -> bool:
        """Read on this machine (sysfs, cpuset), not from a saved capture alone."""
        return self.cpus is not None


# ---- gathering -----------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def pci_link(dev: Path) -> PciLink | None:
    raw = {f: _read(dev / f) for f in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")}
    if all(v is None for v in raw.values()):
        return None
    return PciLink(speed=raw["current_link_speed"], width=_int(raw["current_link_width"]),
                   max_speed=raw["max_link_speed"], max_width=_int(raw["max_link_width"]))


def _numa_node(dev: Path) -> int | None:
    node = _int(_read(dev / "numa_node"))
    return node if node is not None and node >= 0 else None  # -1: the firmware did not say


def gpu_places(host: Host, inventory: Inventory) -> list[GpuPlace]:
    out = []
    for g in inventory.gpus:
        pci = nvml.short_pci(g.pci_bus_id)
        dev = host.path(f"/sys/bus/pci/devices/{pci}")
        out.append(GpuPlace(index=g.index, pci=pci, uuid=g.uuid, numa_node=_numa_node(dev),
                            local_cpus=_read(dev / "local_cpulist"), link=pci_link(dev),
                            nvlinks_active=g.nvlinks_active, nvlinks_down=g.nvlinks_down))
    return out


def nics(host: Host) -> list[Nic]:
    """RDMA devices (InfiniBand and RoCE) under /sys/class/infiniband."""
    root = host.path("/sys/class/infiniband")
    out = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        dev = entry / "device"
        ports = []
        for p in sorted((entry / "ports").iterdir()) if (entry / "ports").is_dir() else []:
            state = _read(p / "state") or "unknown"
            ports.append(IbPort(port=_int(p.name) or 0, state=state.split(":", 1)[-1].strip(),
                                rate=_read(p / "rate"), link_layer=_read(p / "link_layer")))
        netdevs = sorted(n.name for n in (dev / "net").iterdir()) if (dev / "net").is_dir() else []
        pci = dev.resolve().name if dev.exists() else None
        out.append(Nic(name=entry.name, pci=pci, numa_node=_numa_node(dev), netdevs=netdevs, ports=ports, link=pci_link(dev)))
    return out


def cpu_quota(host: Host) -> float | None:
    """The tightest CPU bandwidth limit on this process's cgroup and its ancestors."""
    quota = None
    for v2, levels in host.cgroup_levels("cpu"):
        for level in levels:
            if v2:
                parts = (_read(level / "cpu.max") or "max").split()
                limit, period = (parts + ["100000"])[:2]
            else:
                limit, period = _read(level / "cpu.cfs_quota_us") or "-1", _read(level / "cpu.cfs_period_us") or "100000"
            if limit in ("max", "-1") or not limit.isdigit() or not period.isdigit() or int(period) == 0:
                continue
            cpus = int(limit) / int(period)
            quota = cpus if quota is None else min(quota, cpus)
    return quota


def machine_cpus(host: Host) -> Cpus:
    base = host.path("/sys/devices/system/node")
    nodes = {}
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])) if base.is_dir() else []:
        if text := _read(d / "cpulist"):  # a memory-only node (CXL, HBM) has an empty list
            nodes[d.name[4:]] = text
    online = _read(host.path("/sys/devices/system/cpu/online")) or format_cpulist(host.allowed_cpus())
    return Cpus(online=online, nodes=nodes, allowed=format_cpulist(host.allowed_cpus()), quota=cpu_quota(host))


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


def torch_numa_binding(python: str, timeout: float = 10.0) -> bool | None:
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
    text = _read(Path(where[0]) / "distributed" / "run.py")
    return None if text is None else "--numa-binding" in text


def gather(host: Host, settings: Settings, deadline: float) -> TopologyFacts:
    """Raises NvmlUnavailable when NVML cannot answer at all."""
    left = max(1.0, deadline - time.monotonic())
    inventory = nvml.inventory(settings.nvml_fake, timeout=min(20.0, left))
    matrix, error = run_matrix(host, min(NVIDIA_SMI_TIMEOUT, left))
    python = str(settings.python) if settings.python else sys.executable
    return TopologyFacts(
        matrix=matrix,
        matrix_error=error,
        gpus=gpu_places(host, inventory),
        nics=nics(host),
        cpus=machine_cpus(host),
        cuda_visible_devices=host.environ.get("CUDA_VISIBLE_DEVICES"),
        torch_numa_binding=torch_numa_binding(python, timeout=min(10.0, left)),
        numactl=shutil.which("numactl", path=host.environ.get("PATH", os.defpath)) is not None,
    )


# ---- judging -------------------------------------------------------------------


def _nv(link: str) -> int:
    return int(link[2:]) if link.startswith("NV") else 0


def _names(items: list[str], most: int = 6) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def gpu_numa(facts: TopologyFacts, index: int) -> int | None:
    """The NUMA node of GPU ``index``: the kernel's word first, then nvidia-smi's."""
    for g in facts.gpus:
        if g.index == index and g.numa_node is not None:
            return g.numa_node
    m = facts.matrix
    if m and index < len(m.gpus) and m.gpus[index].numa_nodes and len(m.gpus[index].numa_nodes) == 1:
        return m.gpus[index].numa_nodes[0]
    return None


def gpu_count(facts: TopologyFacts) -> int:
    return len(facts.gpus) or (len(facts.matrix.gpus) if facts.matrix else 0)


def _numa_unknown(facts: TopologyFacts, index: int) -> bool:
    """Nobody says where GPU ``index`` sits (a GPU affine to several nodes, "0-1", is known)."""
    if gpu_numa(facts, index) is not None:
        return False
    m = facts.matrix
    return not (m and index < len(m.gpus) and m.gpus[index].numa_nodes)


def _socket_groups(facts: TopologyFacts) -> int:
    """How many disjoint CPU sets the GPUs' affinities form: sockets, where NUMA numbers are missing."""
    m = facts.matrix
    return len(m.cpu_groups) if m and m.spans_numa and all(g.cpus for g in m.gpus) else 0


def link_mode(expect: TopologyExpect, shape: NodeShape | None) -> str:
    """What to hold the matrix to on this node. The profile says how a model's GPUs
    are joined when they are (NVSwitch: every pair NV<width>; bridges: pairs);
    the node says whether they are. A saved capture (no shape) gets the profile's word.
    "mesh": every pair by some NVLink (a direct-link board, e.g. 4-GPU HGX, NV6 a pair);
    "peers": no GPU left out where the others have NVLink."""
    if shape is None:
        return expect.nvlink
    if shape.fabric == "nvswitch":
        return "all" if expect.nvlink == "all" else "peers"
    if shape.fabric == "nvlink":
        return {"all": "mesh", "pairs": "pairs"}.get(expect.nvlink, "peers")
    return "none"  # one GPU, or GPUs joined by PCIe only: no NVLink to judge


def judge_links(facts: TopologyFacts, expect: TopologyExpect, shape: NodeShape | None = None) -> list[Finding]:
    m, want = facts.matrix, expect.nvlink_width
    out = []
    down = {g.index: g.nvlinks_down for g in facts.gpus if g.nvlinks_down}
    mode = link_mode(expect, shape)
    if m is not None and mode in ("mesh", "peers"):
        out += _left_out(m, every_pair=mode == "mesh")
    if m is not None and mode == "all":
        short = {k: v for k, v in m.links.items() if _nv(v) < want}
        n = len(m.gpus)
        if n > 2 and len(short) == len(m.links) and not any(_nv(v) for v in short.values()):
            kinds = "/".join(sorted(set(short.values())))
            return [Finding(FAIL, f"no NVLink between any GPUs, NV{want} expected",
                            f"every GPU pair is joined by {kinds}, none by NVLink: this is not the board the profile describes, or its NVSwitch fabric is down",
                            "check the profile (`preflight detect`), then `nvidia-smi nvlink -s` and nvidia-fabricmanager")]
        every = dict(short)
        for i in range(n):  # a GPU short to every peer lost its own links: name the GPU, not 7 pairs
            mine = [k for k in every if i in map(int, k.split("-"))]
            if n > 2 and len(mine) == n - 1:
                links = sorted({every[k] for k in mine})
                nvml_says = f"; NVML reports its link(s) {', '.join(map(str, down[i]))} down" if i in down else ""
                out.append(Finding(FAIL, f"GPU {i} has {'/'.join(links)} to every peer, NV{want} expected",
                                   f"GPU {i} reaches its {n - 1} peers over {'/'.join(links)} instead of NV{want}{nvml_says}: "
                                   "its NVLink bandwidth is cut",
                                   _NVLINK_REMEDY))
                short = {k: v for k, v in short.items() if k not in mine}
        if short:
            pairs = [f"GPU {k.replace('-', '-GPU ')} {v}" for k, v in short.items()]
            out.append(Finding(FAIL, f"NVLink below NV{want} between {len(short)} GPU pair(s)",
                               f"expected NV{want} between every GPU pair, found {_names(pairs)}", _NVLINK_REMEDY))
    elif m is not None and mode == "pairs":
        for g in range(len(m.gpus)):
            peers = {j: m.link(g, j) for j in range(len(m.gpus)) if j != g and _nv(m.link(g, j))}
            best = max(peers.items(), key=lambda kv: _nv(kv[1]), default=None)
            if best is None:
                out.append(Finding(FAIL, f"GPU {g} has no NVLink peer", f"GPU {g} has no NVLink to any GPU (NV{want} bridge to its pair expected): "
                                   "the bridge is missing or unseated", "reseat or replace the NVLink bridge of this GPU pair; " + _NVLINK_REMEDY))
            elif _nv(best[1]) < want and g < best[0]:
                out.append(Finding(FAIL, f"GPU {g}-GPU {best[0]} bridged at {best[1]}, NV{want} expected",
                                   f"GPU {g} and GPU {best[0]} are joined by {best[1]} instead of NV{want}: a bridge of the pair is missing or a link is down",
                                   "reseat the NVLink bridges of this pair; " + _NVLINK_REMEDY))
    listed = {i for f in out for i in range(gpu_count(facts)) if re.search(rf"GPU {i}\b", f.cause)}
    for i, links in sorted(down.items()):
        if i not in listed:
            out.append(Finding(FAIL, f"GPU {i}: NVLink {', '.join(map(str, links))} down",
                               f"NVML reports NVLink link(s) {', '.join(map(str, links))} of GPU {i} present but not active", _NVLINK_REMEDY))
    return out


def _left_out(m: Topo, every_pair: bool) -> list[Finding]:
    """On a node whose GPUs NVLink joins: a GPU with no NVLink peer at all, or
    (``every_pair``) a pair with none between them."""
    n = len(m.gpus)
    lone = [g for g in range(n) if not any(_nv(m.link(g, j)) for j in range(n) if j != g)]
    out = [Finding(FAIL, f"GPU {g} has no NVLink peer", f"GPU {g} has no NVLink to any GPU while the node's other GPUs are joined by NVLink: "
                   "its bridge is missing or unseated, or its links are down", "reseat or replace the NVLink bridge of this GPU; " + _NVLINK_REMEDY)
           for g in lone if len(lone) < n]
    if every_pair:
        pairs = [f"GPU {a}-GPU {b} {m.link(a, b)}" for a in range(n) for b in range(a + 1, n) if a not in lone and b not in lone and not _nv(m.link(a, b))]
        if pairs:
            out.append(Finding(FAIL, f"no NVLink between {len(pairs)} GPU pair(s)", f"this board joins every GPU pair by NVLink; found {_names(pairs)}", _NVLINK_REMEDY))
    return out


_NVLINK_REMEDY = ("check `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e` for the GPU; on NVSwitch systems check that "
                  "nvidia-fabricmanager is running; a link that stays down needs a reset or an RMA")


def numa_span(facts: TopologyFacts) -> int:
    """NUMA nodes the GPUs sit on; where their numbers are missing, the disjoint CPU sets stand for them."""
    return max(len({node for i in range(gpu_count(facts)) if (node := gpu_numa(facts, i)) is not None}), _socket_groups(facts))


def judge_numa(facts: TopologyFacts, expect: TopologyExpect) -> list[Finding]:
    n = gpu_count(facts)
    known = {i: node for i in range(n) if (node := gpu_numa(facts, i)) is not None}
    out = []
    unknown = [i for i in range(n) if _numa_unknown(facts, i)]
    several = (facts.cpus is not None and len(facts.cpus.nodes) > 1) or bool(facts.matrix and facts.matrix.spans_numa)
    if unknown and several:
        who = _names([str(i) for i in unknown])
        if facts.live:
            cause = f"neither the kernel (numa_node -1) nor nvidia-smi knows the NUMA node of GPU {who} on a machine with several"
            remedy = "enable NUMA reporting in the BIOS (ACPI SRAT / PCIe proximity); meanwhile bind their ranks by the CPU lists in the advice"
        else:
            cause = f"the capture does not say which NUMA node GPU {who} sits on (no NUMA column, or N/A), and its GPUs use different CPUs"
            remedy = "read /sys/bus/pci/devices/<GPU>/numa_node on the node, or capture `nvidia-smi topo -m` with a newer driver"
        out.append(Finding(WARN, f"NUMA node of GPU {who} unknown", cause + ": nothing can pin their ranks to the right socket", remedy))
    span = numa_span(facts)
    limit = expect.numa_fail_above
    status = FAIL if limit is not None and span > limit else WARN if span > expect.numa_warn_above else None
    if status is not None:
        if known and not unknown:
            split = "; ".join(f"node {node}: GPU {format_cpulist([i for i, x in known.items() if x == node])}" for node in sorted(set(known.values())))
        else:  # the CPU sets stand for the sockets
            m = facts.matrix
            split = "; ".join(f"CPUs {g}: GPU {format_cpulist([x.index for x in m.gpus if x.cpu_affinity == g])}" for g in m.cpu_groups)  # type: ignore[union-attr]
        allowed = limit if status == FAIL else expect.numa_warn_above
        out.append(Finding(status, f"GPUs span {span} NUMA nodes ({split})",
                           f"the GPUs sit on {span} NUMA nodes ({split}), more than the {allowed} expected: a rank left "
                           "unpinned runs its NCCL proxy threads and data loader on whichever socket the scheduler picks, and its "
                           "host<->device copies then cross the socket interconnect (UPI/xGMI)",
                           PIN if status == WARN else "set the BIOS NUMA mode (NPS/SNC) to the fleet's; meanwhile " + PIN))
    return out


def judge_nics(facts: TopologyFacts, expect: TopologyExpect, shape: NodeShape | None = None, multi_node: bool = False) -> list[Finding]:
    """A NIC at PIX/PXB beside every GPU, on a model built for multi-node jobs.
    On a live node it applies where the node has NICs at all: a node with none
    (a single-node VM) says so once, in its shape, unless the site pins
    multi-node use; one GPU has no GPU-to-NIC layout to get wrong."""
    m = facts.matrix
    if not expect.nic_per_gpu or m is None:
        return []
    if shape is not None and not multi_node and (shape.gpus <= 1 or not (m.nics or facts.nics)):
        return []
    remedy = "check that the NICs are seated and their driver (mlx5_core, mlx5_ib) is loaded (`ibv_devinfo`); a node built for multi-node jobs needs one NIC beside each GPU"
    if not m.nics:
        return [Finding(FAIL, "no NIC in the GPU topology", "`nvidia-smi topo -m` lists no NIC: multi-node traffic would leave through "
                        "the host's other network at a fraction of the speed, without GPUDirect RDMA", remedy)]
    out = []
    # The matrix names RDMA devices (mlx5_0) or, on some drivers, netdevs (ibp24s0): look up both.
    ports = {name: nic.ports for nic in facts.nics for name in (nic.name, *nic.netdevs)}
    if facts.live:
        near_all = {n for g in m.gpus for n in m.nearest_nics.get(str(g.index), []) if g.nics[n] in NEAR}
        unseen = sorted(near_all - set(ports))
        if unseen:
            out.append(Finding(WARN, f"state of NIC {_names(unseen)} unknown",
                               f"`nvidia-smi topo -m` lists {_names(unseen)} beside GPUs, but /sys/class/infiniband has no RDMA device of that name, "
                               "so whether its port is up is unknown", "check that mlx5_ib (or the NIC's RDMA driver) is loaded: `ibv_devinfo`, `ibstat`"))
    for g in m.gpus:
        near = [n for n, link in g.nics.items() if link in NEAR]
        if not near:
            best = m.nearest_nics.get(str(g.index), [])
            out.append(Finding(FAIL, f"GPU {g.index} has no NIC at PIX/PXB",
                               f"GPU {g.index}'s nearest NIC is {'/'.join(best) or 'none'} at {g.nics.get(best[0], '?') if best else '-'}: "
                               "NCCL uses GPUDirect RDMA only up to PXB by default (NCCL_NET_GDR_LEVEL), so its traffic is staged through host memory",
                               remedy))
            continue
        # NCCL gives each GPU its nearest NIC: if all of those are down, the
        # GPU's traffic moves to a NIC another GPU already uses.
        nearest = [n for n in m.nearest_nics.get(str(g.index), []) if ports.get(n)]
        if nearest and not any(p.state == "ACTIVE" for n in nearest for p in ports[n]):
            states = ", ".join(f"{n} port {p.port} {p.state}" for n in nearest for p in ports[n])
            out.append(Finding(FAIL, f"GPU {g.index}'s NIC is down", f"the NIC nearest GPU {g.index} has no active port ({states})",
                               "check the cable and the switch port (`ibstat`, `ibv_devinfo`); until then this GPU's traffic shares another GPU's NIC"))
    return out


def judge_cpus(facts: TopologyFacts, floor: float | None) -> list[Finding]:
    c = facts.cpus
    # A shared node may show every GPU but give this job a few (CUDA_VISIBLE_DEVICES): count those.
    n = len(_rank_gpus(facts, gpu_count(facts)))
    if c is None or not n:
        return []
    out = []
    per_gpu = c.usable() / n
    online, allowed = parse_cpulist(c.online), set(parse_cpulist(c.allowed)) & set(parse_cpulist(c.online))
    if floor is not None and per_gpu < floor:
        why = [f"{len(online)} CPUs online"]
        if len(allowed) < len(online):
            why.append(f"this process's cpuset allows {len(allowed)} ({format_cpulist(allowed)})")
        if c.quota is not None and c.quota < len(allowed):
            why.append(f"the cgroup's CPU quota grants {c.quota:g} CPUs' time")
        out.append(Finding(FAIL, f"{per_gpu:.1f} vCPUs per GPU, {floor:g} needed",
                           f"{c.usable():g} usable vCPUs for {n} {'visible ' if facts.cuda_visible_devices else ''}GPUs ({'; '.join(why)}): NCCL runs a busy proxy thread per rank and "
                           "each rank needs its own host loop and data loader, so starved ranks stall the GPUs",
                           "give the job more CPUs (container cpuset/CPU limit), or use a host with more cores per GPU"))
    for node, cpus in c.nodes.items():
        gpus = [i for i in range(n) if gpu_numa(facts, i) == int(node)]
        if gpus and not (set(parse_cpulist(cpus)) & allowed):
            out.append(Finding(WARN, f"no allowed CPU on NUMA node {node}",
                               f"GPU {format_cpulist(gpus)} sit on NUMA node {node}, but this process's cpuset has none of its CPUs ({cpus}): "
                               "their ranks must run across the socket interconnect",
                               "widen the container's cpuset to include CPUs of every GPU's NUMA node"))
    return out


def judge_agreement(facts: TopologyFacts) -> list[Finding]:
    """Where nvidia-smi and the kernel disagree, the pinning advice may be wrong."""
    m = facts.matrix
    if m is None or not facts.gpus:
        return []
    out = []
    if len(m.gpus) != len(facts.gpus):
        # GPU n of the matrix is NVML's GPU n only when both list the same GPUs.
        return [Finding(FAIL, "nvidia-smi and NVML count different GPUs",
                        f"`nvidia-smi topo -m` shows {len(m.gpus)} GPUs, NVML {len(facts.gpus)}: the layout cannot be matched to the GPUs",
                        "run `nvidia-smi -L` and `preflight detect`; a GPU may have dropped off between the two reads")]
    for g in facts.gpus:
        if g.index >= len(m.gpus):
            continue
        t = m.gpus[g.index]
        said = []
        if g.numa_node is not None and t.numa_nodes is not None and t.numa_nodes != [g.numa_node]:
            said.append(f"NUMA node: nvidia-smi {t.numa_affinity}, sysfs {g.numa_node}")
        if g.local_cpus and t.cpus is not None and set(parse_cpulist(g.local_cpus)) != set(t.cpus):
            said.append(f"CPUs: nvidia-smi {t.cpu_affinity}, sysfs {g.local_cpus}")
        if said:
            out.append(Finding(WARN, f"nvidia-smi and sysfs disagree about GPU {g.index}", f"GPU {g.index} ({g.pci}): {'; '.join(said)}",
                               "the advice follows sysfs (the kernel's view); update the driver, and check the BIOS NUMA settings"))
    return out


def judge_pcie(facts: TopologyFacts) -> list[Finding]:
    """Width from sysfs (links do not narrow to save power; speed does, so it is not judged)."""
    out = []
    for what, link, status in [(f"GPU {g.index} ({g.pci})", g.link, FAIL) for g in facts.gpus] + [(f"NIC {n.name} ({n.pci})", n.link, WARN) for n in facts.nics]:
        if link and link.width and link.max_width and link.width < link.max_width:
            out.append(Finding(status, f"{what.split(' (')[0]} PCIe link x{link.width} of x{link.max_width}",
                               f"{what}'s PCIe link trained at x{link.width} of x{link.max_width} (sysfs current_link_width): it moves at most "
                               f"{link.width / link.max_width:.0%} of its bandwidth", "reseat the card or its riser; check the slot with `lspci -vv`"))
    return out


def judge(facts: TopologyFacts, expect: TopologyExpect, vcpu_floor: float | None,
          shape: NodeShape | None = None, multi_node: bool = False) -> dict[str, list[Finding]]:
    """Findings by part, so a report says which part failed. ``shape`` is the live
    node's (None for a saved capture, judged by the profile's word alone)."""
    matrix = []
    if facts.matrix is None:
        matrix.append(Finding(FAIL, "GPU topology unreadable", f"no GPU link matrix: {facts.matrix_error}",
                              "run `nvidia-smi topo -m` by hand; reinstall the driver's userspace if nvidia-smi is missing"))
    return {
        "matrix": matrix,
        "nvlink": judge_links(facts, expect, shape),
        "numa": judge_numa(facts, expect),
        "nics": judge_nics(facts, expect, shape, multi_node),
        "cpus": judge_cpus(facts, vcpu_floor),
        "pcie": judge_pcie(facts),
        "agreement": judge_agreement(facts),
    }


# ---- advice ----------------------------------------------------------------------


class RankAdvice(BaseModel):
    local_rank: int
    gpu: int
    numa_node: int | None = None
    cpus: str | None = None  # the CPUs of that node this process may use
    nic: str | None = None  # the nearest NIC(s): what NCCL will pick for this GPU
    nic_link: str | None = None
    numactl: str | None = None


class Advice(BaseModel):
    bind: bool  # the GPUs span NUMA nodes, so pinning ranks matters
    summary: str
    ranks: list[RankAdvice] = []
    launch: list[str] = []  # whole commands, for train.py on this node


def _rank_gpus(facts: TopologyFacts, n: int) -> list[int]:
    """GPU index of each local rank: torch's cuda:r is the r-th visible GPU.

    Unset, every GPU in PCI order: what CUDA_DEVICE_ORDER=PCI_BUS_ID gives,
    and what the default FASTEST_FIRST gives on a node of identical GPUs."""
    visible = facts.cuda_visible_devices
    if visible is None:
        return list(range(n))
    out = []
    for item in (v.strip() for v in visible.split(",")):
        if re.fullmatch(r"[0-9]+", item) and int(item) < n:
            out.append(int(item))
            continue
        match = [g.index for g in facts.gpus if item.startswith("GPU-") and g.uuid.startswith(item)]
        if len(match) != 1:
            break  # CUDA stops at the first entry it cannot resolve (-1, a MIG or unknown UUID), and so do we
        out.append(match[0])
    return out


def _rank(facts: TopologyFacts, r: int, gpu: int, allowed: set[int] | None) -> RankAdvice:
    m = facts.matrix
    node = gpu_numa(facts, gpu)
    cpus = None
    if node is not None and facts.cpus and str(node) in facts.cpus.nodes:
        cpus = set(parse_cpulist(facts.cpus.nodes[str(node)]))
    elif m and gpu < len(m.gpus) and m.gpus[gpu].cpus:
        cpus = set(m.gpus[gpu].cpus)
    if cpus is not None and allowed is not None:
        cpus &= allowed
    near = m.nearest_nics.get(str(gpu), []) if m and gpu < len(m.gpus) else []
    return RankAdvice(
        local_rank=r, gpu=gpu, numa_node=node, cpus=format_cpulist(cpus) if cpus else None,
        nic=",".join(near) or None, nic_link=m.gpus[gpu].nics[near[0]] if near and m else None,
        numactl=f"numactl --cpunodebind={node} --membind={node}" if node is not None else None,
    )


def advise(facts: TopologyFacts) -> Advice:
    n = gpu_count(facts)
    if not n:
        return Advice(bind=False, summary="no GPU: nothing to pin")
    allowed = set(parse_cpulist(facts.cpus.allowed)) if facts.cpus else None
    ranks = [_rank(facts, r, gpu, allowed) for r, gpu in enumerate(_rank_gpus(facts, n))]
    if not ranks:
        return Advice(bind=False, summary=f"CUDA_VISIBLE_DEVICES={facts.cuda_visible_devices!r} leaves the job no GPU of this machine: nothing to pin")
    nodes = sorted({r.numa_node for r in ranks if r.numa_node is not None})
    unknown = [r.gpu for r in ranks if _numa_unknown(facts, r.gpu)]
    several = (facts.cpus is not None and len(facts.cpus.nodes) > 1) or _socket_groups(facts) > 1
    if unknown and several:
        return Advice(bind=True, summary=f"the NUMA node of GPU {format_cpulist(unknown)} is unknown on a machine with several: "
                      "bind each rank by hand to the CPU list below (`taskset -c CPUS`)", ranks=ranks)
    if len(nodes) < 2:
        if not nodes:
            return Advice(bind=False, summary="every GPU is affine to the same NUMA nodes: no per-rank binding needed", ranks=ranks)
        machine_nodes = len(facts.cpus.nodes) if facts.cpus else 1
        launch = [f"numactl --cpunodebind={nodes[0]} --membind={nodes[0]} torchrun --nproc-per-node={len(ranks)} train.py"] if machine_nodes > 1 else []
        summary = f"every GPU is on NUMA node {nodes[0]}: no per-rank binding needed"
        return Advice(bind=False, summary=summary + (_caveats(facts, ranks) if launch else ""), ranks=ranks, launch=launch)
    split = ", ".join(f"{node} (GPU {format_cpulist([r.gpu for r in ranks if r.numa_node == node])})" for node in nodes)
    launch = []
    if facts.torch_numa_binding is not False:  # None: a capture from elsewhere, whose torch is unknown
        launch.append(f"torchrun --numa-binding=node --nproc-per-node={len(ranks)} train.py")
    if all(r.numa_node is not None for r in ranks):
        order = " ".join(str(r.numa_node) for r in ranks)
        launch.append(f"torchrun --nproc-per-node={len(ranks)} --no-python sh -c 'n=$(echo {order} | cut -d\" \" -f$((LOCAL_RANK + 1))); "
                      "exec numactl --cpunodebind=$n --membind=$n python train.py'")
    how = {True: "torchrun's --numa-binding=node, or numactl per rank",
           False: "numactl per rank (this torch's torchrun has no --numa-binding)",
           None: "torchrun's --numa-binding=node where the installed torchrun has it, else numactl per rank"}[facts.torch_numa_binding]
    summary = f"GPUs on NUMA nodes {split}: bind each rank to its GPU's node with {how}"
    return Advice(bind=True, summary=summary + _caveats(facts, ranks), ranks=ranks, launch=launch)


def _caveats(facts: TopologyFacts, ranks: list[RankAdvice]) -> str:
    """What would make the advised binding fail on this machine."""
    out = ""
    if facts.live and (starved := [r for r in ranks if r.numa_node is not None and r.cpus is None]):
        out += (f"; but this process's cpuset has no CPU on NUMA node {format_cpulist({r.numa_node for r in starved})} "  # type: ignore[misc]
                f"(GPU {format_cpulist([r.gpu for r in starved])}), so binding there is refused until the cpuset is widened")
    if facts.numactl is False:
        out += "; numactl is not installed here (apt install numactl, or dnf install numactl)"
    return out


# ---- the check ---------------------------------------------------------------------

# With no profile (`preflight topology --from` a capture): only what needs no SKU.
GENERIC = TopologyExpect(numa_warn_above=1, numa_source="any SKU: GPUs on one NUMA node need no per-rank pinning")


def measurements(facts: TopologyFacts, vcpu_floor: float | None, expect: TopologyExpect | None = None, shape: NodeShape | None = None) -> list[Measurement]:
    out = []
    n = gpu_count(facts)
    if facts.cpus is not None:
        out.append(Measurement(name="usable", unit="cpus", value=facts.cpus.usable()))
        if n:
            out.append(Measurement(name="vcpus_per_gpu", unit="ratio", value=round(facts.cpus.usable() / n, 3), floor=vcpu_floor))
    if span := numa_span(facts):
        out.append(Measurement(name="gpu_numa", unit="nodes", value=span, ceiling=expect.numa_fail_above if expect else None))
    m = facts.matrix
    for g in facts.gpus:
        if m and g.index < len(m.gpus) and len(m.gpus) > 1:
            width = min(_nv(m.link(g.index, j)) for j in range(len(m.gpus)) if j != g.index)
            # NVSwitch boards join every pair at the same width; a bridged pair says nothing of the others.
            floor = expect.nvlink_width if expect and link_mode(expect, shape) == "all" else None
            out.append(Measurement(name="gpu_nvlink_peer_min", unit="links", value=width, labels={"gpu": str(g.index), "UUID": g.uuid}, floor=floor))
    return out


class Topology(Check):
    name = "topology"
    description = "GPU/NIC/CPU layout: NVLink between GPU pairs, NUMA span, a NIC beside each GPU, vCPUs per GPU; per-rank pinning advice"
    timeout_seconds = 30.0
    order = 20
    floor_units = {"vcpus_per_gpu": ("ratio", "min")}

    def applies(self, ctx: Context) -> str | None:
        if not ctx.profile.has_gpus or ctx.profile.topology is None:
            return f"profile {ctx.profile.name} has no GPUs: there is no GPU layout to judge"
        return None

    def run(self, ctx: Context) -> Result:
        assert ctx.profile.topology is not None
        try:
            facts = gather(ctx.host, ctx.settings, ctx.deadline)
        except nvml.NvmlUnavailable as e:
            return self.result(FAIL, e.cause, cause=e.cause, remedy=e.remedy)
        floor = ctx.profile.floors["vcpus_per_gpu"].value if "vcpus_per_gpu" in ctx.profile.floors else None
        multi_node = ctx.settings.node_multi_node or ctx.settings.nnodes > 1
        parts = judge(facts, ctx.profile.topology, floor, ctx.shape, multi_node)
        if ctx.settings.nvml_fake is not None:  # fail closed, as the cuda check does
            parts["source"] = [nvml.fake_finding(str(ctx.settings.nvml_fake))]
        advice = advise(facts)
        details = facts.model_dump(mode="json")
        details["parts"] = {name: worst(found) for name, found in parts.items()}
        details["advice"] = advice.model_dump(mode="json")
        findings = [f for found in parts.values() for f in found]
        ok = f"{ctx.shape.describe() if ctx.shape else f'{gpu_count(facts)} GPUs'}; {advice.summary}"
        if facts.cpus:
            ok += f"; {facts.cpus.usable() / max(1, gpu_count(facts)):.1f} vCPUs per GPU"
        return self.conclude(findings, ok, measurements=measurements(facts, floor, ctx.profile.topology, ctx.shape), details=details)

    # For `preflight topology`: the same facts, judges and advice, outside a run.

    def explain(self, facts: TopologyFacts, profile: ResolvedProfile | None, live: bool, fake: str | None = None,
                shape: NodeShape | None = None) -> tuple[str, dict, bool]:
        """(text for a person, JSON for a machine, whether a finding failed).
        Without a profile only what needs no SKU is judged; ``fake`` names the
        --nvml-fake file, which, as in a run, fails closed; ``shape`` is this
        node's (None for a saved capture)."""
        floor = profile.floors["vcpus_per_gpu"].value if profile and "vcpus_per_gpu" in profile.floors else None
        parts = judge(facts, (profile.topology if profile else None) or GENERIC, floor, shape)
        if fake is not None:
            parts["source"] = [nvml.fake_finding(fake)]
        advice = advise(facts)
        data = facts.matrix.model_dump(mode="json") if facts.matrix else {}
        if live:
            data["machine"] = facts.model_dump(mode="json", include={"gpus", "nics", "cpus", "cuda_visible_devices", "torch_numa_binding"})
        data["profile"] = profile.name if profile else None
        data["shape"] = shape.model_dump(mode="json") if shape else None
        data["findings"] = [{"part": part, "status": f.status.value, "summary": f.summary, "cause": f.cause, "remedy": f.remedy}
                            for part, found in parts.items() for f in found]
        data["advice"] = advice.model_dump(mode="json")
        judged = (f"profile {profile.name}" + ("" if profile.topology else " (no topology expectations: only what needs no SKU is judged)")
                  if profile else "no profile (only what needs no SKU is judged)")
        text = render(facts, parts, advice).replace("\nfindings", f"\nfindings against {judged}", 1)
        if shape is not None:
            text = f"node: {shape.describe()}; GPUs from {shape.gpus_from}; links from {shape.fabric_from}\n" + text
        return text, data, any(f.status == FAIL for found in parts.values() for f in found)

    def from_text(self, text: str, source: str) -> TopologyFacts:
        """A saved capture from another machine: the matrix is all there is. Raises TopoParseError."""
        return TopologyFacts(matrix=topo.parse(text), matrix_source=source)

    def from_host(self, host: Host, settings: Settings) -> TopologyFacts:
        """This machine, live. Raises NvmlUnavailable."""
        return gather(host, settings, time.monotonic() + self.timeout_seconds)


# ---- text for `preflight topology` -------------------------------------------------


def _link_summary(m: Topo) -> list[str]:
    by_type: dict[str, list[str]] = {}
    for pair, link in m.links.items():
        by_type.setdefault(link, []).append(pair)
    total = len(m.links)
    every = "the one GPU pair" if total == 1 else f"all {total} GPU pairs"
    return [f"{link}: {every if len(pairs) == total else _names(pairs, 12)}"
            for link, pairs in sorted(by_type.items(), key=lambda kv: (-_nv(kv[0]), kv[0]))]


def render(facts: TopologyFacts, parts: dict[str, list[Finding]], advice: Advice) -> str:
    m = facts.matrix
    lines = []
    if m is not None:
        lines.append(f"{len(m.gpus)} GPU(s), {len(m.nics)} NIC(s) from {facts.matrix_source}")
        lines.append(f"  {'GPU':<5} {'NUMA':<5} {'CPUs':<24} {'nearest NIC':<28} NVLink to peers")
        for g in m.gpus:
            node = gpu_numa(facts, g.index)
            near = m.nearest_nics.get(str(g.index), [])
            nic = f"{','.join(near)} ({g.nics[near[0]]})" if near else "-"
            peers = sorted({m.link(g.index, j) for j in range(len(m.gpus)) if j != g.index}, key=lambda t: -_nv(t))
            lines.append(f"  GPU{g.index:<2} {node if node is not None else '?':<5} {g.cpu_affinity or '?':<24} {nic:<28} {'/'.join(peers) or '-'}")
        lines.append("")
        groups: dict[str, list[int]] = {}
        for g in m.gpus:
            node = gpu_numa(facts, g.index)
            key = f"NUMA node {node}" if node is not None else f"CPUs {g.cpu_affinity}" if g.cpu_affinity else "NUMA unknown"
            groups.setdefault(key, []).append(g.index)
        for key, gpus in groups.items():
            cpus = facts.cpus.nodes.get(key.removeprefix("NUMA node "), "") if facts.cpus and key.startswith("NUMA node") else ""
            cpus = cpus or (m.gpus[gpus[0]].cpu_affinity or "" if key.startswith("NUMA node") else "")
            lines.append(f"[{key}{f'  CPUs {cpus}' if cpus else ''}]")
            cells = []
            for i in gpus:
                near = [n for n in m.nearest_nics.get(str(i), []) if m.gpus[i].nics[n] in NEAR]
                cells.append(f"GPU{i}" + (f" -- {'/'.join(near)}" if near else ""))
            lines.append("  " + "   ".join(cells))
        used = {n for g in m.gpus for n, t in g.nics.items() if t in NEAR}
        others = [n for n in m.nics if n not in used]
        if others:
            lines.append(f"  NICs beside no GPU: {', '.join(others)}")
        lines += [f"  {s}" for s in _link_summary(m)] if m.links else []
        lines += [f"  note: {n}" for n in m.notes]
    else:
        lines.append(f"no GPU link matrix: {facts.matrix_error}")
    findings = [f for found in parts.values() for f in found]
    lines.append("")
    lines.append("findings:" if findings else "findings: none")
    for f in sorted(findings, key=lambda f: f.status != FAIL):
        lines += [f"  {f.status.value:<4}  {f.summary}", f"        cause: {f.cause}", f"        fix:   {f.remedy}"]
    lines += ["", f"advice: {advice.summary}"]
    for r in advice.ranks:
        nic = f"  NIC {r.nic} ({r.nic_link})" if r.nic else ""
        lines.append(f"  local rank {r.local_rank} -> GPU{r.gpu}  NUMA {r.numa_node if r.numa_node is not None else '?'}  CPUs {r.cpus or ('none allowed' if facts.live else '?')}{nic}")
    lines += [f"  $ {cmd}" for cmd in advice.launch]
    if advice.launch:
        lines.append("  (put the job's own command where these say `train.py` / `python train.py`)")
    return "\n".join(lines) + "\n"


def linked_pairs(result: Result | None, kinds: tuple[str, ...]) -> set[frozenset[int]] | None:
    """Pairs of GPUs (nvidia-smi indices) whose `nvidia-smi topo -m` link in this
    check's result starts with one of ``kinds`` ("NV" for NVLink, "PIX"/"PXB"
    for one PCIe switch); None where the check did not read a matrix."""
    matrix = result.details.get("matrix") if result else None
    if not matrix or not matrix.get("links"):
        return None
    pairs = set()
    for key, kind in matrix["links"].items():
        a, _, b = key.partition("-")
        if str(kind).startswith(kinds) and a.isdigit() and b.isdigit():
            pairs.add(frozenset((int(a), int(b))))
    return pairs
