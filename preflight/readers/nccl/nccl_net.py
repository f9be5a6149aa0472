"""The network NCCL chose between nodes, and why it fell back from RDMA.

`gather` reads the node: RDMA devices and their ACTIVE ports under
/sys/class/infiniband (IB, RoCE and EFA alike), the GPUDirect RDMA peer-memory
modules, the kernel and NVIDIA module flavour (dma-buf needs the open modules
on Linux >= 5.12), and the NCCL settings that steer the choice.

`judge` is pure. Only channels that cross nodes count, and the profile's
`nccl.network` says what they must use: "ib_gdrdma" (an RDMA network with
GPUDirect RDMA), "ib" (an RDMA network) or "any" (report only). An RDMA
network is NCCL's IB transport or a vendor plugin (IBext, "NCCL RDMA Plugin",
AWS Libfabric): anything but its TCP Socket transport. The causes are in
NCCL's own lines, which NcclLog does not keep, so the caller passes the text.

NCCL's wording (NVIDIA/nccl sources): "NET/IB : No device found." (net_ib
init.cc); "GPU Direct RDMA %s for HCA %d '%s'" (graph/topo.cc; older releases
"... Disabled for HCA %d '%s' (no module)"); "GPU Direct RDMA Disabled for GPU
%lx / HCA %d (distance %d > %d)" (graph/paths.cc); plugins (plugin/net.cc,
plugin_open.cc): "NET/Plugin: Could not find: %s", "NET/Plugin: %s: <dlerror>",
"Failed to find ncclNetPlugin symbol (>= v5)", "External network plugin %s is
unsupported", "Failed to initialize NET plugin %s"; older "NET/Plugin : Plugin
load (%s) returned %d : %s" and "No plugin found (libnccl-net.so)". The
HCA lines are in the NET debug subsystem: without NCCL_DEBUG_SUBSYS=...,NET
they are missing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import BaseModel

from preflight.base.findings import Finding, Status
from preflight.base.host import Host, read_stripped
from preflight.readers.nccl.nccl_env import nccl_int
from preflight.readers.nccl.nccl_log import Channel, NcclLog

ENV_VARS = ("NCCL_IB_DISABLE", "NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_NET_GDR_LEVEL",
            "NCCL_NET_GDR_READ")
# What NCCL tests (src/transport/net_ib/gdr.cc): nv_peer_mem registers memory_peers/nv_mem*; NCCL >= 2.23
# also accepts /sys/module/nvidia_peermem, which NCCL <= 2.22.3 misses (NVIDIA/nccl#1676).
PEERMEM = ("nvidia_peermem", "nv_peer_mem")
MEMORY_PEERS = ("/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/kernel/mm/memory_peers/nv_mem_nc/version")
DMABUF_DOC = "https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-rdma.html"


class NetFacts(BaseModel):
    ib_devices: list[str] = []  # names under /sys/class/infiniband
    active_ports: dict[str, list[int]] = {}  # device -> ports whose state is ACTIVE
    peermem: list[str] = []  # peer-memory modules loaded (/sys/module/<name>)
    memory_peers: bool = False  # nv_mem registered with the RDMA core
    kernel: str | None = None
    nvidia_open: bool | None = None  # the open GPU kernel modules; None: no NVIDIA driver seen
    env: dict[str, str] = {}

    def dmabuf_capable(self) -> bool | None:
        return dmabuf_possible(self.kernel, self.nvidia_open)


def gather(host: Host, env: Mapping[str, str]) -> NetFacts:
    root = host.path("/sys/class/infiniband")
    devices = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    active: dict[str, list[int]] = {}
    for dev in devices:
        ports = root / dev / "ports"
        for port in sorted(ports.iterdir(), key=lambda p: p.name) if ports.is_dir() else []:
            if port.name.isdigit() and (read_stripped(port / "state") or "").split(":")[-1].strip() == "ACTIVE":
                active.setdefault(dev, []).append(int(port.name))
    version = read_stripped(host.path("/proc/driver/nvidia/version"))
    return NetFacts(
        ib_devices=devices, active_ports=active,
        peermem=[m for m in PEERMEM if host.path(f"/sys/module/{m}").is_dir()],
        memory_peers=any(host.path(p).exists() for p in MEMORY_PEERS),
        kernel=read_stripped(host.path("/proc/sys/kernel/osrelease")),
        nvidia_open=None if version is None else "Open Kernel Module" in version,
        env={k: env[k] for k in ENV_VARS if k in env})


# --- what NCCL said about the network ------------------------------------------------

_SAID = {
    "no_device": re.compile(r"NET/IB\w* ?: ?No device found"),
    "no_verbs": re.compile(r"Failed to open libibverbs"),
    "plugin_env": re.compile(r"NET/Plugin ?: ?Plugin name set by env to (\S+)"),
    "plugin_ok": re.compile(r"Loaded net plugin .+ \(v\d+\)|Successfully loaded external (?:network )?plugin|P2P plugin (?:v\d+ )?IBext"),
    "plugin_missing": re.compile(r"NET/Plugin ?: ?(?:No plugin found|Could not find:)|cannot open shared object file: No such file"),
    "plugin_broken": re.compile(
        r"NET/Plugin ?: ?(?:Plugin load (?:\(\S+\) )?returned \d+ : (?!.*No such file).*|\S+\.so\S*: .*|Failed to find ncclNetPlugin symbol.*)"
        r"|External network plugin \S+ is unsupported|Failed to initialize NET plugin (?!IB$|Socket$).+"
        r"|NCCL WARN .*(?:NET/OFI|[Pp]lugin).*[Ff]ail"),
    "ib_hca": re.compile(r"NCCL_IB_HCA set (?:by environment )?to (\S+)"),
    "gdr_off": re.compile(r"GPU Direct RDMA Disabled for HCA \d+ '[^']+'.*"),
    "gdr_on": re.compile(r"GPU Direct RDMA (?:Enabled|\(\S+\) enabled) for HCA"),
    "gdr_far": re.compile(r"GPU Direct RDMA Disabled for GPU \S+ / HCA \S+ \(distance \d+ >=? \d+\)"),
}
_NEEDLES = ("NET/", "Plugin", "plugin", "libibverbs", "GPU Direct RDMA", "NCCL_IB_HCA", "Using network")


def _said(text: str) -> dict[str, list[str]]:
    """Signature -> the distinct messages that showed it (host:pid prefixes cut), plus "lines": every network line."""
    out: dict[str, list[str]] = {k: [] for k in [*_SAID, "lines"]}
    for line in text.splitlines():
        if not any(n in line for n in _NEEDLES):
            continue
        at = max(line.find("NCCL INFO "), line.find("NCCL WARN "))
        msg = (line[at + 10:] if at >= 0 else line).strip()[:300]
        for key, rx in _SAID.items():
            if m := rx.search(line):
                value = m.group(1) if key in ("plugin_env", "ib_hca") else msg
                if value not in out[key]:
                    out[key].append(value)
        if msg not in out["lines"]:
            out["lines"].append(msg)
    return out


# --- the judge -----------------------------------------------------------------------


def network(net: str | None) -> str:
    """NCCL's net name -> "IB" (IB verbs, itself or through the HPC-X plugin), "Socket", or the plugin's name."""
    if net and (net == "IB" or net.startswith("IBext") or net.startswith("NCCL RDMA Plugin")):
        return "IB"
    return net or "unknown"


def _cross(log: NcclLog, local: set[int] | None) -> dict[tuple[int, int], list[Channel]]:
    out: dict[tuple[int, int], list[Channel]] = {}
    for c in log.channels:
        if c.kind == "NET" and not (local is not None and c.src_rank in local and c.dst_rank in local):
            out.setdefault((c.src_rank, c.dst_rank), []).append(c)
    return out


def _summary(table: dict[str, dict]) -> str:
    counts: dict[str, int] = {}
    for p in table.values():
        label = f"NET/{p['network']}" + ("" if p["network"] == "Socket" else f" {'with' if p['gdrdma'] else 'without'} GDRDMA")
        counts[label] = counts.get(label, 0) + 1
    return "; ".join(f"{label} to {n} peer{'s' if n > 1 else ''}" for label, n in counts.items())


def _who(name: str, log: NcclLog, facts: NetFacts) -> tuple[str | None, str]:
    """The value of an NCCL setting and who set it: the job's environment, else what NCCL reported."""
    if name in facts.env:
        return facts.env[name], f"{name}={facts.env[name]} in the job's environment"
    if name in log.env:
        return log.env[name], f"NCCL reports {name}={log.env[name]} (from the ranks' environment, NCCL_CONF_FILE or /etc/nccl.conf)"
    return None, ""


def _shown(lines: list[str]) -> str:
    return "; ".join(f'"{s}"' for s in lines[:3]) + (f" (+{len(lines) - 3} more)" if len(lines) > 3 else "")


def _socket_causes(log: NcclLog, facts: NetFacts, said: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    out = []
    value, who = _who("NCCL_IB_DISABLE", log, facts)
    if value is not None and value.strip() not in ("", "0"):
        out.append(("ib_disabled", f"InfiniBand is switched off: {who}",
                    "unset NCCL_IB_DISABLE (job environment, launcher, ~/.nccl.conf, /etc/nccl.conf) or set it to 0"))
    value, who = _who("NCCL_NET", log, facts)
    if value is not None and value.strip().lower() == "socket":
        out.append(("net_forced", f"NCCL was told to use sockets: {who}", "unset NCCL_NET, or set it to IB"))
    plugin, _ = _who("NCCL_NET_PLUGIN", log, facts)
    plugin = plugin or next(iter(said["plugin_env"]), None)
    wanted = plugin is not None and plugin.lower() != "none"
    if said["plugin_broken"] or (wanted and said["plugin_missing"] and not said["plugin_ok"]):
        lines = said["plugin_broken"] or said["plugin_missing"]
        out.append(("plugin", f"the network plugin{f' {plugin}' if plugin else ''} failed: {_shown(lines)}",
                    "install the plugin that matches this NCCL in the job's image and point NCCL_NET_PLUGIN (or LD_LIBRARY_PATH) at it; "
                    "read the plugin's own WARN lines (aws-ofi-nccl: `fi_info -p efa` must list the EFA devices inside the container)"))
    if said["no_verbs"]:
        out.append(("no_verbs", f"NCCL could not load the verbs library: {_shown(said['no_verbs'])}",
                    "install rdma-core (libibverbs1, libmlx5-1) in the job's image"))
    devices = ", ".join(facts.ib_devices)
    hca = facts.env.get("NCCL_IB_HCA") or next(iter(said["ib_hca"]), None)
    if said["no_device"] and hca and facts.active_ports:
        out.append(("ib_hca", f"NCCL_IB_HCA={hca} selects none of this node's active RDMA ports ({devices})",
                    "set NCCL_IB_HCA to names `ibv_devinfo -l` lists, or unset it"))
    elif facts.ib_devices and not facts.active_ports:
        out.append(("ports_down", f"no port of {devices} is ACTIVE, and NCCL uses only active ports",
                    "check the links with `ibstat` / `ibv_devinfo` (state PORT_ACTIVE): cables, the subnet manager, the switch port"))
    elif said["no_device"] or not facts.ib_devices:
        where = (f"although the host has {devices}: the job cannot open them (no /dev/infiniband in the container?)"
                 if facts.ib_devices else "and /sys/class/infiniband is empty on this node")
        out.append(("no_device", f"NCCL found no RDMA device ({_shown(said['no_device']) or 'no NET/IB line'}) {where}",
                    "check `ibv_devinfo`; load the drivers (modprobe mlx5_ib ib_uverbs); in a container pass /dev/infiniband "
                    "(--device=/dev/infiniband, or the RDMA device plugin's resource in Kubernetes)"))
    if not out:
        out.append(("unknown", f"NCCL chose sockets for an unknown reason; it said: {_shown(said['lines']) or 'nothing about its network'}",
                    "rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET and read the NET lines; check `ibv_devinfo`"))
    return out


def _gdr_causes(log: NcclLog, facts: NetFacts, said: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    out = []
    level, who = _who("NCCL_NET_GDR_LEVEL", log, facts)
    if said["gdr_far"] or (level is not None and level.strip().upper() in ("LOC", "0")):
        out.append(("gdr_level", f"NCCL judged the NICs too far from the GPUs for GPUDirect RDMA: {_shown(said['gdr_far']) or who}",
                    "pair every GPU with a NIC on its PCIe switch (`preflight topology`); unset NCCL_NET_GDR_LEVEL"))
    major_minor = tuple(int(x) for x in (log.version or "").split("+")[0].split(".")[:2] if x.isdigit())
    loaded = " and ".join(facts.peermem)
    if facts.peermem == ["nvidia_peermem"] and not facts.memory_peers and len(major_minor) == 2 and major_minor < (2, 23):
        out.append(("old_nccl", f"NCCL {log.version} looks only for nv_peer_mem (/sys/kernel/mm/memory_peers), not the "
                    "nvidia_peermem module loaded here (NVIDIA/nccl#1676)", "use NCCL 2.23 or newer"))
    elif not facts.peermem and not facts.memory_peers and not said["gdr_on"]:
        dmabuf = {True: "this node could use dma-buf instead", False: "dma-buf is not possible here",
                  None: "dma-buf needs the open GPU kernel modules on Linux >= 5.12"}[facts.dmabuf_capable()]
        out.append(("peermem", f"no GPUDirect RDMA peer-memory module is loaded (nvidia_peermem or nv_peer_mem), and NCCL "
                    f"did not use dma-buf ({dmabuf}; kernel {facts.kernel or 'unknown'})",
                    "`modprobe nvidia_peermem` and list it in /etc/modules-load.d; or use dma-buf: NVIDIA open "
                    f"kernel modules on Linux >= 5.12 with NCCL_DMABUF_ENABLE left on ({DMABUF_DOC})"))
    elif said["gdr_off"] and not out:
        out.append(("gdr_off", f"NCCL disabled GPUDirect RDMA although {loaded} is loaded: {_shown(said['gdr_off'])}",
                    "check `dmesg | grep -i peermem`: the module must register with the installed RDMA stack "
                    "(rebuild nvidia-peermem after MOFED); NCCL <= 2.22.3 sees only nv_peer_mem (NVIDIA/nccl#1676): use "
                    "NCCL >= 2.23; or use dma-buf"))
    if not out:
        out.append(("unknown", f"NCCL used RDMA without GPUDirect RDMA and printed no reason; it said: {_shown(said['lines']) or 'nothing'}",
                    "rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET to see its GPU Direct RDMA lines"))
    return out


def _finding(summary: str, causes: list[tuple[str, str, str]], pairs: list[str], expect: str) -> Finding:
    shown = ", ".join(pairs[:6]) + (" ..." if len(pairs) > 6 else "")
    cause = "; ".join(c for _, c, _ in causes) + f" (peers: {shown}; profile nccl.network = {expect})"
    return Finding(Status.FAIL, summary, cause, "; ".join(dict.fromkeys(r for _, _, r in causes)))


def judge(log: NcclLog, facts: NetFacts, expect: str, local_ranks: set[int] | None, text: str = "") -> tuple[list[Finding], dict]:
    """Findings and details for the channels between this node and the others.

    ``text`` is the log ``log`` was parsed from: the causes are in lines NcclLog does not keep."""
    cross = _cross(log, local_ranks)
    if not cross:
        return [], {"judged": False, "expect": expect, "peers": {},
                    "summary": "no NCCL channel crosses nodes in the log (one node, or NCCL_DEBUG below INFO): nothing to judge"}
    # NCCL_NET_GDR_READ=0 turns GPUDirect off for sends only (src/graph/paths.cc, ncclTopoCheckGdr: "if
    # (gdrReadParam == 0) return" for reads): a site's choice, whose send lines print no /GDRDMA while the
    # receives still write into the GPU. Such a send is no sign of a node without GPUDirect RDMA.
    read = _who("NCCL_NET_GDR_READ", log, facts)[0]
    read_off = read is not None and read.strip() != "" and nccl_int(read) == 0
    table = {}
    for (a, b), chans in sorted(cross.items()):
        transports = list(dict.fromkeys(c.transport for c in chans))
        gdr = all(c.gdr or (read_off and c.direction == "send") for c in chans)
        table[f"{a}->{b}"] = {"network": network(chans[0].net), "gdrdma": gdr, "transport": ", ".join(transports)}
    details: dict = {"judged": True, "expect": expect, "summary": _summary(table), "peers": table, "causes": []}
    if expect == "any":
        return [], details
    said = _said(text)
    out = []
    sockets = [k for k, p in table.items() if p["network"] == "Socket"]
    if sockets:
        causes = _socket_causes(log, facts, said)
        details["causes"] += [k for k, _, _ in causes]
        out.append(_finding(f"NCCL used TCP sockets between nodes ({len(sockets)} peers), not RDMA", causes, sockets, expect))
    slow = [k for k, p in table.items() if p["network"] != "Socket" and not p["gdrdma"]]
    if expect == "ib_gdrdma" and slow:
        causes = _gdr_causes(log, facts, said)
        details["causes"] += [k for k, _, _ in causes]
        out.append(_finding(f"NCCL used RDMA without GPUDirect RDMA ({len(slow)} peers): traffic is staged through host memory",
                            causes, slow, expect))
    return out, details


def dmabuf_possible(kernel: str | None, nvidia_open: bool | None) -> bool | None:
    """Whether GPUDirect RDMA through dma-buf is possible: NVIDIA's open kernel modules on
    Linux >= 5.12 (where the kernel's dma-buf export for peer devices arrived); None where unknown."""
    m = re.match(r"(\d+)\.(\d+)", kernel or "")
    if m is None or nvidia_open is None:
        return None
    return nvidia_open and (int(m[1]), int(m[2])) >= (5, 12)
