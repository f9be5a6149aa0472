"""The NCCL (and gloo) settings of a node's environment, judged: the nccl check's
environment part, shared with `explain` of nccl-tests output.

`judge_env` holds the debugging switches set (nccl_env.switches_on) to what they
cost this node: NCCL_P2P_LEVEL by the GPU pairs it cuts (`gpu_pairs`, from the
topology check's matrix or the node's shape; `ranks_pairs`, those the ranks
used), NCCL_IB_DISABLE only on a node with RDMA devices serving jobs across
nodes; `env_without_cost` says why each other switch set costs nothing.
`judge_ifnames` holds NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to the node's
interfaces, before anything is launched.
"""

from __future__ import annotations

from preflight.base.findings import Finding, Status
from preflight.base.host import tool_time
from preflight.gpuwork import ranks
from preflight.pipeline.check import Context, Result
from preflight.pipeline.shape import NodeShape
from preflight.readers.machine import layout, topo_derived
from preflight.readers.machine.topo_derived import LINKS
from preflight.readers.nvidia import nvml
from preflight.readers.nccl import nccl_env

FAIL, WARN = Status.FAIL, Status.WARN


# The GPU pairs a node needs P2P between: NVLink, and PCIe under its switches (PIX, PXB). NCCL's own
# default level reaches them on every host (PXB on Intel and ARM, SYS on AMD), and the transports
# judge holds the node to them; paths through the CPU (PHB, SYS) NCCL's default itself cuts on Intel.
P2P_NEEDED = {"NVL": "joined by NVLink", "PIX": "under one PCIe switch (PIX)", "PXB": "across PCIe switches (PXB)"}
# `nvidia-smi topo -m`'s words -> NCCL's path type: NODE (across host bridges within one NUMA node) is NCCL's PHB.
SMI_PATHS = {"PIX": "PIX", "PXB": "PXB", "PHB": "PHB", "NODE": "PHB", "SYS": "SYS"}
ORDER = "NCCL's order: LOC < NVL < PIX < PXB < PHB < SYS"


# Hosts whose CPU NCCL before 2.23 kept P2P off (PXB) on: ARM, and x86 by vendor_id (Intel, Zhaoxin's two).
PXB_BEFORE_2_23 = ("ARM", "GenuineIntel", "CentaurHauls", "Shanghai")


def reaches_cpu(vendor: str | None, gpus: int, version: str | None) -> bool:
    """Whether NCCL's own default P2P level reaches pairs through the CPU (PHB, SYS), so that a switch
    cutting them costs this node P2P. NVIDIA/nccl src/graph/paths.cc ncclTopoCheckP2p: from 2.23 the
    default is PXB, but SYS on an AMD x86 host with two GPUs or fewer; before 2.23 it was SYS, but PXB
    on ARM, Intel and Zhaoxin hosts (any other vendor, Hygon's or POWER, kept SYS). ``version``
    unknown: the newer rule; ``vendor`` unknown: no (cpu_vendor.py)."""
    older = version is not None and tuple(int(x) for x in version.split("+")[0].split(".")[:2]) < (2, 23)
    if older:
        return vendor is not None and vendor not in PXB_BEFORE_2_23
    return vendor == "AuthenticAMD" and gpus <= 2


def gpu_pairs(topology: Result | None, shape: NodeShape | None = None) -> dict[frozenset[int], str] | None:
    """NCCL's path type (nccl_env.P2P_LEVELS) between each GPU pair, from the topology check's matrix;
    on an NVSwitch board every pair is NVLink whether or not a matrix was read. None: not known."""
    matrix = topology.details.get("matrix") if topology else None
    # A matrix built without NVML's word on the links holds no NVLink, known or not: no pair's path is known.
    if matrix and LINKS not in (topology.details.get("unanswered") or {}):  # type: ignore[union-attr]
        out = {}
        for key, kind in (matrix.get("links") or {}).items():
            a, _, b = key.partition("-")
            path = "NVL" if str(kind).startswith("NV") else SMI_PATHS.get(str(kind))
            if a.isdigit() and b.isdigit() and path:
                out[frozenset((int(a), int(b)))] = path
        return out
    if shape is not None and shape.gpus <= 1:
        return {}
    if shape is not None and shape.fabric == "nvswitch":
        return {frozenset((a, b)): "NVL" for a in range(shape.gpus) for b in range(a + 1, shape.gpus)}
    return None


def layout_of(ctx: Context) -> Result | None:
    """The topology check's result where it ran; else (not run, or skipped), on a node of two GPUs or more, the
    matrix read now (`nvidia-smi topo -m`, or NVML and sysfs where that cannot be read) as that check's details
    hold it, never reported. Without it (`--only nccl`, a profile with no [topology]) every pair NCCL joins
    through host memory would read as a fallback, cross-socket pairs too, which NCCL never joins by P2P on
    its own. None: no matrix from either (the pairs stay unknown, judged as before)."""
    topology = ctx.results.get("topology")
    if topology is not None and topology.status != Status.SKIP:
        return topology  # its reading, matrix or none: read again it would take as long and say the same
    if not ctx.profile.has_gpus or (ctx.shape is not None and ctx.shape.gpus <= 1):
        return None
    try:
        inventory = ctx.inventory(timeout=min(10.0, max(1.0, ranks.time_left(ctx.deadline))))
    except nvml.NvmlUnavailable:
        return None
    if (smi := tool_time(ctx.deadline, layout.NVIDIA_SMI_TIMEOUT)) is None:
        matrix, error = None, "`nvidia-smi topo -m` not run: too little of the check's time left"
    else:
        matrix, error = layout.run_matrix(ctx.host, smi)
    try:
        facts = topo_derived.complete(ctx.host, layout.TopologyFacts(matrix=matrix, matrix_error=error, gpus=layout.gpu_places(ctx.host, inventory),
                                                                     cpus=layout.machine_cpus(ctx.host)))
    except OSError:
        return None  # sysfs unreadable: the pairs stay unknown rather than the check an ERROR
    if facts.matrix is None:
        return None
    details = {"matrix": facts.matrix.model_dump(mode="json"), "unanswered": facts.unanswered}
    return Result(check="topology", status=Status.SKIP, summary="the GPUs' matrix, read by the nccl check", details=details)


def _pair_list(pairs: list[tuple[frozenset[int], str]]) -> str:
    shown = [f"GPU {min(p)} and GPU {max(p)} ({kind})" for p, kind in pairs[:4]]
    return ", ".join(shown) + (f" and {len(pairs) - 4} more" if len(pairs) > 4 else "")


def _env(env: dict[str, list[tuple[str, str]]], pairs: dict[frozenset[int], str] | None, rdma: list[str] | None,
         spans_nodes: bool, cpu_too: bool = False) -> tuple[list[Finding], dict[str, str]]:
    """(findings, switch -> why it costs this node nothing) of the debugging switches set. ``cpu_too``:
    NCCL's default P2P level reaches pairs through the CPU here (reaches_cpu)."""
    out, costless = [], {}
    needed = {**P2P_NEEDED, **({"PHB": "through a host bridge (PHB)", "SYS": "across the CPUs (SYS)"} if cpu_too else {})}
    on = nccl_env.switches_on(env)
    for name, value, where, cost in on:
        setting = f"{name}={value} ({where})"
        if name == "NCCL_SHM_DISABLE" and pairs is not None and not _shm_needed(on, pairs):
            # NCCL tries P2P first and takes SHM only for a pair P2P cannot join (transport.cc's order).
            costless[name] = (f"{setting}: NCCL uses shared memory only between GPUs it cannot join by P2P, and "
                              + ("this run has one GPU" if not pairs else "every pair of this node's GPUs is joined by NVLink"))
            continue
        if name == "NCCL_IB_DISABLE" and rdma is not None and not rdma:
            costless[name] = f"{setting}: this node has no RDMA device (/sys/class/infiniband lists none), so there is no InfiniBand/RoCE to turn off"
            continue
        if name == "NCCL_IB_DISABLE" and rdma and not spans_nodes:
            # NCCL moves data within a node by P2P and shared memory; this run's ranks even load no network.
            costless[name] = (f"{setting}: this run is one node, where NCCL moves data by P2P and shared memory, not the network; "
                              f"a job spanning nodes would use TCP sockets instead of {', '.join(rdma)} (the site pins no multi-node use: "
                              "[node] multi_node, and the profile expects no NIC beside each GPU)")
            continue
        if name == "NCCL_IB_DISABLE" and rdma:
            cost = f"turns off InfiniBand/RoCE ({', '.join(rdma)}): traffic between nodes falls back to TCP sockets, an order of magnitude slower"
        # NCCL reads NCCL_P2P_DISABLE=1 as level LOC (ncclGetLevel: disable == 1 sets PATH_LOC): it costs
        # what NCCL_P2P_LEVEL=LOC costs, the pairs NCCL's own default would join by P2P (``needed``).
        if name == "NCCL_P2P_DISABLE" and pairs is not None:
            cut = sorted(((p, kind) for p, kind in pairs.items() if kind in needed), key=lambda t: sorted(t[0]))
            if not cut:
                costless[name] = (f"{setting} turns P2P off, and no pair of this node's GPUs would use it: "
                                  + ("this run has one GPU" if not pairs else "none is " + " or ".join(needed.values())))
                continue
            cost = f"turns P2P off: {len(cut)} GPU pair(s) NCCL would join by P2P go through host memory: {_pair_list(cut)}"
        if name == "NCCL_P2P_LEVEL":
            level = nccl_env.p2p_level(value)
            if pairs is not None:
                cut = sorted(((p, kind) for p, kind in pairs.items() if kind in needed and nccl_env.p2p_cuts(level, kind)),
                             key=lambda t: sorted(t[0]))
                if not cut:
                    which = "pair of this node's GPUs that NCCL would join by P2P" if cpu_too else "NVLink or PCIe-switch pair of this node's GPUs"
                    costless[name] = f"{setting} allows P2P up to {level} ({ORDER}): no {which} is farther"
                    continue
                cost = (f"caps the distance at which NCCL uses P2P at {level} ({ORDER}): {len(cut)} GPU pair(s) this node joins nearer "
                        f"than that lose P2P and go through host memory: {_pair_list(cut)}")
            else:
                kinds = [words for kind, words in needed.items() if nccl_env.p2p_cuts(level, kind)]
                if not kinds:
                    costless[name] = (f"{setting} allows P2P up to {level} ({ORDER}), past NVLink and PCIe switches: it cuts only paths "
                                      "through the CPU, where NCCL's own default stops on this host (reaches_cpu)")
                    continue
                cost = (f"caps the distance at which NCCL uses P2P at {level} ({ORDER}): GPU pairs {' or '.join(kinds)} go through "
                        "host memory (which pairs this node has was not read: the topology check's matrix)")
        out.append(Finding(WARN, f"{name}={value} is set", f"{name}={value} in {where} {cost}", f"unset {name} (a debugging switch) in {where}"))
    return out, costless


def _shm_needed(on: list[tuple[str, str, str, str]], pairs: dict[frozenset[int], str]) -> bool:
    """Whether NCCL may take its SHM transport between a pair of ``pairs``: any pair not joined by
    NVLink (a path through the CPU, GPUs that cannot do P2P by design, and under a PCIe switch
    too, where ACS, an IOMMU or a hypervisor can forbid P2P) or one a P2P switch set cuts."""
    levels = [nccl_env.p2p_level(value) if name == "NCCL_P2P_LEVEL" else "LOC" for name, value, _, _ in on
              if name in ("NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE")]
    return any(kind != "NVL" or any(nccl_env.p2p_cuts(level, kind) for level in levels) for kind in pairs.values())


def judge_env(env: dict[str, list[tuple[str, str]]], pairs: dict[frozenset[int], str] | None = None, rdma: list[str] | None = None,
              spans_nodes: bool = True, cpu_too: bool = False) -> list[Finding]:
    """The debugging switches that cost this node speed. ``pairs``: NCCL's path type between each GPU
    pair the ranks use (gpu_pairs; None: unknown): NCCL_P2P_LEVEL (and NCCL_P2P_DISABLE, level LOC) warns
    where it cuts a pair NCCL's default would join by P2P (P2P_NEEDED, and PHB/SYS where ``cpu_too``:
    reaches_cpu), or, unknown, where its level is nearer than PXB. ``rdma``: the node's RDMA devices
    (None: unknown); ``spans_nodes``: the node serves jobs across nodes. NCCL_IB_DISABLE warns only
    where both hold, or where the devices are unknown."""
    return _env(env, pairs, rdma, spans_nodes, cpu_too)[0]


def env_without_cost(env: dict[str, list[tuple[str, str]]], pairs: dict[frozenset[int], str] | None = None,
                     rdma: list[str] | None = None, spans_nodes: bool = True, cpu_too: bool = False) -> dict[str, str]:
    """The debugging switches set that cost this node nothing, each with why: for the details."""
    return _env(env, pairs, rdma, spans_nodes, cpu_too)[1]


BY_DESIGN = "GNS"  # the kind of a pair that cannot do P2P by the GPUs' design (transports.without_p2p): no NCCL path


def ranks_pairs(f: ranks.RunFacts, pairs: dict[frozenset[int], str] | None, by_design: set[frozenset[int]] | None = None) -> dict[frozenset[int], str] | None:
    """``pairs`` cut to the GPUs the ranks used, where they are known; the pairs that cannot do P2P
    over PCIe by the GPUs' design are BY_DESIGN (a level cuts nothing there, and they need SHM)."""
    if pairs is None:
        return None
    used = {i for o in f.ranks if (i := ranks.gpu_index(o.gpu)) is not None}
    return {p: BY_DESIGN if p in (by_design or set()) else kind for p, kind in pairs.items() if not used or p <= used}


def _ifname_matches(spec: str, names: list[str], exact_only: bool) -> tuple[list[str], list[str]]:
    """(the interfaces a *_SOCKET_IFNAME value selects, the entries that select none).
    NCCL's form: "^" excludes, "=" matches exactly, otherwise prefixes; gloo's: exact names."""
    body = spec.strip()
    exclude = body.startswith("^") and not exact_only
    body = body[1:] if exclude else body
    exact = exact_only or body.startswith("=")
    entries = [e.strip() for e in body.removeprefix("=").split(",") if e.strip()]
    hit = lambda e, n: n == e if exact else n.startswith(e)  # noqa: E731
    if exclude:
        return [n for n in names if not any(hit(e, n) for e in entries)], []
    return [n for n in names if any(hit(e, n) for e in entries)], [e for e in entries if not any(hit(e, n) for n in names)]


def judge_ifnames(env: dict[str, list[tuple[str, str]]], nics: dict[str, list[str] | None] | None) -> list[Finding]:
    """A *_SOCKET_IFNAME that selects no usable interface fails every rank at init, after a wait.
    NCCL uses every interface its list matches and ignores values under two
    characters (ncclFindInterfaces); gloo wants each name it is given to exist."""
    if nics is None:
        return []
    out = []
    known = ", ".join(sorted(nics)) or "none"
    for name, exact_only in (("NCCL_SOCKET_IFNAME", False), ("GLOO_SOCKET_IFNAME", True)):
        value, where = nccl_env.effective(env).get(name, (None, None))
        if value is None or len(value.strip()) < (1 if exact_only else 2):
            continue
        chosen, unmatched = _ifname_matches(value, sorted(nics), exact_only)
        fix = f"set {name} to an interface this node has ({known}), or unset it"
        if not chosen or (exact_only and unmatched):
            missing = ", ".join(unmatched) or value
            cause = f"{name}={value} (in {where}) names no interface on this node ({missing}); it has {known}: every rank would fail to open its sockets"
            out.append(Finding(FAIL, f"{name} names a missing interface", cause, fix))
        elif all(nics[n] == [] for n in chosen):
            cause = f"{name}={value} (in {where}) selects {', '.join(chosen)}, which has no IP address: ranks cannot bind a socket there"
            out.append(Finding(FAIL, f"{name} selects an interface without an address", cause, fix))
        elif unmatched:
            cause = f"{name}={value} (in {where}): {', '.join(unmatched)} match no interface on this node; NCCL uses {', '.join(chosen)}"
            out.append(Finding(WARN, f"{name} names an interface this node lacks", cause, f"drop {', '.join(unmatched)} from {name} if the fleet no longer has it"))
    return out
