"""`preflight calibrate`: measure a known-good node and write the site's floors.

Published floors are for the vendor's reference machine; a site's nodes may
be faster or slower by design (another CPU, BIOS, PCIe layout). Calibration
runs the profile's checks through the last measuring one (bandwidth, train)
on a node the operator vouches for, then the measuring checks again, N runs
in all, and writes every figure's floor at ``fraction`` of the weakest run's
weakest GPU, pair or rank: a node that later falls more than 1 - fraction
below its healthy twin fails. Ceilings (latency) go the other way: the
slowest / fraction. Where a figure's runs range wider than that room (the
strongest over the weakest past 1 / fraction) the node is too noisy to
calibrate and nothing is written. The file is a config
file's ``[floors]`` tables, each with its unit and a source that keeps every
run's figure and says where and when it was measured.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from preflight.pipeline import floor_bounds, plan as pipeline, registry
from preflight.pipeline.check import Result
from preflight.base import safefile
from preflight.base.findings import Status
from preflight.base.errors import UsageError
from preflight.base.signals import interrupting
from preflight.pipeline import lock
from preflight.pipeline.lock import run_lock
from preflight.pipeline.report import Report
from preflight.pipeline.shape import NodeShape
from preflight.readers.nvidia import nvml

if TYPE_CHECKING:
    from preflight.outputs.exporters.console import Console
    from preflight.pipeline.settings import Settings

CHECKS = ("bandwidth", "train")  # the checks whose figures become floors
# Parts of each that must pass for its figures to be trusted; the floors part may fail (that is what calibration changes).
# A straggler is a faulty GPU: its slow figures must never become the site's floors.
MUST_PASS = {"bandwidth": ("run", "peer_access", "setup"), "train": ("run", "loss", "agreement", "straggler", "setup")}


# Two runs at least: one run's figures cannot show how much the node varies, and a
# single noisy run once wrote floors the same node failed right after.
MIN_REPEATS = 2
# Each run is the profile's checks through train (minutes on an 8-GPU node); past
# twenty, more runs hardly move the weakest figure and an hour is gone.
MAX_REPEATS = 20


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


def weakest(results: list[Result], bounds: dict[str, tuple[str, str]]) -> dict[str, dict]:
    """One run's weakest figure of each floor name (the slowest GPU, pair or rank):
    name -> {value, unit, bound, where, count}. Pure, for tests."""
    out: dict[str, dict] = {}
    groups: dict[str, list[dict]] = {}
    for result in results:
        for fig in result.details["figures"]:
            groups.setdefault(fig.get("floor") or fig["name"], []).append(fig)
    for name, group in groups.items():
        if name not in bounds:
            continue  # information only (the CUDA graph latency, model FLOP/s)
        unit, bound = bounds[name]
        pick = max if bound == "max" else min
        worst = pick(group, key=lambda g: g["value"])
        out[name] = {"value": worst["value"], "unit": unit, "bound": bound, "where": worst["where"], "count": len(group)}
    return out


def widest(fraction: float) -> float:
    """How far apart a figure's runs may be, as the strongest over the weakest: 1 / fraction
    (1.11x at the default 0.9, 4x at 0.25).

    Why that number: floors sit at fraction x the weakest run and ceilings at the slowest
    / fraction, a factor 1 / fraction of room either way. Runs that already range wider
    than that room show a node that can move by more than it on its very next run, and
    fail floors made from them: the false alarm calibration must not build in (one noisy
    run once wrote floors the same node failed right after). A fixed bound would refuse
    every noisy but healthy site that asks for generous floors (a low --fraction), or let
    through a range a tight fraction cannot absorb."""
    return 1 / fraction


def floors(runs: list[list[Result]], fraction: float, bounds: dict[str, tuple[str, str]]) -> dict[str, dict]:
    """Floor name -> {value, unit, bound, measured, where, run, runs, count, spread}: the
    weakest of every run's weakest figure, times ``fraction`` (a floor) or divided by it
    (a ceiling); ``runs`` keeps each run's figure for the file's source line.
    Refused where a figure is missing from a run or its runs range wider than ``widest``. Pure, for tests."""
    per_run = [weakest(results, bounds) for results in runs]
    out: dict[str, dict] = {}
    for name in sorted({n for run in per_run for n in run}):
        missing = [i + 1 for i, run in enumerate(per_run) if name not in run]
        if missing:
            raise Refused(f"{name} was measured in {len(runs) - len(missing)} of {len(runs)} runs (not in run {', '.join(map(str, missing))}): floors need it in every run")
        seen = [run[name] for run in per_run]
        values = [s["value"] for s in seen]
        first = seen[0]
        i = values.index(max(values) if first["bound"] == "max" else min(values))
        value = values[i] / fraction if first["bound"] == "max" else values[i] * fraction
        out[name] = {"value": value, "unit": first["unit"], "bound": first["bound"], "measured": values[i], "where": seen[i]["where"], "run": i + 1,
                     "runs": values, "count": seen[i]["count"], "spread": spread(values)}
    room = widest(fraction)
    wide = sorted((f for f in out.items() if f[1]["spread"] > room), key=lambda f: -f[1]["spread"])
    if wide:
        name, f = wide[0]
        others = "; also " + ", ".join(f"{n} {g['spread']:.2f}x" for n, g in wide[1:]) if len(wide) > 1 else ""
        numbers, unit = _values(f["runs"], f["unit"])
        raise Refused(f"{name} ranged {f['spread']:.2f}x across {len(runs)} runs ({numbers} {unit}: the strongest over the weakest), "
                      f"wider than the {room:.2f}x room floors at {fraction:g} x the weakest leave{others}: this node's next run could fall outside them; "
                      "calibrate while nothing else runs on the node, or give a lower --fraction")
    return out


def unusable(found: dict[str, dict], sane: dict[str, floor_bounds.Sane], fraction: float) -> str | None:
    """Why these floors must not be written: one that every later run would refuse, as judging
    nothing (pipeline/floor_bounds.py), would turn every run on the node into exit 2. Pure."""
    for name, f in found.items():
        if why := floor_bounds.problem(f["value"], f["unit"], f["bound"], sane.get(name)):
            return (f"{name} {why.removeprefix('= ')} (this node measured {f['measured']:g} {f['unit']}, x {fraction:g}); "
                    "every run would refuse such a floor: calibrate on a node that does the work, or give a higher --fraction")
    return None


def spread(values: list[float]) -> float:
    """The strongest run over the weakest (max / min; 1.0 when all agree)."""
    low = min(values)
    return max(values) / low if low > 0 else float("inf")


# How each unit's figures are listed side by side in a source line: one scale for all.
_SCALES = {
    "bytes_per_second": ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1, "B/s")),
    "seconds": ((1, "s"), (1e-3, "ms"), (1e-6, "us")),
    "flops_per_second": ((1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1, "FLOP/s")),
    "tokens_per_second": ((1, "tokens/s"),),
    "bytes": ((2**30, "GiB"), (2**20, "MiB"), (1, "B")),
}


def _values(values: list[float], unit: str) -> tuple[str, str]:
    """[412e9, 418e9, 409e9] -> ('412, 418, 409', 'GB/s'): one scale for all, the largest's."""
    scales = _SCALES.get(unit, ((1, "" if unit == "ratio" else unit),))
    scale, name = next(((s, n) for s, n in scales if max(values) >= s), scales[-1])
    return ", ".join(f"{v / scale:.3g}" for v in values), name


def render(found: dict[str, dict], fraction: float, host: str, profile: str, when: datetime,
           shape: NodeShape | None = None, whole_node: tuple[str, ...] = ()) -> str:
    """The floors as a config file (TOML): load it with --config, or merge it into /etc/preflight/config.toml.
    A whole-node figure's floor says the shape it was measured on (``gpus``, ``fabric``), so it judges
    only nodes of that shape: a 4-GPU slice of the fleet is not held to an 8-GPU node's busbw."""
    stamp = when.strftime("%Y-%m-%d %H:%M UTC")
    n = len(next(iter(found.values()))["runs"]) if found else 0
    lines = [
        f"# Site floors from `preflight calibrate` on {host}, profile {profile}, {stamp}:",
        f"# {fraction:g} x the weakest figure of {n} runs on this node (ceilings: the slowest / {fraction:g}).",
        "# Use: preflight run --config THIS_FILE, or copy the [floors] tables into /etc/preflight/config.toml.",
        "",
    ]
    for name, f in sorted(found.items()):
        numbers, unit = _values(f["runs"], f["unit"])
        how = f"max({numbers}) {unit} / {fraction:g}" if f["bound"] == "max" else f"{fraction:g} x min({numbers}) {unit}"
        source = (f"preflight calibrate on {host} {stamp}: {how} over {len(f['runs'])} runs, within {f['spread']:.2f}x of each other "
                  f"(weakest: run {f['run']}, {f['where']}" + (f", weakest of {f['count']})" if f["count"] > 1 else ")"))
        lines += [
            f"[floors.{name}]",
            f"value = {f['value']:.6g}",
            f'unit = "{f["unit"]}"',
            *([f'bound = "{f["bound"]}"'] if f["bound"] == "max" else []),
            *(_shape_keys(shape) if name in whole_node else []),
            f"source = {_toml_string(source)}",
            "",
        ]
    return "\n".join(lines)


def _shape_keys(shape: NodeShape | None) -> list[str]:
    if shape is None:  # no GPU (cpu): a whole-node floor judges a run over the profile's ranks
        return []
    return [f"gpus = {shape.gpus}"] + ([f'fabric = "{shape.fabric}"'] if shape.fabric in ("nvswitch", "nvlink", "pcie") else [])


def _toml_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_repeats(repeats: int) -> int:
    if not MIN_REPEATS <= repeats <= MAX_REPEATS:
        raise UsageError(f"--repeats {repeats}: give a whole number of runs from {MIN_REPEATS} to {MAX_REPEATS}, e.g. 3 (floors from the weakest run, refused if the runs disagree)")
    return repeats


def check_output(path: Path, force: bool) -> Path:
    """Refuse before measuring anything: a file we would overwrite, a directory we
    cannot write, a link another user could have planted on the way (base/safefile.py)."""
    if (path.exists() or path.is_symlink()) and not force and not path.is_dir():
        raise UsageError(f"--output {path}: already exists; pass --force to replace it, or choose another file")
    return safefile.check(path, f"--output {path}", "floors.toml")


LEVEL_BECAUSE = "the boot gate's level, which calibrate measures whatever the config asks for"


def run(s: Settings, output: Path, fraction: float, repeats: int, console: Console) -> int:
    """Measure this node ``repeats`` times and write its floors to ``output``: the exit code.
    The inputs were checked first (check_fraction, check_repeats, check_output)."""
    runs = []
    with interrupting():  # the runner stops the running check's workers; no floors are written then
        pipeline.check_python_trusted(s)  # every run below starts it, as root: no other user's
        resolved = pipeline.resolve_profile(s)
        s.keep_going = False
        # Floors come from the boot gate's checks as the gate runs them, whatever level the config asks for.
        s.level, s.budget = "standard", None
        s.only = checks_up_to(resolved.checks, resolved.name)
        other_run = lock.held(s.lock_file) is not False  # before the plan reads NVML: as gate.run
        # The level is calibrate's own choice, not one the person asked for: the plan says so.
        first = dataclasses.replace(pipeline.plan(s), level_chosen_because=LEVEL_BECAUSE)
        # The checks before the measuring ones vouch for the node once; the figures need every run.
        s.only = [c for c in s.only if c in CHECKS]
        again = dataclasses.replace(pipeline.plan(s), level_chosen_because=LEVEL_BECAUSE)
        # One lock over every run: a recheck timer's run in between would disturb the figures.
        def waiting(who: str) -> None:
            if first.inventory:  # NVML's facts of a node another run was using: read again once it is done
                first.inventory.forget()
            console.note(f"waiting for {who} to release {s.lock_file}")

        with run_lock(s.lock_file, s.lock_timeout, waiting):
            if other_run and first.inventory:
                first.inventory.forget()
            for i in range(repeats):
                console.note(f"calibrate: run {i + 1} of {repeats}")
                # Each run judges the node as NVML sees it then: one inventory per run, as a gate's.
                the_plan = first if i == 0 else dataclasses.replace(again, started_at=datetime.now(timezone.utc), inventory=nvml.Shared(s.nvml_fake))
                result = pipeline.execute(the_plan, s, console)
                if result.interrupted_by_signal:
                    console.error(f"no floors written: stopped by signal {result.interrupted_by_signal} in run {i + 1} of {repeats}")
                    return result.exit_code
                try:
                    runs.append(vouch(result))
                except Refused as e:
                    console.error(f"no floors written: run {i + 1} of {repeats}: {e}")
                    return 1
    bounds = {name: ub for r in runs[0] for name, ub in registry.load(r.check).floor_units.items()}
    try:
        found = floors(runs, fraction, bounds)
    except Refused as e:
        console.error(f"no floors written: {e}")
        return 1
    # A floor every later run would refuse (floor_bounds: one that judges nothing) is not written:
    # the file would turn every run on the node into exit 2.
    if why := unusable(found, {name: b for r in runs[0] for name, b in registry.load(r.check).floor_sane.items()}, fraction):
        console.error(f"no floors written: {why}")
        return 1
    whole_node = tuple(name for r in runs[0] for name in registry.load(r.check).whole_node)
    safefile.write_atomic(output, render(found, fraction, result.hostname, resolved.name, result.finished_at, result.shape, whole_node))
    console.line(f"wrote {len(found)} floors to {output} ({fraction:g} x this node's weakest figures over {repeats} runs); use it with --config {output}")
    return 0
