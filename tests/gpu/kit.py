"""The acceptance kit's helpers for run.sh, standard library only (the GPU image's
python, before or without preflight's own dependencies):

    python3 tests/gpu/kit.py site-profile SRC.toml DEST.toml --burnin 45 --memtest 30
    python3 tests/gpu/kit.py summary OUT

`site-profile` copies a profile with its `[burnin]` and `[memtest]` `seconds`
shortened: a site profile of the same name replaces the built-in one
(PREFLIGHT_PROFILES_DIR), which is how a site changes those durations.

`summary` reads what run.sh left in OUT (quick.json, standard.json, full.json,
generic.json (the standard level under the generic profile): preflight's reports; reference.json: tests/gpu/reference.py's plain loop;
steps.tsv: each step's budget, seconds and exit code) and prints, and writes
to OUT/acceptance.json: each step's time, the bare torchrun beside the quick
and standard levels (verdict.json, the verdict step's bench, where there is
one: its rounds' walls and each check's share), preflight's figures beside the plain loop's as ratios,
and the acceptance: PASS at every level with no WARN, else every WARN, FAIL
and ERROR with its summary. Exit 0 on acceptance, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

LEVELS = (("quick", "quick.json"), ("standard", "standard.json"), ("full (burnin, memtest)", "full.json"),
          ("standard, profile generic", "generic.json"))
GENERIC = "standard, profile generic"
# preflight's figure (check, measurement) beside the plain loop's key in reference.json
# and whether the two measure the same thing (then they should agree within AGREE).
BESIDE = (
    ("bandwidth", "hbm_copy_bandwidth", "d2d_copy_rw_Bps", "HBM copy (read + write)", True),
    ("bandwidth", "h2d_bandwidth", "h2d_Bps", "H2D pinned", True),
    ("bandwidth", "d2h_bandwidth", "d2h_Bps", "D2H pinned", True),
    ("train", "gemm_throughput", "gemm_bf16_8192_Fps", "train GEMM / sustained randn loop", True),
    ("train", "gemm_throughput", "gemm_bf16_8192_first_Fps", "train GEMM / first burst of a short loop", False),
    ("burnin", "burnin_gemm_throughput", "gemm_bf16_8192_uniform12_Fps", "burn-in GEMM / sustained [1, 2) loop", True),
    ("burnin", "burnin_gemm_throughput", "gemm_bf16_8192_Fps", "burn-in GEMM / sustained randn loop", False),
)
AGREE = 0.05  # like for like, a figure within this fraction of the plain loop's agrees


def site_profile(src: Path, dest: Path, seconds: dict[str, float]) -> None:
    """``src`` with ``seconds`` set in the tables named, every other line as it was."""
    table, done, lines = None, set(), []
    for line in src.read_text().splitlines(keepends=True):
        if m := re.match(r"\s*\[([^\]]+)\]", line):
            table = m.group(1).strip()
        elif table in seconds and re.match(r"\s*seconds\s*=", line):
            lines.append(f"# site profile (tests/gpu/run.sh): shortened for the acceptance kit, was: {line.strip()}\n")
            line = f"seconds = {seconds[table]:g}\n"
            done.add(table)
        lines.append(line)
    if missing := sorted(set(seconds) - done):
        raise SystemExit(f"kit.py: {src} has no seconds in [{'], ['.join(missing)}]")
    dest.write_text("".join(lines))


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _steps(out: Path) -> dict[str, dict]:
    steps = {}
    try:
        for row in (out / "steps.tsv").read_text().splitlines():
            name, budget, seconds, rc = row.split("\t")
            steps[name] = {"budget": float(budget), "seconds": float(seconds), "rc": int(rc)}
    except (OSError, ValueError):
        pass
    return steps


def _figure(report: dict | None, check: str, name: str) -> float | None:
    """The weakest GPU's value: the one a floor would judge."""
    values = [m["value"] for c in (report or {}).get("checks", []) if c.get("check") == check
              for m in c.get("measurements", []) if m.get("name") == name and isinstance(m.get("value"), (int, float))]
    return min(values) if values else None


def _traces(report: dict) -> dict:
    """The burn-in's NVML traces per GPU (clocks, power, temperature), as its check wrote them."""
    for c in report.get("checks", []):
        if c.get("check") == "burnin":
            return (c.get("details") or {}).get("traces") or {}
    return {}


def _fmt(value: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value:.3g} "


def summary(out: Path) -> tuple[dict, list[str]]:
    reports = {level: _load(out / name) for level, name in LEVELS}
    reference = _load(out / "reference.json")
    steps = _steps(out)
    lines, doc = [], {"steps": steps, "levels": {}, "figures": [], "findings": []}

    runs = {n: s for n, s in steps.items() if re.fullmatch(r"torchrun\d+", n)}  # inside the torchrun step, timed on their own
    lines.append("== steps (budget, seconds, exit)")
    for name, s in steps.items():
        if name not in runs:
            lines.append(f"  {name:<12} {s['budget']:>5.0f} s budget  {s['seconds']:>7.1f} s  exit {s['rc']}")
    spent = sum(s["seconds"] for n, s in steps.items() if n not in runs)
    lines.append(f"  total budget {sum(s['budget'] for s in steps.values()):.0f} s, spent {spent:.1f} s")

    lines.append("== time to a verdict beside a bare torchrun (torch import, NCCL group, one all_reduce)")
    bench = _load(out / "verdict.json")  # the verdict step (tests/perf/bench_time_to_verdict.py); older kits timed each in its own step
    walls = {key: steps.get(key, {}).get("seconds") for key in ("quick", "standard", "full", "generic")}
    if bench:
        doc["time_to_verdict"] = bench
        secs = bench.get("seconds") or {}  # only the runs that succeeded (a bare torchrun) or gave a verdict (a level)
        bare = list(secs.get("bare torchrun") or [])
        for key in ("quick", "standard"):
            if secs.get(key):
                walls[key] = statistics.median(secs[key])
    else:
        bare = [s["seconds"] for s in runs.values() if s["rc"] == 0]
    doc["bare_torchrun_seconds"] = bare
    lines.append(f"  bare torchrun: {', '.join(f'{x:.1f} s' for x in bare) or 'no run succeeded'}")
    for (level, _), key in zip(LEVELS, ("quick", "standard", "full", "generic"), strict=True):
        r, wall = reports[level], walls[key]
        took = r.get("duration_seconds") if r else None
        if wall is not None or took is not None:
            said = [f"{wall:.1f} s wall" + (f" ({wall / min(bare):.2f}x the bare torchrun)" if bare else "")] if wall is not None else []
            said += [f"{took:.1f} s of checks"] if took is not None else []
            lines.append(f"  {level}: {', '.join(said)}")
    for level, rows in ((bench or {}).get("checks") or {}).items():
        lines.append(f"  {level}, each check's share (median of {bench.get('rounds')} rounds): "
                     + ", ".join(f"{row['check']} {row['seconds']:.1f} s ({100 * (row['share'] or 0):.0f}%)" for row in rows))

    lines.append("== preflight's figures beside the plain loop's (tests/gpu/reference.py)")
    if reference:
        lines.append(f"  the plain loop on {reference.get('device')}, torch {reference.get('torch')}: {json.dumps(reference.get('method', 'method not recorded'))}")
    for check, name, key, words, alike in BESIDE:
        level = "full (burnin, memtest)" if check == "burnin" else "standard"
        mine, theirs = _figure(reports[level], check, name), (reference or {}).get(key)
        row = {"what": words, "preflight": mine, "reference": theirs, "ratio": mine / theirs if mine and theirs else None, "like_for_like": alike}
        doc["figures"].append(row)
        if mine is None or theirs is None:
            lines.append(f"  {words}: {'preflight gave no figure' if mine is None else 'the plain loop gave no figure'}")
            continue
        said = ("agrees" if abs(row["ratio"] - 1) <= AGREE else f"DISAGREES (beyond {AGREE:.0%})") if alike else "not like for like"
        lines.append(f"  {words}: {_fmt(mine)} / {_fmt(theirs)} = {row['ratio']:.3f}, {said}")
    for gpu, t in ((reports["full (burnin, memtest)"] or {}).get("checks") and _traces(reports["full (burnin, memtest)"]) or {}).items():
        lines.append(f"  burn-in {t.get('gpu', gpu)}: SM clock {t.get('clock_min_mhz')}-{t.get('clock_median_mhz')} MHz (min-median, top {t.get('clock_max_mhz')}), "
                     f"{t.get('power_median_w')} W median, {t.get('temperature_max_c')} C max")

    lines.append("== acceptance: PASS at every level, no WARN")
    ok = True
    for level, _ in LEVELS:
        r = reports[level]
        if r is None:
            ok = False
            doc["levels"][level] = None
            lines.append(f"  {level}: no report")
            continue
        doc["levels"][level] = r.get("verdict")
        bad = [c for c in r.get("checks", []) if c.get("status") in ("WARN", "FAIL", "ERROR")]
        ran_as = level != GENERIC or r.get("profile") == "generic"  # a report of another profile proves nothing of generic
        ok = ok and ran_as and r.get("verdict") == "pass" and not bad
        lines.append(f"  {level}: verdict {r.get('verdict')}, {len(bad)} WARN/FAIL/ERROR"
                     + ("" if ran_as else f", but it ran under profile {r.get('profile')!r}"))
        for c in bad:
            doc["findings"].append({"level": level, "check": c["check"], "status": c["status"], "summary": c.get("summary")})
            lines.append(f"    {c['status']} {c['check']}: {c.get('summary')}")
    pytest = steps.get("pytest")
    if pytest is not None:
        lines.append(f"  pytest -m gpu: exit {pytest['rc']}" + (" (timed out)" if pytest["rc"] in (124, 137) else ""))
    doc["accepted"] = ok
    lines.append("ACCEPTED: PASS at every level with no WARN" if ok else "NOT ACCEPTED: see the findings above")
    return doc, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("site-profile")
    s.add_argument("src", type=Path)
    s.add_argument("dest", type=Path)
    s.add_argument("--burnin", type=float, required=True)
    s.add_argument("--memtest", type=float, required=True)
    m = sub.add_parser("summary")
    m.add_argument("out", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "site-profile":
        site_profile(args.src, args.dest, {"burnin": args.burnin, "memtest": args.memtest})
        return 0
    doc, lines = summary(args.out)
    print("\n".join(lines))
    (args.out / "acceptance.json").write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if doc["accepted"] else 1


if __name__ == "__main__":
    sys.exit(main())
