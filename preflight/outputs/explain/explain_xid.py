"""`preflight explain` of a kernel log: its NVIDIA Xid / SXid events (what
`preflight xid --from` lists), each with its meaning and action from the Xid
catalog (readers/kernel/xid_meaning.py), and any PCIe "limited by" notice in the same log,
judged as explain_pcie_notice judges it.

A fatal event fails (the node must not take a job); an application-level one
warns; one that reports a finished recovery (Xid 154 to None) is information.
Each finding carries the action its code's catalog bucket asks (readers/kernel/xid_catalog.py).
The same event repeated on one GPU is one finding with its count.
"""

from __future__ import annotations

from preflight.base import actions
from preflight.base.errors import UsageError
from preflight.outputs.explain import explain_pcie_notice, xid_text
from preflight.outputs.explain.explained import Explained, Item
from preflight.pipeline.profiles import ResolvedProfile
from preflight.readers.kernel import pcie_notice, xid
from preflight.readers.kernel.xid import XidEvent

KIND, TITLE = "kernel-log", "kernel log"
SEVERITY = {"fatal": "fail", "app": "warn", "info": "info"}


def _label(e: XidEvent) -> str:
    if e.kind == "xid":
        return f"Xid {e.code}"
    if e.kind == "sxid":
        return f"SXid {e.code} ({e.name})" if e.name else f"SXid {e.code}"
    return {"fell_off_bus": "fallen off the bus", "init_failed": "failed to initialise"}[e.kind]


def _when(e: XidEvent) -> str:
    return e.time or (f"{e.uptime:.0f} s after boot" if e.uptime is not None else "")


def judge(events: list[XidEvent]) -> list[Item]:
    """Pure: one item per (event, GPU, severity), in the order they first appear."""
    groups: dict[tuple, list[XidEvent]] = {}
    for e in events:
        groups.setdefault((e.kind, e.code, e.pci, e.info.severity, e.info.meaning), []).append(e)
    out = []
    for same in groups.values():
        first, info = same[0], same[0].info
        times = sum(e.count for e in same)
        seen = f" (x{times})" if times > 1 else ""
        when = _when(first)
        lines = ", ".join(str(e.line) for e in same[:6]) + (" ..." if len(same) > 6 else "")
        out.append(Item.acting(
            info.act, severity=SEVERITY[info.severity], gpu=first.pci or first.pci_raw,
            summary=f"{_label(first)}{seen}: {info.meaning}",
            cause=f"the driver logged, at line {lines}{f' ({when})' if when else ''}: {first.message or first.raw.strip()}",
            fix=info.action,
        ))
    return out


def explain(text: str, source: str, profile: ResolvedProfile | None) -> Explained:
    """Refuses, in `xid --from`'s words, a text with no kernel log line."""
    why = xid.not_a_kernel_log(text)
    if why:
        raise UsageError(f"{source}: {why}")
    events = xid.parse(text)
    notices = pcie_notice.parse(text)
    rows = xid_text.rows(events)
    facts: dict = {
        "events": rows,
        "fatal": sum(1 for r in rows if r["severity"] == "fatal"),
        "gpus": sorted({e.pci for e in events if e.pci}),
        "kernel_lines": xid.kernel_lines(text),
    }
    # The log's one action, as a run's is: the highest its events ask.
    if (then := actions.highest([e.info.act for e in events])) is not None:
        facts["action"] = {"action": str(then.action), "domain": str(then.domain), "source": then.source}
    if notices.notices:
        facts["pcie_notices"] = explain_pcie_notice.facts_of(notices)["devices"]
    findings = judge(events) + (explain_pcie_notice.judge(notices) if notices.notices else [])
    return Explained(kind=KIND, title=TITLE, source=source, findings=findings, facts=facts)
