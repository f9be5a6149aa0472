"""The topology check's NVLink judge: which GPU pairs the node must join by
NVLink, from the profile's word and the node's shape (`link_mode`: every pair
at the SKU's width on NVSwitch, a mesh of direct links, bridged pairs, or no
GPU left out), and the matrix held to it, naming a GPU that lost its links
rather than every pair it is in; a GPU whose links reach only GPUs outside this
view (`bridged_elsewhere`) is no fault.
"""

from __future__ import annotations

import re

from preflight.base.findings import Finding, Status
from preflight.checkkit.topology_judges import name_list
from preflight.pipeline.expectations import TopologyExpect
from preflight.pipeline.shape import NodeShape
from preflight.readers.machine import topo_derived
from preflight.readers.machine.layout import TopologyFacts
from preflight.readers.machine.layout_queries import gpu_count, matrix_position, nvlink_count
from preflight.readers.nvidia.topo import Topo

FAIL, WARN = Status.FAIL, Status.WARN


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
    # The matrix's rows, not NVML's numbers, where they differ (a device cgroup: layout_queries.matrix_position).
    down = {row(facts, g.index): g.nvlinks_down for g in facts.gpus if g.nvlinks_down}
    elsewhere = {row(facts, i): away for i, away in bridged_elsewhere(facts).items()}
    mode = link_mode(expect, shape)
    if topo_derived.LINKS in facts.unanswered:
        # No source says which GPUs the links join: nothing to hold the node to, and nothing to clear it by.
        if mode != "none" and gpu_count(facts) > 1:
            out.append(Finding(WARN, "NVLink pairs unknown", facts.unanswered[topo_derived.LINKS] + ": NVLink between the GPUs was not judged",
                               "run `nvidia-smi topo -m` and `nvidia-smi nvlink -s` by hand; update nvidia-ml-py to the driver's generation"))
        m = None
    # Bridges join two cards: of an odd number, one is out by design. Never on an NVSwitch, whose GPUs
    # all reach it. In a share of the node the count that says so is the node's, not the share's
    # (3 of 4 bridged cards: none out by design; 3 of 5: the share may hold the one).
    bridged = mode == "pairs" or (mode == "peers" and shape is not None and shape.fabric == "nvlink")
    odd = m is not None and bridged and odd_card_out(m, facts, _cards(shape, len(m.gpus)) % 2, elsewhere)
    if m is not None and mode in ("mesh", "peers"):
        out += _left_out(m, every_pair=mode == "mesh", elsewhere=elsewhere, odd=odd)
    if m is not None and mode == "all":
        short = {k: v for k, v in m.links.items() if nvlink_count(v) < want}
        n = len(m.gpus)
        if n > 2 and len(short) == len(m.links) and not any(nvlink_count(v) for v in short.values()):
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
                               f"expected NV{want} between every GPU pair, found {name_list(pairs)}", _NVLINK_REMEDY))
    elif m is not None and mode == "pairs":
        for g in range(len(m.gpus)):
            peers = {j: m.link(g, j) for j in range(len(m.gpus)) if j != g and nvlink_count(m.link(g, j))}
            best = max(peers.items(), key=lambda kv: nvlink_count(kv[1]), default=None)
            if best is None:
                if g in elsewhere or odd:
                    continue
                out.append(Finding(FAIL, f"GPU {g} has no NVLink peer", f"GPU {g} has no NVLink to any GPU (NV{want} bridge to its pair expected): "
                                   "the bridge is missing or unseated", "reseat or replace the NVLink bridge of this GPU pair; " + _NVLINK_REMEDY))
            elif nvlink_count(best[1]) < want and g < best[0]:
                out.append(Finding(FAIL, f"GPU {g}-GPU {best[0]} bridged at {best[1]}, NV{want} expected",
                                   f"GPU {g} and GPU {best[0]} are joined by {best[1]} instead of NV{want}: a bridge of the pair is missing or a link is down",
                                   "reseat the NVLink bridges of this pair; " + _NVLINK_REMEDY))
    listed = {i for f in out for i in range(gpu_count(facts)) if re.search(rf"GPU {i}\b", f.cause)}
    for i, links in sorted(down.items()):
        if i not in listed:
            out.append(Finding(FAIL, f"GPU {i}: NVLink {', '.join(map(str, links))} down",
                               f"NVML reports NVLink link(s) {', '.join(map(str, links))} of GPU {i} present but not active", _NVLINK_REMEDY))
    return out


def bridged_elsewhere(facts: TopologyFacts) -> dict[int, list[str]]:
    """GPU index -> the bus ids of GPUs outside this view (another pod's or job's) that its active
    NVLinks reach, as NVML says: such a GPU has its bridge, to a partner it was not given with."""
    ours = {p.pci.lower() for p in facts.gpus}
    out = {}
    for p in facts.gpus:
        # Only links NVML says end at a GPU: where it cannot tell a GPU from an NVSwitch, the
        # peers it lists may be switches, and a GPU cut off from its fabric must still fail.
        if not (p.nvlink_remote or {}).get("gpu") or "switch" in (p.nvlink_remote or {}):
            continue
        if away := sorted(bus for bus in (p.nvlink_peers or {}) if bus.lower() not in ours):
            out[p.index] = away
    return out


def row(facts: TopologyFacts, index: int) -> int:
    """The matrix row of NVML's GPU ``index``; its own number where the matrix has no row for it."""
    pos = matrix_position(facts, index)
    return index if pos is None else pos


def _cards(shape: NodeShape | None, seen: int) -> int:
    """The node's GPU cards: its own count where this run was given a share of them, else ``seen``."""
    if shape is None:
        return seen
    return shape.host_gpus or max(len(shape.pci_gpus or []), seen)


def odd_card_out(m: Topo, facts: TopologyFacts, by_design: int, elsewhere: dict[int, list[str]]) -> bool:
    """Whether the GPUs with no NVLink peer here are the one an odd number of bridged cards
    leaves out: every other GPU is bridged to exactly one peer and, where NVML counts them, carries
    all its active links to it (on a board of direct links a GPU reaches several), the card out
    has no active link (one whose links end somewhere unseen is no card without a bridge), and no
    more are left out than ``by_design``, the node's count's parity (3 cards, one pair: one; two
    pairs of four: none). A GPU bridged to one outside this view (``elsewhere``: ``bridged_elsewhere``)
    is none of them: its bridge is there."""
    n = len(m.gpus)
    peers = {g: [j for j in range(n) if j != g and nvlink_count(m.link(g, j))] for g in range(n)}
    lone = [g for g in range(n) if not peers[g] and g not in elsewhere]
    active = {row(facts, p.index): p.nvlinks_active for p in facts.gpus}
    paired = all(len(peers[g]) == 1 and active.get(g) in (None, nvlink_count(m.link(g, peers[g][0])))
                 for g in range(n) if peers[g])
    unbridged = all(not active.get(g) for g in lone)
    return paired and unbridged and 0 < len(lone) <= by_design


def _left_out(m: Topo, every_pair: bool, elsewhere: dict[int, list[str]], odd: bool = False) -> list[Finding]:
    """On a node whose GPUs NVLink joins: a GPU with no NVLink peer at all, or
    (``every_pair``) a pair with none between them. A GPU whose links reach only GPUs
    outside this view (``elsewhere``) is left out by whoever chose the GPUs, not by a fault;
    nor is the odd card out of bridged pairs (``odd``: ``odd_card_out``)."""
    n = len(m.gpus)
    lone = [g for g in range(n) if not any(nvlink_count(m.link(g, j)) for j in range(n) if j != g) and g not in elsewhere]
    out = [Finding(FAIL, f"GPU {g} has no NVLink peer", f"GPU {g} has no NVLink to any GPU while the node's other GPUs are joined by NVLink: "
                   "its bridge is missing or unseated, or its links are down", "reseat or replace the NVLink bridge of this GPU; " + _NVLINK_REMEDY)
           for g in lone if len(lone) < n and not odd]
    if every_pair:
        pairs = [f"GPU {a}-GPU {b} {m.link(a, b)}" for a in range(n) for b in range(a + 1, n) if a not in lone and b not in lone and not nvlink_count(m.link(a, b))]
        if pairs:
            out.append(Finding(FAIL, f"no NVLink between {len(pairs)} GPU pair(s)", f"this board joins every GPU pair by NVLink; found {name_list(pairs)}", _NVLINK_REMEDY))
    return out


_NVLINK_REMEDY = ("check `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e` for the GPU; on NVSwitch systems check that "
                  "nvidia-fabricmanager is running; a link that stays down needs a reset or an RMA")
