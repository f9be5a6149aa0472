"""How a torchrun worker run ended, rank by rank, in findings: ``judge_run`` names
the rank that died, hung or never reported first (torchrun's root cause leads),
and the ranks that then failed waiting for it after. The run's facts come from
``ranks.collect`` (gpuwork/ranks.py); what the ranks measured is the check's own business.
"""

from __future__ import annotations

import math
import re

from preflight.gpuwork import interpreter as interpreter_mod
from preflight.gpuwork.ranks import DONE_GRACE, TORCH, RankOutcome, RankReport, RunFacts
from preflight.base.findings import Finding, Status

FAIL, WARN = Status.FAIL, Status.WARN
OOM_HINT = "if no one killed it, look for the kernel's OOM killer (`journalctl -k | grep -i -e oom -e 'killed process'`); "
RESET_HINT = "check that GPU with `preflight run --only cuda` and `preflight xid`; reset it (`nvidia-smi -r -i N`) or reboot"


def judge_run(f: RunFacts, what: str, by_hand: str, wrong: list[Finding] | None = None, said: tuple[str, str, str] | None = None) -> list[Finding]:
    """Did every rank run to the end, in time, and leave nothing behind?

    ``what`` names the run ("the NCCL smoke test"); ``by_hand`` says how to
    run it by hand; ``wrong`` are the check's own findings about the answers
    the ranks gave; ``said`` is what the collective library said went wrong
    (title, line, fix), added to the cause of a failed run."""
    if f.launch_error:
        cause, remedy = f.launch_error
        return [Finding(FAIL, f"{what} could not start", cause, remedy)]
    if f.not_started or f.ended is None:
        return []
    out = []
    if f.leftover:
        cause = f"still running after SIGKILL: {', '.join(f.leftover)}; a process that survives SIGKILL is stuck in the kernel, usually in the GPU driver"
        out.append(Finding(FAIL, "worker processes outlived the check", cause, "drain the node and reboot it"))
    reports = [o.report for o in f.ranks if o.report]
    no_torch = next((r for r in reports if r.error_kind == "no_torch"), None)
    missing = [line for line in f.log_tail if re.search(r"No module named '?torch\b", line)]
    if no_torch or (not reports and missing):
        why = no_torch.error if no_torch and no_torch.error else missing[0]
        return out + [Finding(FAIL, "torch is not importable", f"torch is not importable by {f.python}: {why.strip()}", TORCH)]
    no_device = next((r for r in reports if r.error_kind == "no_device"), None)
    if no_device:
        lib = "NCCL" if f.backend == "nccl" else what
        return out + [Finding(FAIL, f"no CUDA device for {lib}", f"{no_device.error} (under {f.python})", "run the cuda check (`preflight run --only cuda`); " + TORCH)]
    if f.silent():
        # No rank said a word: torchrun itself failed (rendezvous, a port taken in a race) or was slow,
        # or --python is no Python at all (then it says so).
        last = " | ".join(f.log_tail[-3:]) or "none"
        ended = f"was {f.ended}" if f.timed_out else f"ended ({f.ended})"
        remedy = "raise the check's timeout in the profile's [timeouts] if this node is slow to import torch; " if f.timed_out else ""
        cause = f"torchrun {ended} before any rank started; its last output: {last}"
        if not_python := interpreter_mod.judge(f.python, f.interpreter, cause):
            return out + [not_python]
        return out + [Finding(FAIL, "torchrun never started the ranks", cause, remedy + by_hand)]
    out += _judge_ranks(f, by_hand, said)
    out += wrong or []
    if not out and f.settled and all(o.report and o.report.stage == "done" for o in f.ranks):
        cause = f"every rank reported success, but the ranks or torchrun had not exited {DONE_GRACE:g} s later (a hang in NCCL's teardown); they were stopped"
        out.append(Finding(WARN, "ranks did not exit after finishing", cause, "if it recurs, run the worker by hand with NCCL_DEBUG=INFO; " + by_hand))
    elif not out and (f.returncode != 0 or f.timed_out):
        cause = f"torchrun {f.ended} although every rank reported success; last output: {f.log_tail[-1] if f.log_tail else 'none'}"
        out.append(Finding(FAIL, "torchrun failed", cause, by_hand))
    return out


# A rank's end that says it waited for a peer past a deadline: its own (_rank.spin), gloo's,
# or the group's, where NCCL's watchdog caught the collective (and, unless told otherwise,
# ended the process with SIGABRT before it could write a word).
WAITED = re.compile(r"not done after|timed out|\btimeout\b|watchdog", re.IGNORECASE)
WATCHDOG = "NCCL's watchdog ends a rank whose collective outlives the group's timeout"


def waited(o: RankOutcome) -> bool:
    """Whether the rank ended waiting for a peer: a deadline's error, or NCCL's watchdog's SIGABRT."""
    r = o.report
    if r is not None and r.error:
        return bool(WAITED.search(r.error))
    return o.exit == "killed by SIGABRT"


def _judge_ranks(f: RunFacts, by_hand: str, said: tuple[str, str, str] | None) -> list[Finding]:
    """The ranks that died, hung or never reported are the cause; the ranks that
    then failed waiting for them are the symptom, said after. A hung rank (alive,
    no error, stopped reporting progress) is the cause before any rank that ended
    waiting past a deadline, even the one torchrun saw fail first: in a hang that is
    always a healthy peer whose wait timed out (or NCCL's watchdog killed)."""
    culprits: list[tuple[str, str, int, str | None, int]] = []  # (summary, what happened, rank, exit, steps done)
    failed: list[tuple[float, RankOutcome]] = []
    hung = any(o.report and not o.report.error and o.report.stage != "done" and not o.exit for o in f.ranks)
    victims = {o.rank for o in f.ranks if hung and waited(o)}
    for o in f.ranks:
        r = o.report
        if r is None:
            head = f"{o.who} never reported" + (f" ({o.exit})" if o.exit else "")
            culprits.append((head, head + (f"; {o.unreadable}" if o.unreadable else "") + f": last log line: {o.last_line}", o.rank, o.exit, -1))
        elif r.error:
            failed.append((r.error_time or math.inf, o))
        elif r.stage != "done":
            if o.exit and o.rank in victims:
                head = f"{o.who} then died {stage_words(r)} ({o.exit}: {WATCHDOG})"
                culprits.append((head, f"{head}: last log line: {o.last_line}", o.rank, "waited", r.progress()))
            elif o.exit:
                head = f"{o.who} died {stage_words(r)} ({o.exit})"
                culprits.append((head, f"{head}: last log line: {o.last_line}", o.rank, o.exit, r.progress()))
            else:
                others = "another rank failed" if any(x.report and x.report.error or x.exit for x in f.ranks) else "the other ranks finished"
                how = "at the deadline" if f.timed_out else f"once it made no progress after {others}" if f.settled else f"when torchrun ended ({f.ended})"
                if r.waiting and any(not (x.report and (x.report.waiting or x.report.stage == "done")) for x in f.ranks if x is not o):
                    # Waiting at a barrier for a peer that is not: a symptom, said after the cause.
                    head = f"{o.who} waited {stage_words(r)} at {r.waiting}"
                    culprits.append((head, f"{head} for the rank(s) that never came, and was stopped {how}", o.rank, "waited", r.progress()))
                    continue
                head = f"{o.who} hung {stage_words(r)}"
                culprits.append((head, f"{head} and was stopped {how}: last log line: {o.last_line}", o.rank, o.exit, r.progress()))
    failed.sort(key=lambda t: t[0])
    root = None if f.root_cause in victims else f.root_cause
    if failed and any(o.rank == root for _, o in failed):
        # torchrun names the first exit it saw in one of its polls (0.1 s apart); ranks that
        # raised both within one poll are told apart by their own clocks, which are finer.
        root = failed[0][1].rank
    # One list, most likely cause first: the rank torchrun saw fail first; then
    # ranks that hung, died by their own hand or never reported (least far
    # first); then ranks that raised (earliest error first) or that NCCL's watchdog
    # ended while a peer hung; last, ranks torchrun itself stopped (SIGTERM in its
    # teardown), which are victims.
    tier = {"killed by SIGTERM": 2, "waited": 1}
    entries = [(c[2] != root, tier.get(c[3] or "", 0), c[4], c[0], c[1]) for c in culprits]
    for i, (_, o) in enumerate(failed):
        head = f"{o.who} failed {stage_words(o.report)}"
        entries.append((o.rank != root, 1, i, head, f"{head}: {o.report.error}"))  # type: ignore[union-attr]
    if not entries:
        return []
    entries.sort(key=lambda e: e[:3])
    summary, lead = entries[0][3], entries[0][4]
    if entries[0][1] == 1:
        lead = lead.replace(" failed ", " failed first, ", 1)
    rest = [e[4].replace(" failed ", " then failed ", 1) if e[1] == 1 else e[4] for e in entries[1:]]
    cause = "; ".join([lead, *rest])
    if said:
        title, text, fix = said
        return [Finding(FAIL, summary, f"{cause}; NCCL said ({title}): {text.strip()}", f"{fix}; {by_hand}")]
    # A SIGKILL no one sent by hand is most often the kernel's OOM killer, which says so in its log.
    oom = OOM_HINT if "(killed by SIGKILL)" in summary else ""
    return [Finding(FAIL, summary, cause, f"{oom}{RESET_HINT if f.backend == 'nccl' else 'look at that rank'}; {by_hand}")]


def stage_words(r: RankReport | None) -> str:
    if r is None:
        return ""
    fixed = {"import": "importing torch", "init": "in init_process_group", "build": "building the model", "done": "after finishing"}
    return fixed.get(r.stage, f"in {r.stage} ({r.step_noun} {r.progress() + 1})")
