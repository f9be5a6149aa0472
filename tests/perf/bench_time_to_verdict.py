"""Time to a verdict, as ratios taken in one run so the machine's load falls on
both sides alike:

1. the standard level against a bare torchrun (tests/gpu/bare.py: import
   torch, a process group, one all_reduce checked, exit): the least any tool
   that starts ranks can take. Target: within 2.0x. On a GPU node the bare run
   is NCCL over every GPU and preflight runs `--profile auto`; without one, 2
   gloo ranks and `--profile cpu`.
2. the quick level against a bare `python -c pass`, and whether it imported
   torch. Target: under 1.5 s, no torch.
3. where each level's time goes: each check's share, and the ranks' launch
   (torchrun, the torch import and the process group) inside the first check
   that needs ranks.

Rounds alternate (bare, quick, standard, python) N times; medians, min and max
are printed. Every run is `--keep-going --scratch --json` (every check runs;
nothing of the node's own report or textfile is touched), under a lock file in
a temporary directory, in its own session with a deadline (past it, and on
SIGTERM or SIGINT, the run is ended with every process it started, a hung
torchrun's ranks included: tests/perf/timing.py); `--budget` bounds
the whole bench (no round starts that the slowest round so far would not
finish within it). `--out PATH` writes the figures as JSON; `--keep DIR`
leaves the last round's reports and logs there as standard.json, quick.json,
standard.log, quick.log (the GPU acceptance kit, tests/gpu/run.sh, reads them).
A run that gives no verdict (no report) and a bare torchrun that fails are not
timed, and said. Exits 1 when a target is missed, 2 when a case never gave a time.

Run: python tests/perf/bench_time_to_verdict.py [N] [--out PATH] [--keep DIR] [--budget S] [--profile P]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import timing  # noqa: E402

from preflight.gpuwork import launch  # noqa: E402

PY = sys.executable
BARE = Path(__file__).resolve().parents[1] / "gpu" / "bare.py"
CPU_RANKS = 2  # the cpu profile's gloo ranks ([nccl] ranks in cpu.toml)
STANDARD_RATIO, QUICK_SECONDS = 2.0, 1.5
DEADLINE = 300.0  # one child at most, within --budget: a hung run is killed, never waited on


class OutOfTime(Exception):
    pass


def timed(argv: list[str], env: dict[str, str], deadline: float) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of a child in its own session; past ``deadline`` (monotonic) it is
    ended with every process below it (timing.run: a hung torchrun's ranks too)."""
    left = min(DEADLINE, deadline - time.monotonic())
    if left <= 1:
        raise OutOfTime(f"no time left for {' '.join(argv[:5])}")
    ran = timing.run(argv, left, env)
    if ran.killed:
        raise OutOfTime(f"{' '.join(argv[:5])} ran past {left:.0f} s and was killed")
    return ran.seconds, ran.done


def gpus(env: dict[str, str], deadline: float) -> int:
    """CUDA devices torch sees here (0 where it sees none or cannot say)."""
    _, p = timed([PY, "-c", "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"], env, deadline)
    out = p.stdout.strip().splitlines()
    return int(out[-1]) if p.returncode == 0 and out and out[-1].isdigit() else 0


def shares(report: dict) -> tuple[list[tuple[str, float]], float, float | None]:
    """(check, seconds) of a run, its total, and the first launch's start-up
    (torch import and process-group init of the slowest rank in the first stage)."""
    checks = [(c["check"], c["duration_seconds"]) for c in report["checks"]]
    launch = None
    for c in report["checks"]:
        world = c["details"].get("world")
        if world and world.get("stage") == 1 and world.get("launch") == 1:
            reps = [o["report"] for o in c["details"].get("ranks") or [] if o.get("report")]
            launch = max(((x.get("import_seconds") or 0) + (x.get("init_seconds") or 0) for x in reps), default=None)
    return checks, report["duration_seconds"], launch


def share_table(runs: list[tuple[list[tuple[str, float]], float, float | None]]) -> list[dict]:
    """Each check's median seconds over the rounds and its share of the median total."""
    total = statistics.median(t for _, t, _ in runs)
    out = []
    for name in [c for c, _ in runs[0][0]]:
        sec = statistics.median(dict(c)[name] for c, _, _ in runs if name in dict(c))
        out.append({"check": name, "seconds": round(sec, 3), "share": round(sec / total, 4) if total else None})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", nargs="?", type=int, default=5)
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    ap.add_argument("--keep", type=Path, help="leave the last round's reports and logs in this directory")
    ap.add_argument("--budget", type=float, default=3600.0, help="seconds the whole bench may take")
    ap.add_argument("--profile", help="default: auto on a GPU node, cpu without one")
    args = ap.parse_args(argv)
    timing.guard()
    deadline = time.monotonic() + args.budget
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    n = gpus(env, deadline)
    backend, ranks = ("nccl", n) if n else ("gloo", CPU_RANKS)
    profile = args.profile or ("auto" if n else "cpu")
    print(f"bench: {backend}, {ranks} rank(s), profile {profile}, up to {args.rounds} rounds within {args.budget:.0f} s", flush=True)

    times: dict[str, list[float]] = {"bare torchrun": [], "quick": [], "standard": [], "python -c pass": []}
    codes: dict[str, list[int]] = {name: [] for name in times}
    runs: dict[str, list] = {"standard": [], "quick": []}
    cut = None
    with tempfile.TemporaryDirectory(prefix="bench-verdict-") as tmp:
        env["PREFLIGHT_LOCK_FILE"] = str(Path(tmp) / "lock")
        run = [PY, "-m", "preflight", "run", "--profile", profile, "--keep-going", "--scratch", "--json", "-q"]
        cases = {
            # torchrun's own main and static rendezvous, its store on 127.0.0.1 alone on a port it binds
            # (checks/workers/_torchrun.py, as preflight's launches): a bench runs as root on the node,
            # --standalone's c10d rendezvous unpickles what its store holds, and the plain static one
            # listens on every interface.
            "bare torchrun": [PY, str(launch.WORKERS_DIR / "_torchrun.py"), "--nnodes", "1", "--rdzv-backend", "preflight-loopback",
                              "--rdzv-endpoint", "127.0.0.1:0", "--nproc-per-node", str(ranks), str(BARE)],
            # quick before standard: a standard run that hangs until the budget's end still leaves quick's report
            "quick": [*run, "--level", "quick"],
            "standard": [*run, "--level", "standard"],
            "python -c pass": [PY, "-c", "pass"],
        }
        slowest = 0.0
        try:
            for i in range(args.rounds):
                if i and time.monotonic() + slowest > deadline:
                    cut = f"round {i + 1} would not finish within the budget ({slowest:.0f} s a round)"
                    break
                t0, now = time.monotonic(), {}
                for name, argv in cases.items():
                    seconds, p = timed(argv, env, deadline)
                    codes[name].append(p.returncode)
                    if name in runs:
                        if args.keep:  # after every run, so a bench its caller cuts short still leaves the last reports
                            args.keep.mkdir(parents=True, exist_ok=True)
                            (args.keep / f"{name}.json").write_text(p.stdout)
                            (args.keep / f"{name}.log").write_text(p.stderr)
                        try:  # a verdict, pass or fail, is timed; a run that gave none is not
                            runs[name].append(shares(json.loads(p.stdout)))
                        except (ValueError, KeyError, TypeError) as e:
                            print(f"{name}: exit {p.returncode}, no report on stdout ({e}): {p.stderr[-1500:]}", flush=True)
                            continue
                    elif p.returncode != 0:
                        print(f"{name}: exit {p.returncode}, not timed: {p.stderr[-1500:]}", flush=True)
                        continue
                    times[name].append(seconds)
                    now[name] = seconds
                slowest = max(slowest, time.monotonic() - t0)
                print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{k} {now[k]:.2f} s" if k in now else f"{k} failed" for k in cases), flush=True)
            # Whether the quick level imported torch: the same command under -X importtime.
            _, probe = timed([PY, "-X", "importtime", *cases["quick"][1:]], env, deadline)
            quick_torch: bool | None = any(line.rstrip().endswith("| torch") for line in probe.stderr.splitlines())
        except OutOfTime as e:
            cut, quick_torch = str(e), None

    if cut:
        print(f"bench: stopped early: {cut}")
    done = {name: t for name, t in times.items() if t}
    if not {"bare torchrun", "standard", "quick"} <= set(done):
        print("bench: not every case ran once: no figures")
        return 2
    k = min(len(times["bare torchrun"]), len(times["standard"]))
    med = {name: statistics.median(t) for name, t in done.items()}
    print(f"\n{'case':<16} {'median':>8} {'min':>8} {'max':>8}   (seconds, {len(codes['standard'])} interleaved rounds; failed runs not timed)")
    for name, t in done.items():
        print(f"{name:<16} {med[name]:8.2f} {min(t):8.2f} {max(t):8.2f}")
    ratio = med["standard"] / med["bare torchrun"]
    ratios = [s / b for s, b in zip(times["standard"][:k], times["bare torchrun"][:k])]
    print(f"\nstandard / bare torchrun: {ratio:.2f}x (per round {min(ratios):.2f}-{max(ratios):.2f}x; target {STANDARD_RATIO:.1f}x)")
    python = med.get("python -c pass")
    torch_said = {True: "yes", False: "no", None: "not probed"}[quick_torch]
    print(f"quick: {med['quick']:.2f} s" + (f", {med['quick'] / python:.1f}x a bare python" if python else "") +
          f"; torch imported: {torch_said} (target under {QUICK_SECONDS} s, no torch)")

    table = {}
    for level in ("standard", "quick"):
        if not runs[level]:
            continue
        table[level] = share_table(runs[level])
        total = statistics.median(t for _, t, _ in runs[level])
        print(f"\nwhere the {level} run's time goes (median over rounds):")
        for row in table[level]:
            print(f"  {row['check']:<10} {row['seconds']:6.2f} s  {100 * (row['share'] or 0):5.1f}%")
        launches = [x for _, _, x in runs[level] if x is not None]
        if launches:
            sec = statistics.median(launches)
            print(f"  (of which the ranks' launch: torch import + process group {sec:.2f} s, {100 * sec / total:.1f}%, paid once)")
        print(f"  total      {total:6.2f} s (the report's duration; the process adds its start-up)")
    missed = ratio > STANDARD_RATIO or med["quick"] > QUICK_SECONDS or quick_torch is not False
    if args.out:
        doc = {"backend": backend, "ranks": ranks, "profile": profile, "rounds": len(codes["standard"]), "stopped_early": cut,
               "seconds": {name: [round(x, 3) for x in t] for name, t in times.items()},  # the timed runs only
               "exit_codes": codes,  # every run's
               "median_seconds": {name: round(m, 3) for name, m in med.items()},
               "standard_over_bare": round(ratio, 3), "quick_imported_torch": quick_torch, "checks": table,
               "targets": {"standard_over_bare": STANDARD_RATIO, "quick_seconds": QUICK_SECONDS}, "met": not missed}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
