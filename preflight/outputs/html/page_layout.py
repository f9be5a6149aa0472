"""The node's layout as a picture: NUMA nodes with their CPUs, the GPUs and
NICs on each, and the NVLinks between GPUs, from what the topology check
recorded (sysfs, NVML and `nvidia-smi topo -m`). What the check could not
learn is drawn as unknown, never placed by guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from preflight.outputs.html.page_svg import COLOURS, esc, svg_doc

if TYPE_CHECKING:
    from preflight.pipeline.report import Report

UNKNOWN = "?"  # the NUMA node of a part the kernel does not place


@dataclass(frozen=True)
class Part:
    name: str  # "GPU 0", "mlx5_0"
    kind: str  # "gpu", "nic"
    numa: str  # "0", "1", UNKNOWN
    note: str  # one line under the name: PCIe link, NVLinks
    bad: bool = False


@dataclass
class Layout:
    numa: dict[str, str]  # node -> its CPU list ("" where unknown)
    parts: list[Part]
    links: dict[tuple[int, int], str] = field(default_factory=dict)  # GPU pair -> "NV18"
    fabric: str = "unknown"  # the node's shape: nvswitch, nvlink, pcie, single
    source: str = ""


def layout(report: Report) -> Layout | None:
    """None where the topology check did not run or recorded nothing."""
    topo = next((c for c in report.checks if c.check == "topology"), None)
    d = topo.details if topo is not None else {}
    if not d.get("gpus") and not d.get("matrix"):
        return None
    matrix = d.get("matrix") or {}
    by_matrix = {g.get("index"): g for g in matrix.get("gpus") or [] if isinstance(g, dict)}
    numa = {str(k): str(v) for k, v in ((d.get("cpus") or {}).get("nodes") or {}).items()}
    parts = []
    for g in d.get("gpus") or [{"index": i} for i in by_matrix]:
        i = g.get("index")
        node = g.get("numa_node")
        if node is None and len((by_matrix.get(i) or {}).get("numa_nodes") or []) == 1:
            node = by_matrix[i]["numa_nodes"][0]
        down = g.get("nvlinks_down") or []
        notes = []
        link = g.get("link") or {}
        if link.get("width"):
            notes.append(f"PCIe x{link['width']}" + (f" of x{link['max_width']}" if link.get("max_width") not in (None, link["width"]) else ""))
        if g.get("nvlinks_active") is not None:
            notes.append(f"{g['nvlinks_active']} NVLinks" + (f", {len(down)} down" if down else ""))
        short = bool(down) or bool(link.get("width") and link.get("max_width") and link["width"] < link["max_width"])
        parts.append(Part(f"GPU {i}", "gpu", UNKNOWN if node is None else str(node), ", ".join(notes), short))
    for n in d.get("nics") or []:
        node = n.get("numa_node")
        up = [p for p in n.get("ports") or [] if isinstance(p, dict)]
        state = ", ".join(str(p.get("state") or "") for p in up if p.get("state"))
        parts.append(Part(str(n.get("name")), "nic", UNKNOWN if node is None else str(node), state))
    for p in parts:
        numa.setdefault(p.numa, "")
    links = {}
    for pair, kind in (matrix.get("links") or {}).items():
        a, _, b = str(pair).partition("-")
        if str(kind).startswith("NV") and a.isdigit() and b.isdigit():
            links[(int(a), int(b))] = str(kind)
    fabric = report.shape.fabric if report.shape is not None else "unknown"
    if matrix and d.get("matrix_source", "nvidia-smi topo -m") == "nvidia-smi topo -m":
        source = "nvidia-smi topo -m, sysfs and NVML"
    elif matrix:  # built from NVML and sysfs where nvidia-smi's matrix could not be read
        source = f"{d['matrix_source']} (`nvidia-smi topo -m` unreadable: {d.get('matrix_error') or 'not read'})"
    else:
        source = f"sysfs and NVML (no link matrix: {d.get('matrix_error') or 'not read'})"
    return Layout(dict(sorted(numa.items(), key=lambda kv: (kv[0] == UNKNOWN, kv[0].zfill(4)))), parts, links, fabric, source)


def _all_pairs(n: int, links: dict[tuple[int, int], str]) -> bool:
    return n > 1 and len(links) == n * (n - 1) // 2 and len(set(links.values())) == 1


def picture(lay: Layout) -> str:
    """NUMA nodes side by side; GPUs in a row on each, NICs under them. Every GPU pair joined
    alike (NVSwitch, or a full mesh) is one shared bar; otherwise each NVLink is an arc."""
    box_w, box_h, gap = 118, 46, 12
    columns = []
    for node, cpus in lay.numa.items():
        gpus = [p for p in lay.parts if p.kind == "gpu" and p.numa == node]
        nics = [p for p in lay.parts if p.kind == "nic" and p.numa == node]
        columns.append((node, cpus, gpus, nics, max(len(gpus), min(len(nics), 4), 1)))
    gpu_count = sum(1 for p in lay.parts if p.kind == "gpu")
    shared = lay.fabric == "nvswitch" or _all_pairs(gpu_count, lay.links)
    arcs = not shared and bool(lay.links)
    top = 60 if arcs else 20
    nic_rows = max((len(c[3]) + 3) // 4 for c in columns) if columns else 0
    col_h = 40 + box_h + 20 + nic_rows * (box_h + gap) + 10
    # Painted in this order (SVG has no z-index): NUMA boxes, the wires to the switch, the parts, the links.
    backdrop, wires, body, where, x = [], [], [], {}, 10
    for node, cpus, gpus, nics, slots in columns:
        title = f"NUMA node {node}" + (f" (CPUs {cpus})" if cpus else "") if node != UNKNOWN else "NUMA node unknown"
        w = max(slots * (box_w + gap) + gap, int(len(title[:48]) * 7 + 20))
        backdrop.append(f'<g class="numa" data-node="{esc(node)}"><rect x="{x}" y="{top}" width="{w}" height="{col_h}" rx="8" fill="#f3f6fb" stroke="#90a4ae"/>'
                    f'<text x="{x + 10}" y="{top + 18}" fill="#37474f">{esc(title[:48])}</text></g>')
        for i, p in enumerate(gpus):
            bx, by = x + gap + i * (box_w + gap), top + 30
            where[int(p.name.split()[1])] = (bx + box_w / 2, by)
            body.append(_box(p, bx, by, box_w, box_h, "#e8f5e9"))
        for i, p in enumerate(nics):
            bx, by = x + gap + (i % 4) * (box_w + gap), top + 30 + box_h + 20 + (i // 4) * (box_h + gap)
            body.append(_box(p, bx, by, box_w, box_h, "#fff8e1"))
        x += w + 14
    width = max(x, 300)
    height = top + col_h + (46 if shared and gpu_count > 1 else 10)
    if shared and gpu_count > 1:
        y = top + col_h + 22
        label = "NVSwitch: every GPU pair over NVLink" if lay.fabric == "nvswitch" else f"every GPU pair joined by {next(iter(lay.links.values()))}"
        body.append(f'<g class="fabric"><rect x="10" y="{y}" width="{width - 20}" height="16" rx="4" fill="#7e57c2"/>'
                    f'<text x="{width / 2}" y="{y + 12}" text-anchor="middle" fill="#fff">{esc(label)}</text></g>')
        wires += [f'<line x1="{cx}" y1="{cy + box_h}" x2="{cx}" y2="{y}" stroke="#7e57c2" stroke-width="2" stroke-dasharray="2 3"/>' for cx, cy in where.values()]
    for (a, b), kind in sorted(lay.links.items()) if arcs else []:
        if a in where and b in where:
            (ax, ay), (bx, by) = where[a], where[b]
            lift = 14 + abs(bx - ax) / 12
            body.append(f'<g class="nvlink" data-pair="{a}-{b}"><title>GPU {a} - GPU {b}: {esc(kind)}</title>'
                        f'<path d="M{ax},{ay} C{ax},{ay - lift} {bx},{by - lift} {bx},{by}" fill="none" stroke="#7e57c2" stroke-width="2"/>'
                        f'<text x="{(ax + bx) / 2}" y="{ay - lift * 0.75 - 2:.1f}" text-anchor="middle" font-size="10" fill="#4527a0">{esc(kind)}</text></g>')
    return svg_doc(int(width), int(height), backdrop + wires + body, "the node's layout: NUMA nodes, GPUs, NICs and NVLinks")


def _box(p: Part, x: float, y: float, w: int, h: int, fill: str) -> str:
    stroke = COLOURS["FAIL"] if p.bad else "#607d8b"
    tip = f"{p.name} on NUMA node {p.numa}" + (f": {p.note}" if p.note else "")
    return (f'<g class="{p.kind}" data-name="{esc(p.name)}"><title>{esc(tip)}</title>'
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="5" fill="{fill}" stroke="{stroke}" stroke-width="{3 if p.bad else 1}"/>'
            f'<text x="{x + w / 2}" y="{y + 18}" text-anchor="middle" font-weight="bold">{esc(p.name[:14])}</text>'
            f'<text x="{x + w / 2}" y="{y + 34}" text-anchor="middle" font-size="10" fill="#455a64">{esc(p.note[:24])}</text></g>')
