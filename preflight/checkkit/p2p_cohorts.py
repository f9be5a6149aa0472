"""Which P2P pairs of the bandwidth check share a median (checkkit/outliers.py): those over the
same kind of link, from the topology check's `nvidia-smi topo -m`, and where the kind cannot
tell pairs apart (a VM's matrix), those on the same side of the node's near/far shape
(``PairCohort``). A pure function of the figures and the matrix.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from preflight.checkkit.figures import Figure
from preflight.checkkit.outliers import Part
from preflight.gpuwork import ranks
from preflight.pipeline.check import Result


def link_kinds(topology: Result | None) -> dict[frozenset[int], str]:
    """GPU pair -> its `nvidia-smi topo -m` link ("NV18", "PIX", "SYS"), from the topology check."""
    matrix = topology.details.get("matrix") if topology else None
    out = {}
    for key, kind in ((matrix or {}).get("links") or {}).items():
        a, _, b = str(key).partition("-")
        if a.isdigit() and b.isdigit():
            out[frozenset((int(a), int(b)))] = str(kind)
    return out


def cohort(kinds: dict[frozenset[int], str], all_nvlink: bool, vm: bool = False, one_node: bool = False) -> PairCohort:
    """Which P2P pairs share a median: those over the same kind of link (an NVLink pair is
    not slow next to a pair that crosses the CPUs' interconnect). A pair whose link is not
    known is judged only on an NVSwitch board, where every pair's path is alike. In a VM
    (``vm``), whose matrix may hide the host's PCIe tree, PairCohort.split splits further;
    in a VM whose guest shows one NUMA node (``one_node``), the host copies too (HOST_COPIES)."""
    return PairCohort(kinds, all_nvlink, vm, vm and one_node)


class PairCohort:
    """The P2P pairs' cohorts (checkkit/outliers.py calls it on each figure, then ``split``
    on each group). A cohort's name is the words a finding says its median is over.

    A VM hides the host's PCIe tree: its `nvidia-smi topo -m` says one kind for every pair
    (PHB on one NUMA node where the host has two: NVIDIA/nccl#1674), while the copies it
    measures are near (one switch, one P2P clique) or far (across the host's switches or
    sockets, or through host memory where the hypervisor gives no peer access across
    cliques). Healthy near and far copies differ by 15% (6x A6000: 26.3 GB/s inside a group
    of three, 21.8-22.7 across, NVIDIA/nvbandwidth#50) to 2.4x (27.1 GB/s with peer access,
    11.3 through host memory in a Proxmox guest, noonghunna/club-3090#890). Held to one
    median, the far pairs read as outliers wherever the near ones are the majority (GPUs
    6 + 2 across the host's groups; with even groups the far pairs are the majority and hold
    the median). So in a VM where every pair not over NVLink is of one kind, its group is
    split by what the node does say, then by the near/far shape:

    - by peer access (CUDA's word per pair): a copy through host memory is not held to
      copies over P2P;
    - into the pairs inside and across GPU groups (``_gpu_groups``), where the pairs above
      some cut join the GPUs into two groups or more, each of two GPUs or more, and the
      pairs inside run faster than those across by more than the WARN band: each part is
      then judged against its own median (and split again, for a tree of switches and
      sockets).

    A near/far part only clears findings, never adds one: checkkit/outliers.py names a member
    of a part only where the median of its peer-access class finds it too, or where it is slower
    than every part's median (a near pair slower than the far ones).

    What stays caught: a GPU whose link trained down slows all of its pairs, which leaves it
    a group of one, so no split; a slow pair inside a group is held to the pairs inside
    groups. On bare metal, whose matrix names each pair's path, nothing is split: there a
    pair slower than its kind's peers, peer access lost included, is a fault.

    What this cannot tell apart, so it judges as before: a lone GPU far from the rest with
    peer access everywhere (3 + 1) is shaped like a GPU whose own link is slow; half its
    pairs near and half far put the far ones under the median by (n - f) / (n + f), 9-11%
    with the A6000's figures: a WARN, a FAIL only where far copies run under 2/3 of near
    ones. And a VM's host switch whose uplink trained down is shaped like a healthy far
    group: no P2P figure tells that one."""

    def __init__(self, kinds: dict[frozenset[int], str], all_nvlink: bool, vm: bool = False, host_split: bool = False):
        self.kinds, self.all_nvlink, self.host_split = kinds, all_nvlink, host_split
        plain = {kind for kind in kinds.values() if not kind.startswith("NV")}
        # The one kind that cannot tell a VM's pairs apart, as a cohort names it.
        self.hidden = f"{next(iter(plain))} links" if vm and len(plain) == 1 else None

    def __call__(self, g: Figure) -> str | None:
        if g.key != "p2p_bandwidth":
            return ""
        pair = _pair(g)
        kind = self.kinds.get(frozenset(pair)) if pair else None
        return f"{kind} links" if kind else ("NVSwitch links" if self.all_nvlink else None)

    def split(self, name: str, group: list[Figure], warn: float) -> list[Part]:
        """``group`` (the figures of one cohort ``name``) as the parts judged apart: by peer access,
        each class whole as a link kind is; then by the near/far shape, each part of a class only
        clearing that class's findings (outliers.Part). Host copies: host_parts."""
        if self.host_split and group and group[0].key in HOST_COPIES:
            return host_parts(name, group, warn)
        if name != self.hidden or not group or group[0].key != "p2p_bandwidth" or any(_pair(g) is None for g in group):
            return [Part(name, group, group, name)]
        by_access: dict[bool | None, list[Figure]] = defaultdict(list)
        for g in group:
            by_access[getattr(g, "peer_access", None)].append(g)
        out = []
        for access, members in by_access.items():
            cls = name if len(by_access) == 1 else f"{name}, {_ACCESS[access]}"
            parts = _near_far(cls, members, warn, depth=3)
            if len(parts) == 1:
                out.append(Part(cls, members, members, cls))  # one access class, judged whole as a link kind is
                continue
            slowest = min(statistics.median(g.value for g in of_part) for _, of_part in parts)
            out += [Part(part_name, of_part, members, cls, slowest) for part_name, of_part in parts]
        return out


_ACCESS = {True: "with peer access", False: "without peer access, through host memory", None: "peer access not reported"}


def _pair(g: Figure) -> tuple[int, int] | None:
    a, b = ranks.gpu_index(f"GPU {g.labels.get('gpu')}"), ranks.gpu_index(f"GPU {g.labels.get('peer_gpu')}")
    return (a, b) if a is not None and b is not None else None


def _near_far(name: str, members: list[Figure], warn: float, depth: int) -> list[tuple[str, list[Figure]]]:
    """``members`` (named ``name``) split into the pairs inside and across GPU groups where they
    have the near/far shape (PairCohort), each part split again down to ``depth``; else whole."""
    groups = _gpu_groups(members, warn) if depth > 0 and len(members) >= 4 else None
    if groups is None:
        return [(name, members)]
    inside, across = _inside_across(members, groups)
    said = " ".join("{" + ",".join(map(str, sorted(grp))) + "}" for grp in groups)
    return (_near_far(f"{name}, inside GPU groups {said}", inside, warn, depth - 1)
            + _near_far(f"{name}, across GPU groups {said}", across, warn, depth - 1))


def _gpu_groups(members: list[Figure], warn: float) -> list[set[int]] | None:
    """The GPU groups ``members`` fall into, or None where they have no near/far shape. Each cut
    between two distinct figures is tried: the pairs at or above it join their GPUs (union-find);
    the shape holds where that leaves two groups or more, each of two GPUs or more (so every pair
    across groups is below the cut), and the pairs inside groups run faster than those across by
    more than ``warn``, median to median (one near copy a little slow between the modes moves no
    cut that counts). Of the cuts that hold, the one with the widest such gap."""
    values = sorted({g.value for g in members})
    gpus = {gpu for g in members for gpu in _pair(g)}  # type: ignore[union-attr]
    best: tuple[float, list[set[int]]] | None = None
    for cut in values[1:]:
        groups = _joined(gpus, [_pair(g) for g in members if g.value >= cut])  # type: ignore[misc]
        if len(groups) < 2 or any(len(grp) < 2 for grp in groups):
            continue
        inside, across = _inside_across(members, groups)
        if not inside or not across or not statistics.median(g.value for g in across) > 0:
            continue
        gap = statistics.median(g.value for g in inside) / statistics.median(g.value for g in across)
        if gap > 1 + warn and (best is None or gap > best[0]):
            best = (gap, groups)
    return best[1] if best else None


def _inside_across(members: list[Figure], groups: list[set[int]]) -> tuple[list[Figure], list[Figure]]:
    """``members``, the pairs inside one of ``groups`` and the pairs across two."""
    of = {gpu: i for i, grp in enumerate(groups) for gpu in grp}
    near = [of[_pair(g)[0]] == of[_pair(g)[1]] for g in members]  # type: ignore[index]
    return [g for g, n in zip(members, near) if n], [g for g, n in zip(members, near) if not n]


def _joined(gpus: set[int], pairs: list[tuple[int, int]]) -> list[set[int]]:
    """The GPUs in groups, two GPUs in one group where a pair joins them (union-find), by lowest GPU."""
    root = {gpu: gpu for gpu in gpus}

    def find(x: int) -> int:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    for a, b in pairs:
        root[find(a)] = find(b)
    groups: dict[int, set[int]] = defaultdict(set)
    for gpu in gpus:
        groups[find(gpu)].add(gpu)
    return sorted(groups.values(), key=min)


# ---- host copies in a VM whose guest shows one NUMA node --------------------------------------

HOST_COPIES = ("h2d_bandwidth", "d2h_bandwidth")


def host_parts(name: str, group: list[Figure], warn: float) -> list[Part]:
    """One host-copy figure's GPUs (h2d or d2h, one figure a GPU) as the parts judged apart, where
    they fall into a near and a far group (HostSplit); else whole."""
    cut = _host_cut(group, warn)
    if cut is None:
        return [Part(name, group, group, name)]
    near, far = cut
    slowest = min(statistics.median(g.value for g in near), statistics.median(g.value for g in far))  # rates: more is better
    return [Part(f"{_gpus(near)}, the nearer group", near, group, name, slowest),
            Part(f"{_gpus(far)}, the farther group", far, group, name, slowest)]


def _gpus(part: list[Figure]) -> str:
    """"GPUs 0,1,2,3": the part's GPUs in order."""
    labels = sorted((g.labels.get("gpu", "?") for g in part), key=lambda x: (not x.isdigit(), int(x) if x.isdigit() else 0, x))
    return "GPUs " + ",".join(labels)


def _host_cut(group: list[Figure], warn: float) -> tuple[list[Figure], list[Figure]] | None:
    """HostSplit: a guest that shows one NUMA node cannot bind a rank near its GPU, while the host
    puts the VM's memory on its sockets as it chooses (Akamai's 8-GPU instances showed "one NUMA
    node" and "no GPU-to-socket affinity" over a dual-socket host: techdocs.akamai.com/cloud-
    computing/docs/virtual-numa-topology; libvirt's defaults gave guests "a flat single-NUMA machine
    sitting on top of a multi-NUMA server": cloudrift.ai/blog/benchmarking-vcpu-numa-libvirt-settings).
    A copy whose host memory sits on the other socket runs slower by the host's own design: pinned
    H2D 12.15 GB/s local against 3.78 across QPI on a P100 host (mpicbg-scicomp/gearshifft#82),
    none across xGMI where PCIe Gen4 is the bottleneck (ROCm/rocm_bandwidth_test#129). Held to one
    median, the far GPUs read as outliers. So the figures, sorted, are cut where two neighbours lie
    furthest apart, each side holding two GPUs or more, and only where those two neighbours differ
    by more than the WARN band: a gap between two groups, not one slow GPU beside a healthy one
    (whose medians alone could differ that much). Each part then only clears the whole's findings
    (outliers.Part): a GPU slower than the far group's median is read against its own group.

    What stays caught: one GPU whose link trained down is a group of one, so no cut; a GPU slow
    among its own group is held to that group; the floors judge every figure as before. What this
    cannot tell from the host's layout: two GPUs or more slow together (a shared switch's uplink):
    only their floor judges them. Bare metal, and a guest with NUMA nodes to bind to, never split."""
    if len(group) < 4:
        return None
    ordered = sorted(group, key=lambda g: g.value, reverse=True)  # best first: HOST_COPIES are rates
    best: tuple[float, int] | None = None
    for k in range(2, len(ordered) - 1):  # two GPUs or more on each side
        a, b = ordered[k - 1].value, ordered[k].value  # the near side's slowest, the far side's fastest
        if not (a > 0 and b > 0):
            continue
        step = a / b
        if step > 1 + warn and (best is None or step > best[0]):
            best = (step, k)
    return (ordered[:best[1]], ordered[best[1]:]) if best else None
