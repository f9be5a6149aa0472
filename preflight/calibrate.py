"""`preflight calibrate`: measure a known-good node and write the site's floors.

Published floors are for the vendor's reference machine; a site's nodes may
be faster or slower by design (another CPU, BIOS, PCIe layout). Calibration
runs the profile's checks through the last measuring one (bandwidth, train)
on a node the operator vouches for, and writes every figure's floor at
``fraction`` of what it measured
(the weakest GPU, pair or rank): a node that later falls more than
1 - fraction below its healthy twin fails. Ceilings (latency) go the other
way: measured / fraction. The file is a config file's ``[floors]`` tables,
each with its unit and a source that says where and when it was measured.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from preflight.check import Result, Status
from preflight.errors import UsageError
from preflight.report import Report

CHECKS = ("bandwidth", "train")  # the checks whose figures become floors
# Parts of each that must pass for its figures to be trusted; the floors part may fail (that is what calibration changes).
# A straggler is a faulty GPU: its slow figures must never become the site's floors.
MUST_PASS = {"bandwidth": ("run", "peer_access", "setup"), "train": ("run", "loss", "agreement", "straggler", "setup")}


class Refused(Exception):
    """The run does not vouch for the node: no floors written. ``str(e)`` says why."""


def check_fraction(fraction: float) -> float:
    if not 0 < fraction <= 1:
        raise UsageError(f"--fraction {fraction:g}: give a number in (0, 1], e.g. 0.9 for floors at 90% of what this node measures")
    return fraction


def checks_up_to(profile_checks: list[str], profile: str) -> list[str]:
    """The profile's checks through its last measuring one: the node must pass what comes first."""
    present = [c for c in profile_checks if c in CHECKS]
    if not present:
        raise UsageError(f"profile {profile} runs none of {', '.join(CHECKS)} ({', '.join(profile_checks)}): there is nothing to calibrate")
    return profile_checks[: profile_checks.index(present[-1]) + 1]


def vouch(report: Report) -> list[Result]:
    """The measuring checks' results, if the run shows a healthy node whose figures can be trusted."""
    for r in report.checks:
        if r.check not in CHECKS and not r.status.ok:
            raise Refused(f"check {r.check} {r.status.value}: {r.summary}; calibrate only on a node that passes every other check")
    measured = [r for r in report.checks if r.check in CHECKS]
    if not measured:
        raise Refused(f"none of {', '.join(CHECKS)} ran")
    for result in measured:
        if result.status in (Status.SKIP, Status.ERROR):
            raise Refused(f"the {result.check} check {result.status.value}: {result.summary}")
        parts = result.details.get("parts") or {}
        for part in MUST_PASS[result.check]:
            if parts.get(part, "PASS") != "PASS":
                raise Refused(f"the {result.check} check's {part} part is {parts[part]}: {result.cause or result.summary}; its figures cannot become floors")
        if result.details.get("full_node") is False:
            raise Refused(f"the {result.check} check ran fewer ranks than the node has (--nproc-per-node): whole-node floors from it would not fit a whole-node run")
        if not result.details.get("figures"):
            raise Refused(f"the {result.check} check measured no figure")
    return measured


def floors(results: list[Result], fraction: float, bounds: dict[str, tuple[str, str]]) -> dict[str, dict]:
    """Floor name -> {value, unit, bound, measured, where}: the weakest figure of each
    name, times ``fraction`` (a floor) or divided by it (a ceiling). Pure, for tests."""
    out: dict[str, dict] = {}
    groups: dict[str, list[dict]] = {}
    for result in results:
        for fig in result.details["figures"]:
            groups.setdefault(fig.get("floor") or fig["name"], []).append(fig)
    for name, group in groups.items():
        if name not in bounds:
            continue  # information only (the CUDA graph latency, model FLOP/s)
        unit, bound = bounds[name]
        if bound == "max":
            weakest = max(group, key=lambda g: g["value"])
            value = weakest["value"] / fraction
        else:
            weakest = min(group, key=lambda g: g["value"])
            value = weakest["value"] * fraction
        out[name] = {"value": value, "unit": unit, "bound": bound, "measured": weakest["value"], "where": weakest["where"], "count": len(group)}
    return out


def render(found: dict[str, dict], fraction: float, host: str, profile: str, when: datetime) -> str:
    """The floors as a config file (TOML): load it with --config, or merge it into /etc/preflight/config.toml."""
    from preflight.units import fmt_value

    stamp = when.strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Site floors from `preflight calibrate` on {host}, profile {profile}, {stamp}:",
        f"# {fraction:g} x the weakest figure this node measured (ceilings: measured / {fraction:g}).",
        "# Use: preflight run --config THIS_FILE, or copy the [floors] tables into /etc/preflight/config.toml.",
        "",
    ]
    for name, f in sorted(found.items()):
        how = f"/ {fraction:g}" if f["bound"] == "max" else f"x {fraction:g}"
        source = f"preflight calibrate on {host} {stamp}: {fmt_value(f['measured'], f['unit'])} {how} ({f['where']}, weakest of {f['count']})"
        lines += [
            f"[floors.{name}]",
            f"value = {f['value']:.6g}",
            f'unit = "{f["unit"]}"',
            *([f'bound = "{f["bound"]}"'] if f["bound"] == "max" else []),
            f"source = {_toml_string(source)}",
            "",
        ]
    return "\n".join(lines)


def _toml_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_output(path: Path, force: bool) -> Path:
    """Refuse before measuring anything: a file we would overwrite, or a directory we cannot write."""
    if path.exists() and not force:
        raise UsageError(f"--output {path}: already exists; pass --force to replace it, or choose another file")
    if path.is_dir():
        raise UsageError(f"--output {path}: is a directory; name a file, e.g. {path / 'floors.toml'}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"--output {path}: directory {parent} does not exist; create it first")
    import os

    if not os.access(parent, os.W_OK):
        raise UsageError(f"--output {path}: directory {parent} is not writable")
    return path
