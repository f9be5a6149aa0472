"""`preflight slurm-healthcheck`: Slurm's HealthCheckProgram, driven by the last report.

slurmd runs it every HealthCheckInterval seconds. It never runs a check (the
boot gate and the recheck timer write the report); it reads the verdict and
drains the node with a reason that starts ``preflight:``, or resumes the node
when the report passes again, but only if the drain is its own: a node an
admin drained for maintenance is left exactly as it is. slurmd also runs it
once when it starts, before it registers: a node whose boot gate failed comes
up drained with the cause. ``--dry-run`` (``preview``) prints the `scontrol`
line instead of running it, and needs no cluster.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
from dataclasses import dataclass

from preflight.base.errors import UsageError
from preflight.base.host import Host
from preflight.outputs.last_report import Standing

PREFIX = "preflight:"
REASON_MAX = 120  # sinfo's REASON column and people's terminals; the report has the rest
TIMEOUT = 10.0  # per scontrol call, at most two: well inside the 60 s slurmd gives HealthCheckProgram
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

    @property
    def drained(self) -> bool:
        return any(part.rstrip("*$~#!%@^-").startswith("DRAIN") for part in self.state.upper().split("+"))

    @property
    def ours(self) -> bool:
        return (self.reason or "").startswith(PREFIX)


@dataclass(frozen=True)
class Action:
    verb: str  # "drain", "resume" or "none"
    why: str
    reason: str | None = None  # the drain reason to set


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
    return Node(name, state.group(1), None if said in (None, "", "(null)", "none") else said)


def reason_for(st: Standing) -> str:
    # Without the age ("(12 s ago)"): a reason that changed at every health check would be rewritten at every one.
    text = f"{PREFIX} {re.sub(r' [(][^()]* ago[)]', '', st.reason)}".replace("\n", " ")
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3].rstrip() + "..."


def decide(st: Standing, node: Node) -> Action:
    """Drain a node the report does not vouch for; resume only a drain of our own."""
    if st.vouched:
        if node.drained and node.ours:
            return Action("resume", f"{st.reason}; resuming {node.name}, drained earlier by preflight ({node.reason})")
        if node.drained:
            return Action("none", f"{st.reason}; {node.name} stays drained: someone else drained it ({node.reason or 'no reason given'})")
        return Action("none", st.reason)
    reason = reason_for(st)
    if node.drained and not node.ours:
        return Action("none", f"not vouched ({st.reason}); {node.name} is already drained by someone else ({node.reason or 'no reason given'}): left alone")
    if node.drained and node.reason == reason:
        return Action("none", f"not vouched ({st.reason}); {node.name} already drained by preflight")
    return Action("drain", f"not vouched ({st.reason}); draining {node.name}", reason)


def find_scontrol(path: str | None) -> str | None:
    return shutil.which("scontrol", path=os.pathsep.join([*(path.split(os.pathsep) if path else []), *SCONTROL_DIRS]))


def scontrol(host: Host, args: list[str]) -> str:
    exe = find_scontrol(os.environ.get("PATH"))
    if exe is None:
        raise SlurmError(f"scontrol is not on PATH nor in {', '.join(SCONTROL_DIRS)}; "
                         "set PATH to Slurm's bin directory in the HealthCheckProgram wrapper (examples/slurm/preflight-healthcheck)")
    try:
        done = host.run([exe, *args], TIMEOUT)
    except OSError as e:
        raise SlurmError(f"cannot run {exe}: {e.strerror or e}") from None
    if done.timed_out:
        raise SlurmError(f"scontrol {' '.join(args)} did not answer within {TIMEOUT:g} s: is slurmctld reachable?")
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise SlurmError(f"scontrol {' '.join(args)} failed (exit {done.returncode}): {tail}")
    return done.stdout


def update_args(name: str, action: Action) -> list[str]:
    """The `scontrol` arguments that carry out ``action``; none for "none"."""
    if action.verb == "drain":
        return ["update", f"NodeName={name}", "State=DRAIN", f"Reason={action.reason}"]
    if action.verb == "resume":
        return ["update", f"NodeName={name}", "State=RESUME"]
    return []


def apply(host: Host, st: Standing, name: str) -> Action:
    action = decide(st, parse_node(scontrol(host, ["show", "node", name]), name))
    if action.verb != "none":
        scontrol(host, update_args(name, action))
    return action


def cases(st: Standing, name: str) -> list[tuple[str, Action]]:
    """What ``decide`` does in each state the node could be in: the dry run's
    answer when it cannot ask slurmctld. Decided by ``decide`` itself, so the
    preview cannot drift from what a real run does."""
    ours = reason_for(st)
    nodes = [("not drained", Node(name, "IDLE", None))]
    if st.vouched:
        nodes.append(("drained by preflight", Node(name, "IDLE+DRAIN", f"{PREFIX} an earlier failure")))
    else:
        nodes += [("drained by preflight for another cause", Node(name, "IDLE+DRAIN", f"{PREFIX} another cause")),
                  ("drained by preflight for this cause", Node(name, "IDLE+DRAIN", ours))]
    nodes.append(("drained by someone else", Node(name, "IDLE+DRAIN", "maintenance")))
    return [(case, decide(st, n)) for case, n in nodes]


def _line(name: str, action: Action) -> str:
    args = update_args(name, action)
    return shlex.join(["scontrol", *args]) if args else "nothing"


def preview(host: Host, st: Standing, name: str) -> str:
    """`--dry-run`: the exact `scontrol` line a run would send now, or nothing
    and why. It reads the node's state where slurmctld answers (reading changes
    nothing); where it cannot, it says why and gives the line for each state."""
    try:
        node = parse_node(scontrol(host, ["show", "node", name]), name)
    except SlurmError as e:
        each = cases(st, name)
        width = max(len(case) for case, _ in each) + 1
        lines = [f"{'vouched' if st.vouched else 'not vouched'}: {st.reason}",
                 f"{name}'s state is unknown ({e}); what it would run in each state {name} could be in:"]
        lines += [f"  {case + ':':<{width}} {_line(name, action)}" for case, action in each]
        lines.append(f"  (someone else's drain: a reason not starting {PREFIX!r}, never lifted by preflight)")
        return "\n".join(lines) + "\n"
    action = decide(st, node)
    if action.verb == "none":
        return f"nothing: {action.why}\n"
    return f"would run: {_line(name, action)}\n  because: {action.why}\n"
