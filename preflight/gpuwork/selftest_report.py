"""What `preflight selftest` makes of its children's output: the judges (pure
functions of what a child printed) and the text a person reads. Only the
report's JSON shape is relied on (check, status, summary, measurements with
value, unit, labels, floor and ceiling), never preflight's models, so a report
from a newer or older preflight still renders, and no pydantic is needed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from preflight.base.units import fmt_seconds, fmt_value


@dataclass
class Outcome:
    """One child process: how it ended and what it printed."""

    command: list[str]
    exit_code: int | None
    seconds: float
    timed_out: bool
    stdout: str
    stderr: str
    left_behind: int = 0  # processes of its tree alive after it ended (killed by the sweep)


@dataclass
class StageResult:
    name: str
    title: str
    status: str  # PASS, WARN (passed with warnings), FAIL, SKIP, or "not selected"
    reason: str = ""
    command: list[str] = field(default_factory=list)
    exit_code: int | None = None
    seconds: float = 0.0
    deadline_seconds: float | None = None
    timed_out: bool = False
    report: dict | None = None  # the run's JSON report; detect's JSON for the inventory
    stderr_tail: list[str] = field(default_factory=list)


def parse_json(text: str) -> dict | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def last_lines(text: str, n: int = 12) -> list[str]:
    return [line for line in text.strip().splitlines() if line.strip()][-n:]


def _said(o: Outcome) -> str:
    """The child's last line on stderr: preflight says why it stopped there."""
    return (last_lines(o.stderr, 1) or [f"exit {o.exit_code}, nothing on stderr"])[0].removeprefix("preflight: error: ")


def _cause(o: Outcome) -> str:
    """Only the cause of preflight's `CAUSE; REMEDY` line: the remedy (install a driver) is not this kit's."""
    return _said(o).split("; ")[0]


# ---- judges ---------------------------------------------------------------------------


def judge_inventory(o: Outcome, evidence: str | None, profile_given: bool) -> tuple[str, str, dict | None]:
    """`detect --json` -> (status, reason, its JSON). SKIP only where nothing says a GPU is here."""
    if o.timed_out:
        return "FAIL", f"`preflight detect` gave no answer in {o.seconds:.0f} s and was killed (a wedged driver?)", None
    data = parse_json(o.stdout)
    gpus = (data or {}).get("gpus") or []
    if not gpus:
        if evidence is None:
            return "SKIP", f"no NVIDIA GPU here ({_cause(o)}; no NVIDIA device node, /proc entry or PCI device)", data
        return "FAIL", f"NVML lists no GPU, yet this machine has {evidence}: {_said(o)}", data
    assert data is not None
    if data.get("lost"):
        lost = ", ".join(f"GPU {g.get('index')} ({g.get('pci_bus_id') or '?'}): {g.get('error')}" for g in data["lost"])
        return "FAIL", f"{len(data['lost'])} GPU(s) lost: {lost}", data
    names = ", ".join(sorted({str(g.get("name")) for g in gpus}))
    found = f"{len(gpus)} GPU(s): {names}; driver {data.get('driver_version')}, CUDA {data.get('cuda_driver_version')}"
    if not data.get("profile") and not profile_given:
        return "FAIL", f"{found}; auto picks no profile ({data.get('why')}); give --profile NAME", data
    return "PASS", found, data


def judge_run(o: Outcome) -> tuple[str, str, dict | None]:
    """`run --json` -> (status, reason, the report). PASS only on a passing verdict and exit 0."""
    report = parse_json(o.stdout)
    if o.timed_out:
        return "FAIL", f"no answer in {o.seconds:.0f} s: killed (it outlived every check's own deadline)", report
    if report is None or not isinstance(report.get("checks"), list):
        return "FAIL", f"exit {o.exit_code}, no JSON report: {_said(o)}", None
    checks = report["checks"]
    if o.exit_code != 0 or report.get("verdict") != "pass":
        bad = [f"{c.get('check')} {c.get('status')}: {c.get('summary')}" for c in checks if c.get("status") in ("FAIL", "ERROR")]
        return "FAIL", f"verdict {report.get('verdict')}, exit {o.exit_code}" + ("; " + "; ".join(bad) if bad else ""), report
    if checks and all(c.get("status") == "SKIP" for c in checks):
        return "SKIP", "; ".join(f"{c.get('check')}: {c.get('summary')}" for c in checks), report
    warned = [f"{c.get('check')}: {c.get('summary')}" for c in checks if c.get("status") == "WARN"]
    if warned:
        return "WARN", "passed with warnings; " + "; ".join(warned), report
    return "PASS", f"verdict pass, exit 0, {len(checks)} check(s)", report


def verdict(results: list[StageResult], strict: bool) -> tuple[int, str]:
    """(exit code, the closing line). A skipped stage fails only under --strict."""
    failed = [r.name for r in results if r.status == "FAIL"]
    skipped = [r for r in results if r.status == "SKIP"]
    if failed or (strict and skipped):
        what = [f"failed: {', '.join(failed)}"] if failed else []
        what += [f"skipped under --strict: {', '.join(r.name for r in skipped)}"] if strict and skipped else []
        return 1, "selftest: FAIL (" + "; ".join(what) + ")"
    if skipped:
        return 0, (f"selftest: PASS for what ran; skipped: {', '.join(r.name for r in skipped)} (see why above), "
                   "so this is no GPU acceptance (--strict fails it)")
    return 0, "selftest: PASS (every stage ran and passed)"


# ---- text -------------------------------------------------------------------------------


def labels_text(labels: dict[str, str]) -> str:
    """`gpu=0 collective=all_reduce`; the UUID is left out where the GPU index says which (the JSON keeps it)."""
    return " ".join(f"{k}={v}" for k, v in labels.items() if not (k == "UUID" and "gpu" in labels)) or "-"


def bound_text(m: dict) -> tuple[str, str]:
    """(the bound, the figure over it): ('floor 2 GB/s', '5.77x floor'); ('-', '') where none."""
    value, unit = m.get("value"), m.get("unit", "")
    for kind in ("floor", "ceiling"):
        bound = m.get(kind)
        if bound is None:
            continue
        ratio = f"{value / bound:.3g}x {kind}" if bound and isinstance(value, (int, float)) else ""
        return f"{kind} {fmt_value(bound, unit)}", ratio
    return "-", ""


def measurement_rows(measurements: list[dict]) -> list[tuple[str, str, str, str, str]]:
    return [
        (m.get("name", "?"), labels_text(m.get("labels") or {}),
         fmt_value(m["value"], m.get("unit", "")) if isinstance(m.get("value"), (int, float)) else str(m.get("value")),
         *bound_text(m))
        for m in measurements
    ]


def table(rows: list[tuple[str, ...]], indent: str = "      ") -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths))).rstrip() for r in rows]


def render_report(report: dict) -> list[str]:
    """Every check of a run: status, time, summary, cause and remedy where it did not pass,
    each measurement against its floor, and the check's own lines (its timings among them)."""
    out = [f"   report: profile {report.get('profile')} ({report.get('profile_chosen_because')}), "
           f"verdict {report.get('verdict')}, exit {report.get('exit_code')}, {fmt_seconds(report.get('duration_seconds') or 0)}; "
           f"versions {', '.join(f'{k} {v}' for k, v in (report.get('versions') or {}).items()) or 'none'}"]
    for c in report.get("checks", []):
        out.append(f"   {c.get('check')}  {c.get('status')}  {fmt_seconds(c.get('duration_seconds') or 0)}  {c.get('summary')}")
        if c.get("status") not in ("PASS", "SKIP"):
            out += [f"      {what}: {c[what]}" for what in ("cause", "remedy") if c.get(what)]
        rows = measurement_rows(c.get("measurements") or [])
        out += table([("measurement", "labels", "value", "bound", "vs bound"), *rows]) if rows else []
        out += [f"      | {line}" for line in c.get("lines") or []]
    return out


def render_inventory(data: dict | None) -> list[str]:
    if not data:
        return []
    out = [f"   driver {data.get('driver_version')}, CUDA {data.get('cuda_driver_version')} (from {data.get('source')})"]
    for g in data.get("gpus") or []:
        memory = f"{g['memory_total_bytes'] / 2**30:.1f} GiB" if g.get("memory_total_bytes") else "memory n/a"
        pcie = g.get("pcie") or {}
        out.append(f"   GPU {g.get('index')}  {g.get('name')}  {g.get('pci_bus_id')}  device {g.get('pci_device_id')}  {memory}  "
                   f"PCIe gen {pcie.get('gen')}/{pcie.get('gen_max')} x{pcie.get('width')}/{pcie.get('width_max')}  "
                   f"NVLinks active {g.get('nvlinks_active')}  {g.get('temperature_c')} C")
    for g in data.get("lost") or []:
        out.append(f"   GPU {g.get('index')}  LOST  {g.get('pci_bus_id')}  {g.get('error')}")
    out.append(f"   profile: {data.get('profile') or 'none'} ({data.get('why')})")
    # What other versions of detect add (the node's shape, how it was learnt) is shown as it comes.
    known = {"driver_version", "cuda_driver_version", "source", "gpus", "lost", "profile", "why"}
    out += [f"   {k}: {json.dumps(v)}" for k, v in data.items() if k not in known]
    return out


def render_stage(r: StageResult) -> str:
    head = f"== {r.name}: {r.title}  {r.status}"
    if r.command:
        head += f"  {fmt_seconds(r.seconds)}" + (f" (deadline {r.deadline_seconds:.0f} s)" if r.deadline_seconds else "")
    out = [head]
    if r.command:
        out.append("   $ preflight " + " ".join(r.command[3:]))
    if r.reason:
        out.append(f"   {r.reason}")
    if r.name == "inventory":
        out += render_inventory(r.report)
    elif r.report:
        out += render_report(r.report)
    if r.status == "FAIL" and r.stderr_tail:
        out += ["   its stderr, last lines:", *(f"   > {line}" for line in r.stderr_tail)]
    return "\n".join(out) + "\n"


def _short(text: str, width: int = 140) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render_summary(results: list[StageResult]) -> str:
    rows = [(r.name, r.status, fmt_seconds(r.seconds) if r.command else "-", _short(r.reason)) for r in results]
    return "\n".join(["== summary", *table([("stage", "status", "time", "why"), *rows], indent="   ")]) + "\n"
