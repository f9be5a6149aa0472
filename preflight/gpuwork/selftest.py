"""`preflight selftest`: the GPU acceptance kit.

Runs every GPU path of preflight for real, each stage as its own `preflight`
child process with a deadline, exactly as a person would type it, and prints
every figure next to its floor with the time each stage took: the NVML
inventory (`detect`), then `run --only X --keep-going` for cuda, nccl,
bandwidth and train, then the whole `run` as the gate runs it. It reads only
what the CLI prints (`detect --json`, `run --json`), never preflight's
internals, so it keeps working as the checks change; and it imports no
pydantic itself, so a broken install shows as a failed stage with the child's
own error line.

On a machine with no NVIDIA GPU the inventory and cuda stages are skipped
with the reason and the rest run on the cpu profile, which exercises the same
launcher, workers and judges on gloo.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

import psutil

from preflight import __version__
from preflight.base import tether
from preflight.gpuwork import processes, scratch
from preflight.base import safefile
from preflight.base.errors import UsageError
from preflight.gpuwork.selftest_report import (
    Outcome, StageResult, judge_inventory, judge_run, last_lines, parse_json, render_stage, render_summary, verdict,
)

STAGES = ("inventory", "cuda", "nccl", "bandwidth", "train", "run")
TITLES = {
    "inventory": "NVML inventory (preflight detect)",
    "cuda": "CUDA init (the cuda check)",
    "nccl": "NCCL (the nccl check)",
    "bandwidth": "HBM, H2D/D2H, P2P, collectives, latency (the bandwidth check)",
    "train": "GEMM, MFU, step time (the train check)",
    "run": "the whole preflight run, as the gate runs it",
}
# On top of a check's own timeout, what a `preflight` child may need: interpreter
# start and NVML detection (seconds), the run lock's default wait (60 s), the
# report. Only a child that hangs outside every check's deadline meets it.
SLACK_SECONDS = 120.0
SMALL_DEADLINE = 90.0  # detect, list, show-profile: NVML is asked in a child with a deadline of its own
DEFAULT_CHECK_TIMEOUT = 180.0  # where `list` did not say (the longest built-in check's)
GRACE_SECONDS = 15.0  # after SIGTERM a run kills its checks' workers and writes its report
MIN_STAGE_SECONDS = 10.0  # less left of --budget than this: the stage is skipped, not started
TOKEN_ENV = "SELFTEST_PREFLIGHT_TOKEN"  # not PREFLIGHT_*: `run` warns of settings it does not know


class Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def gpu_evidence(root: Path = Path("/")) -> str | None:
    """What says this machine has an NVIDIA GPU even where NVML does not answer:
    GPU device nodes, the driver's /proc entries, NVIDIA display/3D controllers on the PCI bus."""
    nodes = sorted(p.name for p in (root / "dev").glob("nvidia[0-9]*"))
    if nodes:
        return "device nodes " + ", ".join("/dev/" + n for n in nodes)
    procs = list((root / "proc/driver/nvidia/gpus").glob("*"))
    if procs:
        return f"{len(procs)} GPU(s) in /proc/driver/nvidia/gpus"
    found = []
    for dev in (root / "sys/bus/pci/devices").glob("*"):
        try:
            vendor, cls = (dev / "vendor").read_text().strip(), (dev / "class").read_text().strip()
        except OSError:
            continue
        if vendor == "0x10de" and cls[:6] in ("0x0300", "0x0302"):  # VGA or 3D controller
            found.append(dev.name)
    return "NVIDIA PCI device(s) " + ", ".join(sorted(found)) if found else None


def run_child(args: list[str], deadline: float, workdir: Path) -> Outcome:
    return run_children([args], deadline, workdir)[0]


@dataclass
class _Running:
    proc: subprocess.Popen
    token: str
    out: Path
    err: Path
    timed_out: bool = False
    seconds: float = 0.0
    left: int = 0


def run_children(many: list[list[str]], deadline: float, workdir: Path) -> list[Outcome]:
    """``python -m preflight ARGS`` for each ARGS, side by side, each in a session of
    its own, all within ``deadline``. On the deadline, or a signal to us, a child's
    group gets SIGTERM, then SIGKILL; then every process carrying its token dies
    too, since workers start sessions of their own."""
    started = time.monotonic()
    runs: list[_Running] = []
    try:
        for args in many:
            token = uuid.uuid4().hex
            out, err = workdir / f"{token}.out", workdir / f"{token}.err"
            with out.open("wb") as o, err.open("wb") as e:
                # cwd is a scratch folder, so `-m preflight` imports the installed
                # package, never a source tree the caller happens to stand in.
                # Tethered: a killed selftest takes its runs, and their ranks, with it.
                proc = tether.popen([sys.executable, "-m", "preflight", *args], stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                                    cwd=workdir, env={**os.environ, TOKEN_ENV: token}, start_new_session=True)
            runs.append(_Running(proc, token, out, err))
        for r in runs:
            try:
                r.proc.wait(timeout=max(0.0, started + deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                r.timed_out = True
            r.seconds = round(time.monotonic() - started, 3)
    finally:
        for r in runs:
            if r.proc.poll() is None:
                _stop_group(r.proc)
            r.left = _sweep(r.token)
    return [Outcome(r.proc.args, r.proc.returncode, r.seconds, r.timed_out, r.out.read_text(errors="replace"),
                    r.err.read_text(errors="replace"), r.left) for r in runs]


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, GRACE_SECONDS), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _sweep(token: str) -> int:
    """SIGKILL every process whose environment carries ``token``; how many there were."""
    found = processes.marked(token, TOKEN_ENV)
    for p in found:
        try:
            p.kill()
        except psutil.Error:
            continue
    return len(found)


@dataclass
class Plan:
    profile: str  # as given to `run`: auto, cpu, or a name
    resolved: str | None  # what `show-profile` resolved it to
    checks: list[str] | None  # the profile's checks; None where show-profile failed
    timeouts: dict[str, float]
    note: str = ""


def plan_for(profile: str, deadline: float, workdir: Path) -> Plan:
    """The profile's checks and each check's timeout, from `show-profile` and `list`."""
    listed, shown = run_children([["list", "--json"], ["show-profile", profile, "--json"]], deadline, workdir)
    try:
        timeouts = {row["name"]: float(row["timeout_seconds"]) for row in json.loads(listed.stdout)}
    except (ValueError, TypeError, KeyError):
        timeouts = {}
    data = parse_json(shown.stdout)
    if data is None:
        said = (last_lines(shown.stderr, 1) or [f"exit {shown.exit_code}"])[0]
        return Plan(profile, None, None, timeouts, f"`preflight show-profile {profile}` failed: {said}")
    timeouts.update({k: float(v) for k, v in (data.get("timeouts") or {}).items()})
    return Plan(profile, data.get("name"), list(data.get("checks") or []), timeouts)


def run_args(stage: str, profile: str) -> list[str]:
    """A check stage's command line, or the whole run's (as the gate runs it: fail-fast).
    --scratch: never the node's configured report or textfile; the report comes on stdout."""
    if stage == "run":
        return ["run", "--profile", profile, "--json", "--scratch"]
    return ["run", "--profile", profile, "--only", stage, "--keep-going", "--json", "--scratch"]


def deadline_of(stage: str, plan: Plan) -> float:
    checks = [stage] if stage != "run" else plan.checks if plan.checks is not None else list(plan.timeouts)
    return sum(plan.timeouts.get(c, DEFAULT_CHECK_TIMEOUT) for c in checks) + SLACK_SECONDS


def check_inputs(stages: list[str] | None, budget: float | None, out: Path | None) -> list[str]:
    """Bad input: one line, exit 2, before anything runs. Returns the stages chosen."""
    chosen = [s.strip() for item in stages or [] for s in item.split(",") if s.strip()]
    if unknown := [s for s in chosen if s not in STAGES]:
        raise UsageError(f"--stage {', '.join(unknown)}: no such stage; choose from {', '.join(STAGES)}")
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise UsageError(f"--budget {budget:g}: give seconds above 0, e.g. 540")
    if out is not None:
        safefile.check(out, f"--out {out}", "selftest.json")
    # The stages' runs start in a folder there, with it as their working directory (what
    # `python -m` imports first): one another user could swap would run their code as root.
    if why := scratch.unsafe_parent(os.environ.get("TMPDIR") or tempfile.gettempdir()):
        raise UsageError(f"{why}; point TMPDIR at a directory of root's (or yours), or a sticky one such as /tmp")
    return [s for s in STAGES if s in chosen] if chosen else list(STAGES)


def _write(out: Path, doc: dict) -> None:
    """Atomically, after every stage: a selftest cut short still leaves what it found."""
    umask = os.umask(0)
    os.umask(umask)
    # As open() would have made it, not the temp file's 0600; never through a planted link.
    safefile.write_atomic(out, json.dumps(doc, indent=2) + "\n", 0o666 & ~umask)


def _torch_version() -> str:
    try:
        return version("torch")
    except PackageNotFoundError:
        return "not installed"


def main(stages: list[str] | None, profile: str | None, out: Path | None, budget: float | None, strict: bool,
         echo: Callable[[str], None] = lambda s: print(s, flush=True)) -> int:
    """Run the stages chosen, print each as it ends, write ``out`` after each; the exit code."""
    chosen = check_inputs(stages, budget, out)
    out = out.absolute() if out else None
    t0 = time.monotonic()
    doc: dict = {"tool": "preflight selftest", "schema_version": 1, "preflight_version": __version__,
                 "python": sys.version.split()[0], "torch": _torch_version(), "hostname": socket.gethostname(),
                 "started_at": datetime.now(timezone.utc).isoformat(), "stages": []}
    results: list[StageResult] = []

    def left() -> float:
        return budget - (time.monotonic() - t0) if budget else math.inf

    def add(r: StageResult) -> None:
        results.append(r)
        doc["stages"] = [asdict(x) for x in results]
        if r.status != "not selected":
            echo(render_stage(r))
        if out:
            _write(out, doc)

    def stop(signum: int, _frame: object) -> None:
        for s in saved:  # one signal stops the stage in flight; more must not cut that cleanup short
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    saved = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    echo(f"preflight selftest: preflight {__version__}, python {doc['python']}, torch {doc['torch']}, "
         f"on {doc['hostname']}; stages {', '.join(chosen)}")
    current = "inventory"
    try:
        with tempfile.TemporaryDirectory(prefix="preflight-selftest-") as tmp:
            o = run_child(["detect", "--json"], min(SMALL_DEADLINE, left()), Path(tmp))
            status, reason, data = judge_inventory(o, gpu_evidence(), profile is not None)
            add(StageResult("inventory", TITLES["inventory"], status, reason, o.command, o.exit_code, o.seconds,
                            SMALL_DEADLINE, o.timed_out, data, last_lines(o.stderr)))
            gpu = status != "SKIP"
            doc["gpu"], doc["profile"] = gpu, profile or ("auto" if gpu else "cpu")
            if not gpu and profile is None:
                echo("no GPU: the check stages run the cpu profile (gloo, CPU tensors) instead of auto\n")
            current = "plan"
            plan = plan_for(doc["profile"], min(SMALL_DEADLINE, left()), Path(tmp))
            doc["plan"] = asdict(plan)
            if plan.note:
                echo(f"note: {plan.note}")
            for current in STAGES[1:]:
                add(_stage(current, chosen, plan, gpu, profile is not None, results[0].reason, left(), Path(tmp)))
    except Stopped as s:
        add(StageResult(current, TITLES.get(current, "the profile's checks and timeouts"), "FAIL", f"selftest interrupted by signal {s.signum}; its child was stopped"))
        return 128 + s.signum
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    code, line = verdict(results, strict)
    doc.update(finished_at=datetime.now(timezone.utc).isoformat(), duration_seconds=round(time.monotonic() - t0, 3),
               exit_code=code, verdict=line)
    if out:
        _write(out, doc)
    echo(render_summary(results) + line)
    return code


def _stage(name: str, chosen: list[str], plan: Plan, gpu: bool, profile_given: bool, no_gpu: str, left: float, tmp: Path) -> StageResult:
    title = TITLES[name] if name != "run" else f"{TITLES['run']} (--profile {plan.profile})"
    if name not in chosen:
        return StageResult(name, title, "not selected")
    if name != "run" and plan.checks is not None and name not in plan.checks:
        why = f"not a check of profile {plan.resolved}"
        if not gpu and not profile_given and name == "cuda":
            why = "needs an NVIDIA GPU; " + no_gpu
        return StageResult(name, title, "SKIP", why)
    own = deadline_of(name, plan)
    deadline = min(own, left)
    if deadline < MIN_STAGE_SECONDS:
        return StageResult(name, title, "SKIP", f"--budget spent ({max(left, 0):.0f} s left)")
    args = run_args(name, plan.profile)
    print(f"selftest: {name}: preflight {' '.join(args)} (deadline {deadline:.0f} s)", file=sys.stderr, flush=True)
    o = run_child(args, deadline, tmp)
    status, reason, report = judge_run(o)
    if o.timed_out and deadline < own:  # stopped by our budget, not by a hang: it did not finish, nothing was found
        status, reason = "SKIP", f"stopped after {o.seconds:.0f} s when --budget ran out (its own deadline: {own:.0f} s)"
    if o.left_behind:  # a run must take every process it started down with it
        status, reason = "FAIL", f"{reason}; {o.left_behind} process(es) it started outlived it (killed by the selftest)"
    return StageResult(name, title, status, reason, o.command, o.exit_code, o.seconds, deadline, o.timed_out,
                       report, last_lines(o.stderr))
