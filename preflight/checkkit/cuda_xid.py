"""The cuda check's judge of the Xids the kernel logged since boot (checks/cuda.py).

One finding per (kind, code, GPU), with its event's catalog action; where the
judge knows better than the catalog (Xid 63 after NVML says the remap is
active, a log read through syslog(2) that another user may have written to, an
event that only a reboot clears from a since-boot read) the action is said so.
A job's own Xids (``the_jobs``) are no finding of the node: ``job_xids`` says
them for the details and the lines. Nor is an event on a GPU not given to this
run (a pod's or a job's share of the node, ``NodeShape.not_given``): the kernel
log is the host's, so another tenant's GPU's Xids are in it, and the run that
holds that GPU fails on them; ``elsewhere_xids`` says them. checkkit/burnin_xid.py
judges the Xids logged during a burn-in.
"""

from __future__ import annotations

from preflight.base.actions import Action, Domain, Next
from preflight.base.findings import Finding, Status
from preflight.readers.kernel import xid, xid_meaning
from preflight.readers.nvidia import nvml_facts
from preflight.readers.nvidia.nvml_facts import Gpu, Inventory

FAIL, WARN = Status.FAIL, Status.WARN


# Xids that only follow another error: 45 is the catalog's "Not Solo: IGNORE (follow the other
# Xid)", 43 the channel reset that ends the process which hit the error ("act on the Xid logged
# just before it", xid_meaning.FOLLOW). A job's own 13 or 31 is followed by both once it is cancelled.
FOLLOWERS = (43, 45)


def the_jobs(events: list[xid.XidEvent]) -> list[xid.XidEvent]:
    """The events of ``events`` that are a job's own, not the node's: an Xid whose catalog action
    is the job's (RESTART_APP: fix-job, in the job's domain: "RESET_GPU or RESTART_BM is not deemed
    necessary"), and an Xid 43 or 45 that follows one of those on the same GPU from the same
    process (where both lines print a pid). They stay in the kernel log until a reboot, so a node
    judged by them would warn on every run after one job's bad address."""
    out: list[xid.XidEvent] = []
    jobs: list[xid.XidEvent] = []
    for e in events:
        if e.kind != "xid":
            continue
        if e.info.act.domain == Domain.JOB:
            out.append(e)
            jobs.append(e)
        elif e.code in FOLLOWERS and any(j.pci == e.pci and (j.pid is None or e.pid is None or j.pid == e.pid) for j in jobs):
            out.append(e)
    return out


def _groups(events: list[xid.XidEvent]) -> dict[tuple[str, int | None, str | None], list[xid.XidEvent]]:
    """Events by (kind, code, GPU), in the log's order."""
    groups: dict[tuple[str, int | None, str | None], list[xid.XidEvent]] = {}
    for e in events:
        groups.setdefault((e.kind, e.code, e.pci), []).append(e)
    return groups


def _worst(code: int | None, group: list[xid.XidEvent]) -> xid_meaning.XidInfo:
    """The meaning a group of events is judged by: its worst, but for Xid 154, which announces
    the recovery action now needed, its last."""
    rank = {"info": 0, "app": 1, "fatal": 2}
    return group[-1].info if code == 154 else max((e.info for e in group), key=lambda i: rank[i.severity])


def _times(group: list[xid.XidEvent]) -> str:
    """' (3 times since boot)' where a group's events came more than once, else ''."""
    n = sum(e.count for e in group)
    return f" ({n} times since boot)" if n > 1 else ""


def _named(kind: str, code: int | None, pci: str | None, inv: Inventory) -> tuple[str, str, Gpu | None]:
    """(label, GPU) as a finding names an event: "Xid 13", "GPU 0 (0000:1b:00)"."""
    g = next((g for g in inv.gpus if nvml_facts.slot(g.pci_bus_id) == pci), None)  # kernel lines print "0000:10:1c"
    gpu = f"GPU {g.index} ({pci})" if g else (pci or "an unknown GPU")
    return {"xid": f"Xid {code}", "sxid": f"SXid {code}"}.get(kind, kind.replace("_", " ")), gpu, g


def _elsewhere(events: list[xid.XidEvent], not_given: set[str]) -> list[xid.XidEvent]:
    """The events of ``events`` on a GPU not given to this run (an SXid names an NVSwitch, never one)."""
    return [e for e in events if e.kind != "sxid" and e.pci in not_given]


def judge_xid(events: list[xid.XidEvent], inv: Inventory, forgeable: bool = False, not_given: set[str] | None = None) -> list[Finding]:
    """One finding per (kind, code, GPU): the worst of its events, and how often. ``forgeable``:
    the log came through syslog(2), where a message's end is lost and any user's message can
    hold a line that reads as the driver's: a fatal event there WARNs (NVML's own facts, judged
    apart, still FAIL a lost GPU, ECC errors or a pending remap). A job's own Xids (``the_jobs``:
    an illegal address, a page fault, the channel resets that follow them) are no finding of the
    node: ``job_xids`` says them where a person reads. Nor are events on the GPUs ``not_given`` to
    this run (their slots): ``elsewhere_xids`` says them."""
    jobs = {id(e) for e in the_jobs(events)} | {id(e) for e in _elsewhere(events, not_given or set())}
    out = []
    for (kind, code, pci), group in _groups([e for e in events if id(e) not in jobs]).items():
        info = _worst(code, group)
        if info.severity == "info":
            continue
        label, gpu, g = _named(kind, code, pci, inv)
        status = FAIL if info.severity == "fatal" else WARN
        # Done only where NVML says so; unknown is not done.
        remap_done = g is not None and (
            (g.remapped_rows is not None and not g.remapped_rows.pending) or g.retired_pages_pending is False
        )
        # The catalog's action, unless the judge knows better: a warning never takes the node out.
        act = info.act
        if kind == "xid" and code == 63 and remap_done:
            status = WARN  # NVML's remap state is the truth: a reset since has activated it
            act = Next(Action.WATCH, act.domain, f"{act.source}; NVML says the remap is active since (a reset has run)")
        times = _times(group)
        doubt = ""
        if forgeable and status == FAIL:
            status = WARN
            doubt = ("; read through syslog(2), which loses where a message ends, so another user's message may "
                     "imitate this line: `journalctl -k -b | grep NVRM` on the host tells")
            act = Next(Action.WATCH, act.domain, f"{act.source}; read through syslog(2), where another user may have written it: watched")
        action = info.action + ("; the event stays in the kernel log, so this check fails until the node reboots" if status == FAIL else "")
        if status == FAIL and act.action in (Action.FIX_JOB, Action.DRAIN, Action.RESET_GPU) and code not in (63, 154):
            # What the catalog asks may mend the GPU, but preflight reads Xids since boot: after a reset
            # this check would fail again, and automation would reset for ever. Only a reboot clears it.
            # Not Xid 63 (NVML's remap state clears it after a reset) nor 154 (the driver logs the recovery's end).
            act = Next(Action.REBOOT, act.domain, f"{act.source}; read since boot, the event fails this check until the node reboots")
        out.append(Finding(status, f"{label} on {gpu}", f"{label} on {gpu}{times}: {info.meaning}{doubt}", action, act=act))
    return out


def job_xids(events: list[xid.XidEvent], inv: Inventory, not_given: set[str] | None = None) -> list[str]:
    """The Xids since boot that were a job's own (``the_jobs``), one line per (code, GPU): for
    the report's details and the lines a person reads, never a finding of the node. Those on a
    GPU ``not_given`` to this run are ``elsewhere_xids``'s."""
    out = []
    elsewhere = {id(e) for e in _elsewhere(events, not_given or set())}
    for (kind, code, pci), group in _groups([e for e in the_jobs(events) if id(e) not in elsewhere]).items():
        label, gpu, _ = _named(kind, code, pci, inv)
        times = _times(group)
        procs = sorted({f"pid {e.pid}" + (f" ({e.name})" if e.name else "") for e in group if e.pid is not None})
        info = group[-1].info
        why = info.act.source if info.act.domain == Domain.JOB else "it follows the job's own Xid on this GPU"
        out.append(f"{label} on {gpu}{times}{', ' + ', '.join(procs) if procs else ''}: {info.meaning}: the job's, not the node's ({why})")
    return out


def elsewhere_xids(events: list[xid.XidEvent], inv: Inventory, not_given: set[str]) -> list[str]:
    """The events since boot on GPUs not given to this run (``not_given``: their slots), one line
    per (kind, code, GPU) that is more than information: for the details and the lines a person
    reads, never a finding of this run, whose GPUs they are not."""
    out = []
    jobs = {id(e) for e in the_jobs(events)}  # another job's own Xid on its own GPU: nobody's to act on
    for (kind, code, pci), group in _groups([e for e in _elsewhere(events, not_given) if id(e) not in jobs]).items():
        info = _worst(code, group)
        if info.severity == "info":
            continue
        label, gpu, _ = _named(kind, code, pci, inv)
        times = _times(group)
        out.append(f"{label} on {gpu}{times}: {info.meaning}: on a GPU not given to this run, judged by the run that holds it")
    return out
