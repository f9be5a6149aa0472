"""The report page's pictures as inline SVG: a timeline, bars against a floor,
a heatmap and line charts. No script and no external file: the page must open
on an air-gapped node, and a browser shows each element's <title> as its tooltip.

Every drawn element a person reads carries a class (``bar``, ``cell``,
``span``, ``line``) and data- attributes, so the browser test counts what is
on screen rather than what the code meant to draw.
"""

from __future__ import annotations

import html
import math

from preflight.base.units import fmt_value
from preflight.outputs.html.page_facts import BarGroup, Matrix, Span
from preflight.outputs.html.page_traces import Chart

COLOURS = {"PASS": "#2e7d32", "WARN": "#ef8f00", "FAIL": "#c62828", "ERROR": "#6a1b9a", "SKIP": "#9e9e9e"}
LINES = ["#1565c0", "#c62828", "#2e7d32", "#ef8f00", "#6a1b9a", "#00838f", "#ad1457", "#4e342e"]
FONT = 'font-family="sans-serif" font-size="12"'


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def fmt(value: float, unit: str) -> str:
    """fmt_value, and a bare number (a loss) for no unit."""
    return fmt_value(value, unit) if unit else f"{value:.4g}"


def svg_doc(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'role="img" aria-label="{esc(label)}" {FONT}>' + "".join(body) + "</svg>")


def timeline(spans: list[Span], total: float) -> str:
    """One row per check, its bar where it ran in the run; a carried check is a mark, not a bar."""
    width, left, row = 760, 110, 22
    scale = (width - left - 70) / max(total, sum(s.seconds for s in spans), 1e-9)
    body = []
    for i, s in enumerate(spans):
        y = 6 + i * row
        body.append(f'<text x="{left - 8}" y="{y + 14}" text-anchor="end">{esc(s.check)}</text>')
        colour = COLOURS.get(s.status, "#9e9e9e")
        if s.carried_from:
            tip = f"{s.check} {s.status}: carried from the run of {s.carried_from}, not measured in this one"
            body.append(f'<g class="span" data-check="{esc(s.check)}" data-status="{s.status}"><title>{esc(tip)}</title>'
                        f'<rect x="{left}" y="{y + 3}" width="12" height="12" fill="none" stroke="{colour}" stroke-dasharray="3 2"/>'
                        f'<text x="{left + 18}" y="{y + 14}" fill="#555">carried from {esc(s.carried_from[:19])}</text></g>')
            continue
        x, w = left + s.start * scale, max(s.seconds * scale, 2)
        tip = f"{s.check} {s.status}: {s.seconds:.2f} s, from {s.start:.2f} s"
        body.append(f'<g class="span" data-check="{esc(s.check)}" data-status="{s.status}"><title>{esc(tip)}</title>'
                    f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="15" fill="{colour}"/>'
                    f'<text x="{x + w + 5:.1f}" y="{y + 14}">{s.seconds:.1f} s</text></g>')
    return svg_doc(width, 12 + len(spans) * row, body, "where the run's time went, check by check")


def bars(group: BarGroup) -> str:
    """One horizontal bar per member, weakest first, the bound a dashed line; a bar past
    its bound is red, an outlier against the node's median is ringed and named."""
    width, left, row = 760, 80, 22
    top = max([b.value for b in group.bars] + [b.bound or 0 for b in group.bars]) * 1.1 or 1.0
    scale = (width - left - 230) / top
    body = []
    for i, b in enumerate(group.bars):
        y = 4 + i * row
        colour = COLOURS["FAIL"] if b.past_bound else COLOURS[b.outlier] if b.outlier else COLOURS["PASS"]
        said = [fmt(b.value, group.unit)]
        if b.bound is not None:
            said.append(f"{'floor' if b.higher_is_better else 'ceiling'} {fmt(b.bound, group.unit)}")
        if b.off_median is not None:
            said.append(f"{abs(b.off_median):.0%} {'worse' if b.off_median > 0 else 'better'} than the node's median")
        mark = f"outlier ({b.outlier})" if b.outlier else ""
        tip = f"{b.who}: " + ", ".join(said) + (f"; {mark}" if mark else "")
        w = max(b.value * scale, 1)
        ring = f' stroke="{COLOURS[b.outlier]}" stroke-width="3"' if b.outlier else ""
        body.append(f'<g class="bar" data-who="{esc(b.who)}" data-past-bound="{str(b.past_bound).lower()}" data-outlier="{b.outlier or ""}">'
                    f'<title>{esc(tip)}</title><text x="{left - 8}" y="{y + 14}" text-anchor="end">{esc(b.who)}</text>'
                    f'<rect x="{left}" y="{y + 2}" width="{w:.1f}" height="15" fill="{colour}"{ring}/>'
                    f'<text x="{left + w + 6:.1f}" y="{y + 14}">{esc(fmt(b.value, group.unit))}{esc(" " + mark) if mark else ""}</text></g>')
        if b.bound is not None:
            x = left + b.bound * scale
            body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + row}" stroke="#000" stroke-dasharray="4 3"/>')
    return svg_doc(width, 8 + len(group.bars) * row, body, f"{group.name}: each member against its bound")


def _heat(value: float, top: float) -> str:
    """Pale to deep blue as the figure rises to the matrix's best."""
    t = max(0.0, min(1.0, value / top)) if top > 0 else 0.0
    r, g, b = (int(230 - 200 * t), int(240 - 150 * t), int(255 - 60 * t))
    return f"rgb({r},{g},{b})"


def heatmap(m: Matrix) -> str:
    """Sender rows, receiver columns, GB/s in each cell; a cell below the floor is red
    with a cross, an outlier has a thick border, one not measured is grey and says so."""
    size = 64 if m.gpus <= 8 else max(22, 512 // m.gpus)
    left, top = 70, 44
    best = max((c.value for c in m.cells if c.value is not None), default=0.0)
    body = [f'<text x="{left + size * m.gpus / 2}" y="14" text-anchor="middle">to GPU</text>',
            f'<text x="14" y="{top + size * m.gpus / 2}" transform="rotate(-90 14 {top + size * m.gpus / 2})" text-anchor="middle">from GPU</text>']
    for i in range(m.gpus):
        body.append(f'<text x="{left + i * size + size / 2}" y="{top - 8}" text-anchor="middle">{i}</text>')
        body.append(f'<text x="{left - 8}" y="{top + i * size + size / 2 + 4}" text-anchor="end">{i}</text>')
        body.append(f'<rect x="{left + i * size}" y="{top + i * size}" width="{size}" height="{size}" fill="#fff" stroke="#ddd"/>')
    for c in m.cells:
        x, y = left + c.dst * size, top + c.src * size
        if c.value is None:
            fill, text, tip = "#e0e0e0", "-", f"GPU {c.src} -> GPU {c.dst}: not measured"
        else:
            fill = "#ef9a9a" if c.below_floor else _heat(c.value, best)
            text = f"{c.value / 1e9:.0f}" if c.value >= 10e9 else f"{c.value / 1e9:.1f}"
            tip = f"GPU {c.src} -> GPU {c.dst}: {fmt(c.value, 'bytes_per_second')}"
            if m.floor is not None:
                tip += f", floor {fmt(m.floor, 'bytes_per_second')}" + (" (below)" if c.below_floor else "")
            if c.outlier:
                tip += f"; outlier against the node's median ({c.outlier})"
        stroke = f'stroke="{COLOURS[c.outlier]}" stroke-width="4"' if c.outlier else 'stroke="#fff" stroke-width="1"'
        ink = "#fff" if c.value is not None and not c.below_floor and best and c.value / best > 0.6 else "#000"
        body.append(f'<g class="cell" data-src="{c.src}" data-dst="{c.dst}" data-below-floor="{str(c.below_floor).lower()}">'
                    f'<title>{esc(tip)}</title><rect x="{x + 1}" y="{y + 1}" width="{size - 2}" height="{size - 2}" fill="{fill}" {stroke}/>'
                    f'<text x="{x + size / 2}" y="{y + size / 2 + 4}" text-anchor="middle" fill="{ink}">{esc(text)}{" x" if c.below_floor else ""}</text></g>')
    side = left + size * m.gpus + 10
    return svg_doc(side, top + size * m.gpus + 10, body, "GPU to GPU copy bandwidth, GB/s, for every ordered pair")


def _ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / count))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= count:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _labels(ticks: list[float], unit: str) -> list[str]:
    """Tick labels that differ from each other: '28 ms' five times says nothing."""
    said = [fmt(t, unit) for t in ticks]
    if len(set(said)) == len(said):
        return said
    scale, suffix = {"seconds": (1e3, " ms"), "hertz": (1e-6, " MHz"), "flops_per_second": (1e-12, " TFLOP/s"),
                     "bytes_per_second": (1e-9, " GB/s")}.get(unit, (1.0, ""))
    for digits in range(1, 7):
        said = [f"{t * scale:.{digits}f}{suffix}" for t in ticks]
        if len(set(said)) == len(said):
            break
    return said


def chart(c: Chart) -> str:
    """Lines on shared axes, one colour per series, a legend under the plot. A figure with a
    unit starts its axis at zero, so a wobble of a percent does not look like a fault; the loss
    (no unit) is drawn over its own range, where its shape is what matters."""
    width, height, left, right, top, plot_h = 760, 250, 110, 20, 10, 180
    c = Chart(c.title, c.x_label, c.unit, [s for s in c.series if all(map(math.isfinite, s.xs + s.ys)) and s.xs])
    if not c.series:
        return '<p class="muted">nothing that can be drawn</p>'
    xs = [x for s in c.series for x in s.xs]
    ys = [y for s in c.series for y in s.ys]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if c.unit and y0 >= 0:
        y0, y1 = 0.0, y1 * 1.1 or 1.0
    else:
        pad = (y1 - y0) * 0.1 or abs(y1) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    sx = (width - left - right) / ((x1 - x0) or 1)
    sy = plot_h / ((y1 - y0) or 1)

    def px(x: float, y: float) -> str:
        return f"{left + (x - x0) * sx:.1f},{top + plot_h - (y - y0) * sy:.1f}"

    body = [f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>']
    ticks = _ticks(y0, y1)
    for t, said in zip(ticks, _labels(ticks, c.unit)):
        y = top + plot_h - (t - y0) * sy
        body.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                    f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(said)}</text>')
    for t in _ticks(x0, x1):
        x = left + (t - x0) * sx
        body.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{t:g}</text>')
    body.append(f'<text x="{left + (width - left - right) / 2}" y="{top + plot_h + 32}" text-anchor="middle" fill="#555">{esc(c.x_label)}</text>')
    for i, s in enumerate(c.series):
        colour = LINES[i % len(LINES)]
        points = " ".join(px(x, y) for x, y in zip(s.xs, s.ys))
        tip = f"{s.label}: {fmt(min(s.ys), c.unit)} to {fmt(max(s.ys), c.unit)} over {len(s.ys)} points"
        body.append(f'<g class="line" data-series="{esc(s.label)}"><title>{esc(tip)}</title>'
                    f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/></g>')
        lx = left + (i % 6) * 110
        ly = top + plot_h + 48 + (i // 6) * 16
        body.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{colour}"/><text x="{lx + 14}" y="{ly}">{esc(s.label)}</text>')
    rows = (len(c.series) + 5) // 6
    return svg_doc(width, max(height, top + plot_h + 40 + rows * 16 + 8), body, c.title)
