"""docs/reference.md, written from the code: what every built-in check judges, and every
built-in profile's checks, levels, floors and expectations, each with its source.

`python -m preflight.outputs.reference docs/reference.md` writes it; tests/test_docs.py
fails when the file differs from what this would write now, so the reference a person
reads cannot drift from the profiles and checks a run uses.
"""

from __future__ import annotations

import sys
from pathlib import Path

from preflight.base import safefile
from preflight.base.units import fmt_value
from preflight.pipeline import profiles, registry
from preflight.pipeline.profiles import Profile
from preflight.pipeline.shape import FABRIC_WORDS

HEAD = """# Checks and floors: the reference

Written by `python -m preflight.outputs.reference docs/reference.md` from the checks
and the built-in profiles (`preflight/pipeline/profiles/*.toml`); do not edit it by hand:
a test fails when it differs from what the code would write. On a node,
`preflight list` and `preflight show-profile NAME` say the same of what is installed
there, a site's profiles and floors included.
"""


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def checks_section() -> list[str]:
    out = ["## Checks, cheapest first", "", "| check | runs after | timeout | what it judges |", "|---|---|---|---|"]
    for c in registry.builtin():
        out.append(f"| `{c.name}` | {', '.join(c.requires) or '-'} | {c.timeout_seconds:g} s | {_cell(c.description)} |")
    return out


def profile_section(p: Profile) -> list[str]:
    out = [f"## Profile `{p.name}`", "", _cell(p.description), "", f"Checks, in order: {', '.join(f'`{c}`' for c in p.checks)}.", ""]
    if p.levels is not None:
        out += ["| level | checks | about | source |", "|---|---|---|---|"]
        for name in ("quick", "standard", "full"):
            level = p.levels.of(name)
            out.append(f"| {name} | {', '.join(level.checks)} | {level.seconds:g} s | {_cell(level.source)} |")
        out.append("")
    if p.floors:
        out += ["| floor | bound | value | judges | source |", "|---|---|---|---|---|"]
        for name, f in p.floors.items():
            number = f"{f.value:.0f}" if float(f.value).is_integer() else f"{f.value:g}"
            value = f"{number} {f.unit}" + (f" ({fmt_value(f.value, f.unit)})" if f.unit in ("bytes", "bytes_per_second", "seconds") else "")
            shape = " and ".join(x for x in (f"{f.gpus} GPUs" if f.gpus else "", FABRIC_WORDS[f.fabric] if f.fabric else "") if x)
            out.append(f"| `{name}` | {'at least' if f.bound == 'min' else 'at most'} | {value} | {shape or 'any node'} | {_cell(f.source)} |")
        out.append("")
    if g := p.gpu:
        driver = f"at least {g.driver_min}" if g.driver_min else "any that loads the GPU"
        links = "NVLinks per GPU as the node's own GPUs have them (NVSwitch: its best GPU's count; direct links: most GPUs')" if g.nvlinks_from_node else f"{g.nvlinks} NVLinks per GPU"
        out.append(f"GPU: PCI device ids {', '.join(g.pci_device_ids) or 'any'}; driver {driver} ({_cell(g.driver_source)}); "
                   f"{links}; MIG {'off' if g.whole_gpus else 'allowed'}.")
        out.append("")
    if d := p.drift:
        out.append(f"Drift: WARN where a figure's median over the last {d.recent} runs is over {d.fraction:.0%} under its median over up to "
                   f"{d.earlier} runs before them ({_cell(d.source)}).")
        out.append("")
    return out


def render() -> str:
    lines = [HEAD, *checks_section(), ""]
    for name, path in sorted(profiles.available(None).items()):
        lines += profile_section(profiles.load(path))
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m preflight.outputs.reference docs/reference.md\n")
        return 2
    safefile.write_atomic(Path(argv[0]), render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
