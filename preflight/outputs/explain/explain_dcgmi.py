"""`preflight explain` for a saved `dcgmi diag -r N`: every failed or warned test and
every DCGM warning or error is a finding, in DCGM's own words and naming the GPU.

DCGM already judged; this only says it plainly. A failed test names the GPUs it
failed on; the messages printed under it (DCGM's reason) are findings of their
own, with the severity DCGM's label gives them (Error: fail, Warning: warn,
Info: info), so nothing DCGM said is folded away. preflight has no check that
judges the same facts, so no profile changes the answer.
"""

from __future__ import annotations

from typing import Any

from preflight.base.errors import UsageError
from preflight.checkkit.gpu_health import DRAIN
from preflight.outputs.explain.explained import Explained, Item
from preflight.pipeline.profiles import ResolvedProfile
from preflight.readers.nvidia import dcgmi

KIND, TITLE = "dcgmi-diag", "dcgmi diag"
# DCGM 3's deployment (software) tests, and DCGM 4's "software": a setting on the node, not a GPU fault.
_SOFTWARE = {"Denylist", "Blacklist", "NVML Library", "CUDA Main Library", "CUDA Toolkit Library", "Permissions and OS Blocks",
             "Persistence Mode", "Environment Variables", "Graphics Processes", "software"}
_RESET = {"Page Retirement/Row Remap", "Page Retirement"}
_SEVERITY = {"error": "fail", "warning": "warn", "info": "info"}


def explain(text: str, source: str, profile: ResolvedProfile | None = None) -> Explained:
    try:
        diag = dcgmi.parse(text)
    except UsageError as e:
        raise UsageError(f"{source}: {e}") from None
    found: list[Item] = []
    per_gpu = {r.test for r in diag.results if r.gpu is not None}
    for r in diag.results:
        if r.status not in ("fail", "warn") or (r.gpu is None and not r.all_gpus and r.test in per_gpu):
            continue  # DCGM 4's summary row: its GPU rows say which GPU
        found.append(_result_item(diag, r))
    for m in diag.messages:
        where = f" ({m.test})" if m.test else ""
        whom = f"GPU {m.gpu}" if m.gpu is not None else "the node"
        found.append(Item(severity=_SEVERITY[m.kind], summary=f"DCGM {m.kind} on {whom}{where}: {_first(m.text)}", cause=m.text,
                          fix=None if m.kind == "info" else _fix(m.test, said=True), gpu=f"GPU {m.gpu}" if m.gpu is not None else None))
    skipped = sorted({r.test for r in diag.results if r.status == "skip"})
    if skipped:
        found.append(Item(severity="info", summary=f"DCGM skipped: {', '.join(skipped)}",
                          cause="a skipped test vouches for nothing: the GPU, the run level or a setting ruled it out",
                          fix="run `dcgmi diag -r N -v` to see why, if the test matters here"))
    facts: dict[str, Any] = diag.model_dump(mode="json")
    facts["tests"] = _summary(diag)
    return Explained(kind=KIND, title=TITLE, source=source, findings=found, facts=facts)


def _result_item(diag: dcgmi.DcgmDiag, r: dcgmi.DiagResult) -> Item:
    on = "every GPU" if r.all_gpus else (f"GPU {r.gpu}" if r.gpu is not None else None)
    verb = "failed" if r.status == "fail" else "warned"
    passed = [x.gpu for x in diag.results if x.test == r.test and x.status == "pass" and x.gpu is not None]
    said = [m for m in diag.messages if m.test == r.test and (m.gpu == r.gpu or m.gpu is None or r.all_gpus)]
    cause = f"dcgmi diag's {r.test} test" + (f" ({r.category})" if r.category else "") + f" {verb}" + (f" on {on}" if on else "")
    if passed:
        cause += f"; GPU{'s' if len(passed) > 1 else ''} {', '.join(map(str, passed))} passed it"
    cause += "; DCGM's words on it follow" if said else "; the capture holds no DCGM message for it (run `dcgmi diag -r N -v` for one)"
    return Item(severity="fail" if r.status == "fail" else "warn", summary=f"{r.test} {verb}" + (f" on {on}" if on else ""),
                cause=cause, fix=_fix(r.test), gpu=f"GPU {r.gpu}" if r.gpu is not None else None)


def _fix(test: str | None, said: bool = False) -> str:
    if test in _SOFTWARE:
        return "fix the setting DCGM names on the node (a driver, library, permission or process), then rerun `dcgmi diag -r 1`"
    if test in _RESET:
        return "reset the GPU (`nvidia-smi -r -i N`, with no process on it) or reboot, so the pending retirements or remaps apply; then rerun `dcgmi diag`; " + DRAIN
    return ("do what DCGM's words say, then rerun `dcgmi diag`; if it comes back, " if said else "") + DRAIN


def _first(text: str, most: int = 90) -> str:
    """The message's head, for a one-line summary; the cause holds it whole."""
    return text if len(text) <= most else text[: most - 3].rstrip() + "..."


def _summary(diag: dcgmi.DcgmDiag) -> dict[str, dict[str, Any]]:
    """Per test: its worst status and the GPUs behind each status, as a person asks for it."""
    rank = ["not run", "pass", "skip", "warn", "fail"]
    out: dict[str, dict[str, Any]] = {}
    for r in diag.results:
        t = out.setdefault(r.test, {"category": r.category, "status": r.status, "gpus": {}})
        if rank.index(r.status) > rank.index(t["status"]):
            t["status"] = r.status
        if r.gpu is not None or r.all_gpus:
            t["gpus"].setdefault(r.status, []).append("all" if r.all_gpus else r.gpu)
    return out
