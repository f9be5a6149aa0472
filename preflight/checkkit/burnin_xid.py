"""The burnin check's judge of the Xids the kernel logged while it ran (checks/burnin.py),
told from those logged before it by ``new_xids``.

The burn-in is a known-good application, so an Xid on a GPU it loaded is the GPU's fault
whatever the catalog blames; one on a GPU it did not load (another job's on a shared
node, a burn limited by CUDA_VISIBLE_DEVICES) is not its to judge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from preflight.base.actions import LADDER, Action, Domain, Next, highest
from preflight.base.findings import Finding, Status
from preflight.base.host import Host
from preflight.checkkit import cuda_xid
from preflight.checkkit.sources import Sources, one_fact
from preflight.gpuwork import ranks
from preflight.readers.nvidia import nvml_facts
from preflight.readers.kernel import journal, log_sources, xid, xid_meaning

if TYPE_CHECKING:
    from preflight.gpuwork.ranks import RankOutcome


def _on_the_gpu(n: Next) -> Next:
    if LADDER.index(n.action) >= LADDER.index(Action.DRAIN) and n.domain == Domain.NODE:
        return n
    return Next(max(n.action, Action.DRAIN, key=LADDER.index), Domain.NODE, f"{n.source}; in preflight's own burn-in, the GPU's fault")


def new_xids(before: list[xid.XidEvent], after: list[xid.XidEvent], same_source: bool) -> list[dict] | None:
    """The Xids read after the burn that were not there before it. One event is one (code, GPU,
    microsecond since boot) however it was printed: a wrapped /dev/kmsg ring that moves on during
    the burn hands its oldest records to the journal (readers/kernel/log_sources.py _wrapped),
    whose lines read otherwise, so compared as printed an old Xid read as new (and a ring that
    first wrapped during the burn left every Xid unjudged). Without a time stamp (printk.time=0)
    the whole line is the event; from two sources such a line cannot be matched: None."""
    if not same_source and any(e.uptime is None for e in before + after):
        return None
    seen = {_event(e) for e in before}
    return [{"code": e.code, "pci": e.pci, "raw": e.raw} for e in after if e.kind == "xid" and _event(e) not in seen]


def _event(e: xid.XidEvent) -> tuple:
    return (e.kind, e.code, e.pci, round(e.uptime * 1e6)) if e.uptime is not None else (e.raw,)


def burned_gpus(outcomes: list[RankOutcome], buses: dict[int, str]) -> set[str] | None:
    """The PCI slots (domain:bus:device, as Xid lines name them) of the GPUs the ranks loaded,
    from each rank's own report, else ``buses`` (the cuda check's inventory by nvidia-smi index);
    None where any rank's is unknown."""
    out = set()
    for o in outcomes:
        bus = o.report.pci_bus_id if o.report is not None else None
        bus = bus or buses.get(ranks.gpu_index(o.gpu))  # type: ignore[arg-type]
        slot = nvml_facts.slot(bus) if bus else ""
        if not slot:  # unknown, or a form without a function part: then every Xid is the burn's
            return None
        out.add(slot)
    return out or None


def judge(new: list[dict], forgeable: bool, burned: set[str] | None, diag: str, rerun: str,
          not_given: set[str] | frozenset[str] = frozenset()) -> list[Finding]:
    """Any new Xid on a GPU the burn-in loaded fails (even a code the catalog blames on the
    application, RESTART_APP: its workflows say "if known good APP ... REPORT_ISSUE"), with the
    highest action the codes' catalog buckets ask, at least a drain. ``forgeable``: the log was
    read through syslog(2), where another user's message may imitate a driver's line (as the cuda
    check says): still a FAIL, but a drain for a person to look at, never a reboot or an RMA on
    the word of a line anyone could have written. ``burned``: the GPUs loaded, where known; an
    Xid on another is a WARN naming it, for the cuda check's catalog judge of every run, unless it
    is that other job's own (cuda_xid.the_jobs: a code the catalog lays to the application, and the
    resets that follow it), which is no finding of the node's, nor is one on a GPU not given to this
    run at all (``not_given``: another pod's or job's, NodeShape.not_given), as the cuda check holds:
    the run that holds it judges it (``given_elsewhere`` says them). One with no GPU named stays a FAIL."""
    elsewhere = [e for e in new if burned is not None and e["pci"] and e["pci"] not in burned]
    theirs = given_elsewhere(new, burned, not_given)
    ours = [e for e in elsewhere if e not in theirs]
    return _elsewhere(_not_the_jobs(ours), burned or set(), rerun) + _under_load([e for e in new if e not in elsewhere], forgeable, diag)


def given_elsewhere(new: list[dict], burned: set[str] | None, not_given: set[str] | frozenset[str]) -> list[dict]:
    """The new Xids on GPUs the burn did not load that are not this run's at all (``not_given``): said, not judged."""
    return [e for e in new if burned is not None and e["pci"] and e["pci"] not in burned and e["pci"] in not_given]


def _not_the_jobs(found: list[dict]) -> list[dict]:
    """``found`` less the Xids that are another job's own, as the cuda check tells them."""
    events = [(e, ev) for e in found for ev in xid.parse(e["raw"])[:1]]
    jobs = {id(ev) for ev in cuda_xid.the_jobs([ev for _, ev in events])}
    theirs = {id(e) for e, ev in events if id(ev) in jobs}
    return [e for e in found if id(e) not in theirs]


def _elsewhere(found: list[dict], burned: set[str], rerun: str) -> list[Finding]:
    if not found:
        return []
    codes = ", ".join(sorted({f"Xid {e['code']} on {e['pci']}" for e in found}))
    return [Finding(Status.WARN, f"new Xid during burn-in on a GPU it did not load: {codes}",
                    f"the burn-in loaded {', '.join(sorted(burned))}; the kernel logged " + "; ".join(e["raw"].strip() for e in found[:3])
                    + " for another GPU, whose work (another job's, on a shared node) preflight did not run",
                    "the cuda check of the run that holds that GPU judges its Xids since boot by NVIDIA's catalog; `preflight xid` explains the code; "
                    f"to load that GPU too, run `{rerun}` with it visible")]


def _under_load(new: list[dict], forgeable: bool, diag: str) -> list[Finding]:
    if not new:
        return []
    codes = ", ".join(sorted({f"Xid {e['code']} on {e['pci'] or 'an unknown GPU'}" for e in new}))
    infos = [ev.info for e in new for ev in (xid.parse(e["raw"]) or [None]) if ev is not None]
    infos += [xid_meaning.explain("xid", e["code"]) for e in new if not xid.parse(e["raw"])]
    asked = [_on_the_gpu(i.act) for i in infos]
    if forgeable:
        asked = [Next(Action.DRAIN, Domain.SOFTWARE, f"{n.source}; read through syslog(2), where another user may have written it")
                 for n in asked]
    return [Finding(Status.FAIL, f"new Xid during burn-in: {codes}", "the kernel logged " + "; ".join(e["raw"].strip() for e in new[:3])
                    + " while the burn-in ran", "look the codes up with `preflight xid`; " + diag, act=highest(asked))]


# ---- reading the kernel log before and after the burn ------------------------------------


XID_UNJUDGED = "not judged: "


def xid_counts(host: Host, facts: Any) -> tuple[list[xid.XidEvent] | None, str, tuple[int, int] | None]:
    """The kernel log's events, where they were read (or why not) and the span of /dev/kmsg
    records read (journal.record_span); the sources that could not be read, and the reading's note,
    go to ``facts`` (the check's BurninFacts: xid_unread, xid_note)."""
    try:
        log = log_sources.read_log(host, timeout=10.0)
    except log_sources.KernelLogUnavailable as e:
        facts.xid_unread.update(e.unread)
        return None, f"{XID_UNJUDGED}kernel log unreadable: {e}", None
    facts.xid_unread.update(log.unread)
    facts.xid_note = log.note or facts.xid_note
    return xid.parse(log.text), log.source, journal.record_span(log.text)


def lost_meanwhile(before: tuple[int, int] | None, after: tuple[int, int] | None, where: str) -> str | None:
    """Why the Xids logged during the burn cannot all be seen: the ring read after it (from /dev/kmsg
    alone, no journal filling in what it lost) begins past the newest record read before it, so the
    records between, the burn's own among them, are gone (a kernel that logged that much, or any
    user flooding it through messages it logs for them); None where nothing between was lost."""
    if before is None or after is None or log_sources.JOURNALCTL[0] in where or after[0] <= before[1] + 1:
        return None
    return (f"the kernel ring moved past records logged during the burn-in (the newest before it was #{before[1]}, the oldest "
            f"after it #{after[0]}) and no journal holds them: an Xid logged then is not seen")


def kernel_log_sources(where: str, unread: dict[str, str]) -> Sources:
    """Which source gave the kernel log (``where``, else why none did) and which could not, for details and the metric."""
    return one_fact("kernel log", where if where and not where.startswith(XID_UNJUDGED) else None, unread)
