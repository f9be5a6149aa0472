"""A node's side of its group's meetings (checks/workers/meeting.py does the talking).

Node rank 0 hosts the meeting store for its whole run. Before nccl every node
says whether its local checks passed, before bandwidth whether nccl did, and
after the group checks what it found, which node rank 0 keeps as the group's
figures. What a meeting finds is judged here: the nodes that stayed out, the
ones that never came, the ones that stopped answering.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from preflight.gpuwork import launch, multinode
from preflight.base.errors import UsageError

START = 60.0  # seconds for the store to come up: one torch import, from a cold network filesystem too
BYE = 30.0  # after the last meeting: how long node rank 0 keeps the store for peers still reading


@dataclass
class Gathered:
    """One meeting: each node's post, the nodes that never came, and what went wrong for this node."""

    phase: str
    nodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    error: str | None = None  # this node could not take part (rank 0 unreachable, torch missing)
    seconds: float = 0.0

    def out(self) -> dict[int, dict[str, Any]]:
        return {r: n for r, n in self.nodes.items() if not n.get("ok", True)}


class Meeting:
    def __init__(self, group: multinode.Group, side: multinode.LocalSide, python: str, budget: float):
        self.group, self.side, self.python = group, side, python
        self.last: dict[int, dict[str, Any]] = {}  # every node's latest post seen, for the report
        self.host: launch.Running | None = None
        self.reached: str | None = None  # the last phase this node posted in
        self.broken = False  # a meeting found the group cannot go on: no more meetings but bye
        self.final: Gathered | None = None  # the last meeting: after the group checks, or the one it stayed out of
        self.missing: set[int] = set()  # nodes that did not come to a meeting within its wait
        # Node rank 0's random word for this run, handed to the others at the meeting: torchrun's
        # rendezvous id carries it, so the key its store unpickles is not one anyone can guess.
        self.secret: str | None = secrets.token_hex(16) if group.node_rank == 0 else None
        if group.node_rank == 0:
            self._host(budget)

    def _host(self, budget: float) -> None:
        for port in (self.group.port, self.group.meeting_port):
            try:
                launch.check_port_free(port)
            except launch.LaunchError:
                raise UsageError(
                    f"--rdzv-endpoint {self.group.endpoint}: port {port} is in use on this node "
                    "(node rank 0 hosts torchrun's store on PORT and preflight's on PORT+1); stop what holds it or choose another port"
                ) from None
        args = ["host", "--endpoint", f"{self.group.host}:{self.group.meeting_port}", "--nnodes", str(self.group.nnodes), "--timeout", f"{budget:g}"]
        try:
            self.host = launch.start(self.python, launch.Worker("meeting.py", args, env=self._env(PREFLIGHT_MEETING_SECRET=self.secret or "")), budget)
        except (launch.LaunchError, OSError) as e:
            raise UsageError(f"node rank 0 could not host the meeting point: {getattr(e, 'cause', None) or e}") from None
        until = time.monotonic() + START
        while time.monotonic() < until and self.host.alive():
            if (self.host.report() or {}).get("stage") == "serving":
                return
            time.sleep(0.1)
        done = self.host.wait(lambda _: True)
        said = (done.reports.get(0) or {}).get("error") or " | ".join(done.rank_logs.get(0, [])[-2:]) or "no output"
        self.host = None
        raise UsageError(f"node rank 0 could not host the meeting point on port {self.group.meeting_port}: {said}; check --python's torch and the port")

    def call(self, phase: str, post: dict[str, Any], timeout: float, wait_all: bool = False, expect: list[int] | None = None) -> Gathered:
        """Post, then read the others' posts until all came (or, unless ``wait_all``, one is out) or ``timeout`` passes."""
        me = {"host": socket.gethostname(), "addr": self.side.addr, **post}
        args = [
            "call", "--endpoint", f"{self.group.host}:{self.group.meeting_port}", "--nnodes", str(self.group.nnodes),
            "--node-rank", str(self.group.node_rank), "--phase", phase, "--status", json.dumps(me), "--timeout", f"{timeout:g}",
        ]  # fmt: skip
        if wait_all:
            args.append("--wait-all")
        if expect is not None:
            args += ["--expect", ",".join(map(str, expect))]
        self.reached = phase
        started = time.monotonic()
        try:
            done = launch.start(self.python, launch.Worker("meeting.py", args, env=self._env()), timeout + START).wait()  # its clock starts after torch's import
        except (launch.LaunchError, OSError) as e:
            return Gathered(phase, error=f"the meeting could not start: {getattr(e, 'cause', None) or e}")
        rep = done.reports.get(0) or {}
        error = rep.get("error")
        self.secret = self.secret or secret_of(rep.get("secret"))
        if rep.get("error_kind") == "no_torch":
            error = f"this node cannot meet the group: torch is not importable by {self.python} ({error}); point --python at the training environment's interpreter"
        g = Gathered(phase, {int(r): n for r, n in (rep.get("nodes") or {}).items()}, list(rep.get("missing") or []), error, round(time.monotonic() - started, 3))
        if done.timed_out or (rep.get("stage") != "done" and not g.error):
            g.error = f"the meeting did not finish ({done.how_it_ended}); last output: {done.last_line(0)}"
        self.last.update({r: n for r, n in g.nodes.items() if phase != "bye"})
        if not g.out():  # a meeting cut short by a node staying out says nothing of who was yet to come
            self.missing.update(g.missing)
        return g

    def _env(self, **more: str) -> dict[str, str]:
        """The group's id goes to the meeting worker in its environment: a command line is every user's to read."""
        return {"PREFLIGHT_MEETING_ID": self.group.rdzv_id, **more}

    def close(self, expect: list[int], wait: float) -> None:
        """Node rank 0: keep the store until ``expect`` have said bye (at most ``wait`` s), then end it."""
        if self.host is None:
            return
        try:
            if expect:
                self.call("bye", {}, wait, wait_all=True, expect=expect)
        finally:
            self.host.wait(lambda _: True)
            self.host = None

    def who(self, r: int) -> str:
        """"node 2 (gpu-node-17, 10.0.0.3)", from what it posted; rank 0's address from the endpoint."""
        n = self.last.get(r) or {}
        where = ", ".join(x for x in (n.get("host"), n.get("addr")) if x) or (self.group.host if r == 0 else "")
        return f"node {r}" + (f" ({where})" if where else "")


def problem(m: Meeting, g: Gathered, timeout: float) -> tuple[str, str, str] | None:
    """(summary, cause, remedy) when the group cannot go on, else None."""
    out = {r: n for r, n in g.out().items() if r != m.group.node_rank}
    if g.error and "torch is not importable" in g.error:
        return ("could not meet the group: torch is not importable", g.error, "point --python at the training environment's interpreter, or install torch there")
    if g.error:
        rank0 = m.who(0)
        return (f"could not meet the group at {m.group.host}:{m.group.meeting_port}",
                f"{g.error}; {rank0} hosts the meeting point: it is down, unreachable from this node, or the endpoint is wrong",
                f"check that {rank0} is running preflight with the same --rdzv-endpoint and --rdzv-id, and that ports {m.group.port}-{m.group.meeting_port} are open between the nodes")
    if out:
        names = "; ".join(f"{m.who(r)} kept out: {n.get('why') or 'no reason given'}" for r, n in sorted(out.items()))
        first = min(out)
        return (f"{m.who(first)} kept out of the group" + (f" (and {len(out) - 1} more)" if len(out) > 1 else ""),
                names, f"fix {', '.join(m.who(r) for r in sorted(out))} (its own report names the fault), then run the group again")
    if g.missing:
        names = ", ".join(m.who(r) for r in g.missing)
        return (f"{names} did not come to the {g.phase} meeting within {timeout:g} s",
                f"{names} never posted at {m.group.host}:{m.group.meeting_port} (id {m.group.rdzv_id}): not started, started with another --rdzv-id or --nnodes, stuck, or cut off from the network",
                "start preflight on every node with the same --nnodes, --rdzv-endpoint and --rdzv-id; raise --rdzv-timeout if the nodes start minutes apart")
    return None


GROUP_CHECKS = ("nccl", "bandwidth")  # run across the group; every other check runs on each node alone


def gate(ctx: Any, check: Any) -> Any:
    """Before a group check: meet the others. A Result when this check must not
    run (this node stays out, or the group cannot go on), else None."""
    from preflight.base.findings import Status

    m: Meeting | None = ctx.meeting
    if m is None:
        return None
    if check.name not in GROUP_CHECKS:
        if m.reached in GROUP_CHECKS and m.final is None:
            after(ctx, list(ctx.results.values()))
        return None
    failed, why = _first_failure(ctx.results.values())
    timeout = ctx.settings.rdzv_timeout if check.name == GROUP_CHECKS[0] else after_timeout(ctx)
    g = m.call(check.name, {"ok": failed is None, "why": why}, timeout)
    size = f"{m.group.nnodes}-node group"
    found = problem(m, g, timeout)
    m.broken = m.broken or failed is not None or found is not None
    if failed is not None:
        return check.result(Status.SKIP, f"kept out of the {size}: {failed.check} did not pass; the other nodes were told", details={"meeting": _said(m, g)})
    if found:
        summary, cause, remedy = found
        return check.result(Status.FAIL, summary, cause=cause, remedy=remedy, details={"meeting": _said(m, g)})
    return None


def _first_failure(results: Any) -> tuple[Any, str | None]:
    """The first check that failed or errored, and how a peer is told of it."""
    from preflight.base.findings import Status

    failed = next((r for r in results if r.status in (Status.FAIL, Status.ERROR)), None)
    return failed, (f"its {failed.check} check did not pass ({failed.status.value}): {failed.summary}" if failed else None)


def after_timeout(ctx: Any) -> float:
    """How long a node waits for its peers after a group check: they ran the same
    collectives and end within one collective's timeout of each other."""
    op = ctx.profile.nccl.op_timeout_seconds if ctx.profile.nccl else 30.0
    return min(ctx.settings.rdzv_timeout, max(20.0, 2 * op))


def _said(m: Meeting, g: Gathered) -> dict[str, Any]:
    return {"phase": g.phase, "seconds": g.seconds, "error": g.error, "missing": [m.who(r) for r in g.missing],
            "nodes": {str(r): {k: v for k, v in n.items() if k in ("ok", "why", "host", "addr")} for r, n in sorted(g.nodes.items())}}


def secret_of(said: Any) -> str | None:
    """Node rank 0's secret as the meeting point's store gave it, where it has the shape rank 0 makes
    (token_hex(16)). Anyone who reaches the store may have written it: a forged one leaves this node
    out of the group's launch (a FAIL), and one with a NUL byte, taken as it came, broke the launch
    itself (an ERROR, exit 3)."""
    return said if isinstance(said, str) and re.fullmatch(r"[0-9a-f]{32}", said) else None


def torchrun_group(ctx: Any, check: str, left: float) -> launch.Group | None:
    """How this node's torchrun joins the group's, for a group check; None alone."""
    m: Meeting | None = ctx.meeting
    if m is None:
        return None
    # An id per check: a node that finished nccl first must not join rank 0's nccl store, still closing, for bandwidth.
    # Node rank 0's secret for this run makes it one nobody outside the group can guess.
    rid = f"{m.group.rdzv_id}-{check}" + (f"-{m.secret}" if m.secret else "")
    return launch.Group(m.group.nnodes, m.group.node_rank, m.group.endpoint, rid, m.side.addr, m.side.ifname, max(5.0, min(60.0, left / 3)))


def after(ctx: Any, results: list[Any]) -> None:
    """Right after the last group check (before train, which runs alone): meet once more
    to tell what this node found. A peer that does not come stopped answering: it is
    named in this node's failed group checks. Once per run; nothing after a broken meeting."""
    from preflight.base.findings import Status

    m: Meeting = ctx.meeting
    if m.reached not in GROUP_CHECKS or m.broken:
        return
    ours = [r for r in results if r.check in GROUP_CHECKS]
    failed, why = _first_failure(ours)
    post = {"ok": failed is None, "why": why,
            "checks": {r.check: r.status.value for r in ours},
            "figures": {f"{x.name}{'/' + x.labels['stat'] if 'stat' in x.labels else ''}": x.value for r in ours for x in r.measurements if x.name.startswith("internode_")}}
    timeout = after_timeout(ctx)
    m.final = m.call("after", post, timeout, wait_all=True)
    gone = [m.who(r) for r in m.final.missing] + ([m.who(0) + " (it hosts the meeting point)"] if m.final.error and m.group.node_rank != 0 else [])
    for r in m.final.missing:
        m.last.pop(r, None)  # what it said earlier is not how it ended
    if gone:
        said = f"{', '.join(gone)} stopped answering: not at the last meeting within {timeout:g} s (dead, hung, or cut off from the network)"
        for r in ours:
            if r.status is Status.FAIL:
                r.summary, r.cause = f"{r.summary} ({', '.join(gone)} stopped answering)", f"{r.cause or r.summary}; {said}"


def finish(ctx: Any, results: list[Any]) -> dict[str, Any]:
    """After the checks: a node that never met says it stays out; one that ran the group
    checks meets after them if it has not yet. Node rank 0 then keeps the store until
    every node still to come or still reading has said bye."""
    from preflight.base.findings import Status

    m: Meeting = ctx.meeting
    g = m.group
    if m.reached is None:  # fail-fast stopped this node before nccl: tell the others it stays out
        why = _first_failure(results)[1] or "it ran no group check"
        m.final = m.call("nccl", {"ok": False, "why": why}, ctx.settings.rdzv_timeout)
        told = "the other nodes were told" if not m.final.error else f"the other nodes could not be told ({m.final.error})"
        for r in results:
            if r.check in GROUP_CHECKS and r.status is Status.SKIP:
                r.summary = f"{r.summary}; kept out of the {g.nnodes}-node group, {told}"
    else:
        after(ctx, results)
    if g.node_rank == 0:
        if m.final is not None and m.final.phase == "after" and not m.broken:
            m.close([r for r in range(1, g.nnodes) if r in m.final.nodes], BYE)
        else:  # the group broke: peers may still be on their way to hear why; wait for them, not for the known missing
            m.close([r for r in range(1, g.nnodes) if r not in m.missing], ctx.settings.rdzv_timeout)
    # A peer's post is taken as it came but for these two, which the report's reader relies on.
    nodes = [{**{k: v for k, v in n.items() if k not in ("phase", "node_rank", "ok")}, "node_rank": r, "ok": n.get("ok") is True} for r, n in sorted(m.last.items())]
    missing = [r for r in range(g.nnodes) if r not in m.last and r != g.node_rank]  # this node came, whatever it heard
    error = m.final.error if m.final else None
    return {"nnodes": g.nnodes, "node_rank": g.node_rank, "endpoint": g.endpoint, "rdzv_id": g.rdzv_id, "local_addr": m.side.addr,
            "passed": not missing and not error and len(nodes) == g.nnodes and all(n.get("ok") for n in nodes), "nodes": nodes, "missing": missing,
            "meeting_error": error}


def verdict_line(group: dict[str, Any]) -> str:
    """One line for the console: which nodes of the group did not pass or never came."""
    bad = [f"node {n['node_rank']} ({n.get('host') or '?'}): {n.get('why') or 'did not pass'}" for n in group["nodes"] if not n.get("ok")]
    bad += [f"node {r}: did not come or stopped answering" for r in group["missing"]]
    if group.get("meeting_error"):
        bad.append(group["meeting_error"])
    return f"{group['nnodes']}-node group did not pass: " + "; ".join(bad or ["see the group checks"])
