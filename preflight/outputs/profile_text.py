"""Profiles and their checks as a person reads them: `preflight show-profile` and `preflight list`."""

from __future__ import annotations

from preflight.pipeline.check import Check
from preflight.pipeline.profiles import ResolvedProfile
from preflight.pipeline.shape import FABRIC_WORDS
from preflight.base.units import fmt_bytes, fmt_value


def describe(p: ResolvedProfile) -> str:
    """Checks, expectations and every floor with where its value came from."""
    out: list[str] = []
    out.append(f"profile {p.name} ({p.chosen_because})\n  file: {p.path}\n  {p.description}")
    gpus = "read from the node (any count of this model; `preflight detect` shows it)" if p.has_gpus else "none (gloo ranks on CPU)"
    out.append(f"  GPUs: {gpus}\n  checks, in order: {', '.join(p.checks)}")
    if p.levels is None:
        out.append("  levels: none listed: standard and full run every check; no quick level")
    else:
        out.append("  levels (`run --level`):")
        for name in ("quick", "standard", "full"):
            level = p.levels.of(name)
            out.append(f"    {name}: {', '.join(level.checks)}; about {level.seconds:g} s\n      source: {level.source}")
    out.append("  floors:")
    for fname, f in p.floors.items():
        human = f" ({fmt_value(f.value, f.unit)})" if f.unit in ("bytes", "bytes_per_second", "seconds") else ""
        kind = "at least" if f.bound == "min" else "at most"
        value = f"{f.value:.0f}" if f.value.is_integer() else f"{f.value:g}"
        shape = " and ".join(x for x in (f"{f.gpus} GPUs" if f.gpus else "", f"GPUs {FABRIC_WORDS[f.fabric]}" if f.fabric else "") if x)
        judges = f"\n      judges only nodes of {shape} (measured there)" if shape else ""
        out.append(f"    {fname}: {kind} {value} {f.unit}{human}\n      value from: {f.origin}\n      source: {f.source}{judges}")
    if g := p.gpu:
        out.append(f"  GPU expectations:\n    PCI device ids: {', '.join(g.pci_device_ids) or 'any'}")
        out.append(f"    driver {f'at least {g.driver_min}' if g.driver_min else '(any that loads the GPU)'}\n      source: {g.driver_source}")
        links = "the node's own count, where NVLink joins its GPUs (NVSwitch: its best GPU's; direct links: most GPUs')" if g.nvlinks_from_node else g.nvlinks
        out.append(f"    NVLinks per GPU: {links}" + (f"\n      source: {g.nvlinks_source}" if g.nvlinks_source else ""))
        if g.memory_min_bytes:
            out.append(f"    memory at least {fmt_bytes(g.memory_min_bytes)}\n      source: {g.memory_source}")
        out.append(f"    MIG: {'off (whole GPUs)' if g.whole_gpus else 'allowed'}")
    if t := p.topology:
        links = {"all": f"where an NVSwitch joins the GPUs: NV{t.nvlink_width} between every GPU pair",
                 "pairs": f"where bridges join the GPUs: NV{t.nvlink_width} between the GPUs of each bridged pair", "none": "no NVLink promised"}
        fail = f", FAIL above {t.numa_fail_above}" if t.numa_fail_above else ""
        out.append(f"  topology expectations:\n    {links[t.nvlink]}" + (f"\n      source: {t.nvlink_source}" if t.nvlink_source else ""))
        out.append(f"    GPUs on at most {t.numa_warn_above} NUMA node(s) without a warning{fail}\n      source: {t.numa_source}")
        out.append(f"    a NIC at PIX/PXB beside every GPU: {'yes, on nodes with NICs' if t.nic_per_gpu else 'not required'}" + (f"\n      source: {t.nic_source}" if t.nic_source else ""))
    if d := p.drift:
        out.append(f"  drift (against the node's own history): WARN where a figure's median over the last {d.recent} runs is more than "
                   f"{d.fraction:.0%} under its median over up to {d.earlier} runs before them (at least {d.earlier_min}), "
                   f"still above its floor\n      source: {d.source}")
    return "\n".join(out) + "\n"


def check_rows(checks: list[Check]) -> list[dict]:
    """`preflight list --json`: what each check verifies, what it needs first, its deadline."""
    return [
        {"name": c.name, "description": c.description, "requires": list(c.requires), "timeout_seconds": c.timeout_seconds}
        for c in checks
    ]


def check_table(rows: list[dict]) -> str:
    """`preflight list`: a check a line, its name, what it verifies, what it runs after."""
    width = max((len(r["name"]) for r in rows), default=0)
    out = ""
    for r in rows:
        needs = f" (after {', '.join(r['requires'])})" if r["requires"] else ""
        out += f"{r['name']:<{width}}  {r['description']}{needs}\n"
    return out
