"""`preflight slurm-healthcheck`: Slurm's HealthCheckProgram, driven by the last report.

slurmd runs it every HealthCheckInterval seconds. It never runs a check (the
boot gate and the recheck timer write the report); it reads the verdict and
drains the node with a reason that starts with the action and its domain
(``preflight [node] reset-gpu: xid FAIL: ...``, actions.drain_prefix: site
automation switches on the prefix) and names the check that drained it. It
resumes the node only from a drain of its own (a reason starting
``preflight``, the older ``preflight:`` form too), and only once that check
passes in the report: a quick run that left the check out does not lift it.
A node an admin drained for maintenance is left exactly as it is. A passing
node its history calls a lemon (action `service`: history_judge) is drained as
a failure is, and resumed once its history asks nothing. It also
compares Slurm's Gres with the node's GPUs (slurm_gres), and drains no more
than a share of a partition (slurm_cap). slurmd also runs it once when it
starts, before it registers: a node whose boot gate failed comes up drained
with the cause. ``--dry-run`` (``preview``) prints the `scontrol` line
instead of running it, and needs no cluster.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
from dataclasses import dataclass
from typing import NamedTuple

from typing import TYPE_CHECKING, Callable

from preflight.base.actions import Action as Step, Domain, Next, drain_prefix, highest, takes_out
from preflight.base.errors import UsageError
from preflight.base.host import Host
from preflight.outputs.schedulers import slurm_cap, slurm_gres
from preflight.outputs.record.last_report import Standing, printable

if TYPE_CHECKING:
    from preflight.pipeline.report import Report
    from preflight.pipeline.report_view import ReportView

PREFIX = "preflight"  # every reason of ours starts so: "preflight [node] drain: ...", and the older "preflight: ..."
_OURS = re.compile(r"preflight(?: \[[a-z]+\] [a-z-]+)?: ")
# The check a reason names: "<check> FAIL: ..." right after the prefix, as reason_for writes it.
# WARN: a lemon's drain names the history, whose result is a WARN (lemon_cause); a run whose
# history was skipped then keeps the drain (passes: SKIP) rather than lift and drain again.
_NAMES_CHECK = re.compile(r"preflight(?: \[[a-z]+\] [a-z-]+)?: (\S+) (?:FAIL|ERROR|WARN): ")
# A verdict that does not vouch with no failed check to name (no report, a stale pass, a run
# that died): the node is not known bad, preflight's own machinery has not vouched for it.
NO_VERDICT = Next(Step.DRAIN, Domain.SOFTWARE, "no verdict vouches for the node now")
REASON_MAX = 120  # sinfo's REASON column and people's terminals; the report has the rest
TIMEOUT = 10.0  # per call, at most three (show node, sinfo for the cap, update): well inside the 60 s slurmd gives HealthCheckProgram
# slurmd starts HealthCheckProgram with an empty environment: without PATH only
# /bin and /usr/bin would be searched, and source builds and site installs put
# scontrol elsewhere. These follow whatever PATH there is.
SCONTROL_DIRS = ("/usr/local/bin", "/usr/bin", "/bin", "/opt/slurm/bin", "/usr/local/slurm/bin")


class SlurmError(Exception):
    pass


@dataclass(frozen=True)
class Node:
    name: str
    state: str  # "IDLE+DRAIN", "MIXED", "DOWN*+DRAIN"
    reason: str | None  # without Slurm's " [user@time]" suffix
    gres: str | None = None  # "gpu:h100:8(S:0-1)"; None: (null)
    partitions: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        return any(part.rstrip("*$~#!%@^-").startswith("DRAIN") for part in self.state.upper().split("+"))

    @property
    def ours(self) -> bool:
        return ours(self.reason)

    @property
    def drained_for(self) -> str | None:
        """The check whose pass lifts our drain; None for a drain that names none."""
        m = _NAMES_CHECK.match(self.reason or "")
        return m.group(1) if m else None


def ours(reason: str | None) -> bool:
    return _OURS.match(reason or "") is not None


class Cause(NamedTuple):
    """Why the node may not take jobs: what to do, and the words after the drain prefix."""

    next: Next
    text: str


@dataclass(frozen=True)
class Action:
    verb: str  # "drain", "resume" or "none"
    why: str
    reason: str | None = None  # the drain reason to set
    held: slurm_cap.Count | None = None  # the partition whose cap held a drain back
    counted: tuple[slurm_cap.Count, ...] = ()  # the cap's count, where it was made


def node_name(environ: dict[str, str] | None = None) -> str:
    """slurmd's name for this node: SLURMD_NODENAME where slurmd sets it, else the short hostname."""
    environ = os.environ if environ is None else environ
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


# One NodeName: a hostname's letters, digits, '.', '_' and '-'. scontrol reads '[', ']', ',' and
# spaces as a host list ("gpu-[01-99]" is 99 nodes) and "ALL" as every node: a drain meant for
# this node must not reach another.
_ONE_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def one_node(name: str, where: str) -> str:
    """``name`` if it names exactly one Slurm node; else a UsageError saying where it came from."""
    if _ONE_NODE.fullmatch(name) and name.upper() != "ALL":
        return name
    if name.upper() == "ALL":
        what = "scontrol reads it as every node"
    elif re.search(r"[\[\],\s]", name):
        what = "a host list, which scontrol would expand to many nodes"
    else:
        what = "not a node name"
    raise UsageError(f"{where} {name!r}: {what}; give this node's own NodeName: letters, digits, '.', '_' and '-', "
                     "at most 64 (as `scontrol show hostnames` prints it)")


def parse_node(text: str, name: str) -> Node:
    """The State= and Reason= of `scontrol show node NAME` (one field per line for Reason)."""
    state = re.search(r"\bState=(\S+)", text)
    if state is None:
        first = (text.strip().splitlines() or ["no output"])[0]
        raise SlurmError(f"scontrol show node {name} printed no State= ({first[:100]}); is {name} this node's NodeName? pass --node NAME")
    reason = re.search(r"^\s*Reason=(.*?)(?:\s+\[[^\]]*@[^\]]*\])?\s*$", text, re.MULTILINE)
    said = reason.group(1).strip() if reason else None
    gres = re.search(r"(?:^|\s)Gres=(\S+)", text)
    parts = re.search(r"(?:^|\s)Partitions=(\S+)", text)
    return Node(name, state.group(1), None if said in (None, "", "(null)", "none") else said,
                None if gres is None or gres.group(1) == "(null)" else gres.group(1),
                tuple(p for p in parts.group(1).split(",") if p) if parts and parts.group(1) != "(null)" else ())


def _no_age(text: str) -> str:
    # Without the age ("(12 s ago)"): a reason that changed at every health check would be rewritten at every one.
    return re.sub(r" [(][^()]* ago[)]", "", text).replace("\n", " ")


def report_cause(st: Standing, report: Report | ReportView | None) -> Cause:
    """Why a report that does not vouch keeps the node out: the run's action (Report.action) and
    the result that decided it, a check's or the history's (drift, a lemon), where the run failed
    in this boot; else NO_VERDICT and the standing's words (a report of an earlier boot says
    nothing of this one, as `status` and kube-label take it)."""
    if report is not None and str(report.verdict) != "pass" and report.action_check is not None and st.current_boot is not False:
        nxt = Next(Step(str(report.action)), Domain(str(report.domain)), report.action_source)
        c = next((c for c in report.results if c.check == report.action_check), None)
        if c is not None and (str(c.status) in ("FAIL", "ERROR") or c is report.history):
            return Cause(nxt, printable(f"{c.check} {c.status}: {c.summary}"))
        return Cause(nxt, _no_age(st.reason))
    return Cause(NO_VERDICT, _no_age(st.reason))


def lemon_cause(st: Standing, report: Report | ReportView | None) -> Cause | None:
    """A passing node its history calls a lemon (K failures in D days, history_judge): the run
    passed, but its action asks for service, so it is drained as a failure would be; it is
    resumed once the history no longer asks it (``passes``)."""
    if report is None or not st.vouched or report.history is None or report.action_check != report.history.check:
        return None
    nxt = Next(Step(str(report.action)), Domain(str(report.domain)), report.action_source)
    return Cause(nxt, printable(f"{report.history.check} {report.history.status}: {report.history.summary}")) if takes_out(nxt) else None


def gres_cause(node: Node, report: Report | ReportView | None) -> tuple[Cause | None, str | None]:
    """A Gres that differs from the node's GPUs (slurm_gres), and a note where it cannot be read.
    The node's, not the run's: a run in a job's container given some of them (a partial
    allocation) saw fewer, and Slurm's Gres names the whole node's."""
    shape = report.shape if report is not None else None
    present = (shape.host_gpus if shape.host_gpus is not None else shape.gpus) if shape is not None else None
    try:
        found = slurm_gres.judge(node.gres, present)
    except slurm_gres.GresError as e:
        return None, f"{e}: Slurm's GPUs not compared"
    return (Cause(*found) if found else None), None


def reason_for(cause: Cause) -> str:
    # One printable line: a summary may quote what another host posted (last_report.printable).
    text = printable(f"{drain_prefix(cause.next)}: {cause.text}")
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3].rstrip() + "..."


def passes(check: str, report: Report | ReportView | None, gres_ok: bool) -> str | None:
    """None where ``check`` passes now; else what its result is."""
    if check == slurm_gres.CHECK:
        return None if gres_ok else "still differs"
    found = [str(c.status) for c in (report.results if report is not None else []) if c.check == check]
    if not found and check == "history":
        return None  # no drift, no lemon: the history asks for nothing now
    if not found:
        return "not in this report (the run left it out)"
    return None if found[0] in ("PASS", "WARN") else found[0]


def decide(st: Standing, node: Node, report: Report | ReportView | None = None) -> Action:
    """Drain a node the report (or Slurm's Gres) does not vouch for; resume only a drain of
    our own, and only once the check that drained it passes."""
    gres, note = gres_cause(node, report)
    said = st.reason + (f"; {note}" if note else "")
    causes = ([] if st.vouched else [report_cause(st, report)]) + [c for c in (lemon_cause(st, report), gres) if c]
    if jobs := [c for c in causes if c.next.action == Step.FIX_JOB]:
        # The job's fault (a container's /dev/shm, its environment): the node is fine, and a drain
        # would also spend the partition's cap on what no hardware or setup of the node can mend.
        causes = [c for c in causes if c not in jobs]
        said += f"; the fault is the job's ({jobs[0].text}: fix-job), not the node's: not drained for it"
    if not causes:
        if node.drained and node.ours:
            check = node.drained_for
            why_not = passes(check, report, True) if check else None
            if why_not:
                return Action("none", f"{said}; {node.name} stays drained: preflight drained it for {check}, which does not pass yet: {why_not} ({node.reason})")
            return Action("resume", f"{said}; resuming {node.name}, drained earlier by preflight ({node.reason})")
        if node.drained:
            return Action("none", f"{said}; {node.name} stays drained: someone else drained it ({node.reason or 'no reason given'})")
        return Action("none", said)
    top = highest([c.next for c in causes])
    cause = next(c for c in causes if c.next is top)
    why = f"not vouched ({said})" if not st.vouched else f"{said}, but {cause.text}"
    reason = reason_for(cause)
    if node.drained and not node.ours:
        return Action("none", f"{why}; {node.name} is already drained by someone else ({node.reason or 'no reason given'}): left alone")
    if node.drained and node.reason == reason:
        return Action("none", f"{why}; {node.name} already drained by preflight")
    return Action("drain", f"{why}; draining {node.name}", reason)


def find_scontrol(path: str | None, tool: str = "scontrol") -> str | None:
    return shutil.which(tool, path=os.pathsep.join([*(path.split(os.pathsep) if path else []), *SCONTROL_DIRS]))


def scontrol(host: Host, args: list[str]) -> str:
    return run_tool(host, "scontrol", args)


def run_tool(host: Host, tool: str, args: list[str]) -> str:
    exe = find_scontrol(os.environ.get("PATH"), tool)
    if exe is None:
        raise SlurmError(f"{tool} is not on PATH nor in {', '.join(SCONTROL_DIRS)}; "
                         "set PATH to Slurm's bin directory in the HealthCheckProgram wrapper (examples/slurm/preflight-healthcheck)")
    try:
        done = host.run([exe, *args], TIMEOUT)
    except OSError as e:
        raise SlurmError(f"cannot run {exe}: {e.strerror or e}") from None
    if done.timed_out:
        raise SlurmError(f"{tool} {' '.join(args)} did not answer within {TIMEOUT:g} s: is slurmctld reachable?")
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise SlurmError(f"{tool} {' '.join(args)} failed (exit {done.returncode}): {tail}")
    return done.stdout


def update_args(name: str, action: Action) -> list[str]:
    """The `scontrol` arguments that carry out ``action``; none for "none"."""
    if action.verb == "drain":
        return ["update", f"NodeName={name}", "State=DRAIN", f"Reason={action.reason}"]
    if action.verb == "resume":
        return ["update", f"NodeName={name}", "State=RESUME"]
    return []


def capped(host: Host, node: Node, action: Action, share: Callable[[], float]) -> Action:
    """``action``, or "none" and why where one more drain would pass the cap (slurm_cap). Only
    a new drain counts: a node preflight drained already is drained anew, whatever the count."""
    if action.verb != "drain" or (node.drained and node.ours) or not node.partitions:
        return action
    out = run_tool(host, "sinfo", ["-h", "-N", "-p", ",".join(node.partitions), "-o", slurm_cap.SINFO_FORMAT])
    try:
        rows = slurm_cap.parse_sinfo(out)
    except ValueError as e:
        raise SlurmError(str(e)) from None
    cap = share()
    found = slurm_cap.counts(node.name, list(node.partitions), rows, cap, ours)
    full = slurm_cap.past_cap(found)
    if full is None:
        return Action(action.verb, action.why, action.reason, counted=tuple(found))
    return Action("none", f"{action.why.removesuffix(f'; draining {node.name}')}; {slurm_cap.would_drain(full, cap)}", action.reason,
                  full, tuple(found))


def apply(host: Host, st: Standing, name: str, report: Report | ReportView | None = None,
          share: Callable[[], float] = lambda: slurm_cap.DEFAULT_SHARE) -> Action:
    node = parse_node(scontrol(host, ["show", "node", name]), name)
    action = capped(host, node, decide(st, node, report), share)
    if action.verb != "none":
        scontrol(host, update_args(name, action))
    return action


def cases(st: Standing, name: str, report: Report | ReportView | None = None) -> list[tuple[str, Action]]:
    """What ``decide`` does in each state the node could be in: the dry run's
    answer when it cannot ask slurmctld. Decided by ``decide`` itself, so the
    preview cannot drift from what a real run does. (Slurm's Gres and the cap
    need slurmctld: not judged here.)"""
    earlier = f"{drain_prefix(NO_VERDICT)}: an earlier failure"
    nodes = [("not drained", Node(name, "IDLE", None))]
    cause = report_cause(st, report) if not st.vouched else lemon_cause(st, report)
    if cause is None:
        nodes.append(("drained by preflight", Node(name, "IDLE+DRAIN", earlier)))
    else:
        nodes += [("drained by preflight for another cause", Node(name, "IDLE+DRAIN", earlier)),
                  ("drained by preflight for this cause", Node(name, "IDLE+DRAIN", reason_for(cause)))]
    nodes.append(("drained by someone else", Node(name, "IDLE+DRAIN", "maintenance")))
    return [(case, decide(st, n, report)) for case, n in nodes]


def _line(name: str, action: Action) -> str:
    args = update_args(name, action)
    return shlex.join(["scontrol", *args]) if args else "nothing"


def preview(host: Host, st: Standing, name: str, report: Report | ReportView | None = None,
            share: Callable[[], float] = lambda: slurm_cap.DEFAULT_SHARE) -> str:
    """`--dry-run`: the exact `scontrol` line a run would send now, or nothing
    and why. It reads the node's state where slurmctld answers (reading changes
    nothing); where it cannot, it says why and gives the line for each state."""
    try:
        node = parse_node(scontrol(host, ["show", "node", name]), name)
    except SlurmError as e:
        each = cases(st, name, report)
        width = max(len(case) for case, _ in each) + 1
        lines = [f"{'vouched' if st.vouched else 'not vouched'}: {st.reason}",
                 f"{name}'s state is unknown ({e}); what it would run in each state {name} could be in:"]
        lines += [f"  {case + ':':<{width}} {_line(name, action)}" for case, action in each]
        lines.append(f"  (someone else's drain: a reason not starting {PREFIX!r}, never lifted by preflight)")
        return "\n".join(lines) + "\n"
    try:
        action = capped(host, node, decide(st, node, report), share)
    except SlurmError as e:
        action = decide(st, node, report)
        action = Action(action.verb, f"{action.why} (the cap not counted: {e})", action.reason)
    if action.verb == "none":
        return f"nothing: {action.why}\n"
    return f"would run: {_line(name, action)}\n  because: {action.why}\n"
