"""A cap on how much of a partition preflight drains.

A bad floor, a bad driver rollout or a bad preflight release makes every node FAIL at
once, and a health check on every node would drain the whole partition (NVIDIA
NVSentinel caps its quarantines for the same reason, NVSentinel#1713). Before it
drains a node that is in service, slurm-healthcheck counts the nodes of the node's
partitions whose drain reason is preflight's own; where that count has reached the
share allowed (10% of the partition by default, at least one node), the node is left
in service and the output says "would drain", so an alert (not an outage) tells a
person. A node preflight already drained stays drained: the cap only stops new drains.
The count is each node's own, made when its check runs: checks of many nodes in the
same second each see it before the others' drains (slurm.conf.snippet: CYCLE).
"""

from __future__ import annotations

from typing import NamedTuple

from preflight.base.actions import cap_allows

DEFAULT_SHARE = 0.10
# `sinfo -h -N -p PARTS -o FORMAT`: one line per node and partition, the reason last (it may hold '|').
SINFO_FORMAT = "%N|%R|%E"


class Row(NamedTuple):
    node: str
    partition: str
    reason: str


class Count(NamedTuple):
    partition: str
    drained: int  # by preflight, other than this node
    nodes: int  # in the partition, this node among them
    allowed: int  # drains the share allows there


def parse_sinfo(text: str) -> list[Row]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 2)
        if len(parts) != 3:
            raise ValueError(f"sinfo printed {line[:100]!r}, not NODE|PARTITION|REASON")
        rows.append(Row(parts[0].strip(), parts[1].strip(), parts[2].strip()))
    return rows


def allowed(share: float, nodes: int) -> int:
    """How many of a partition's nodes preflight may hold drained: the share, at least one (as kube-label's taints)."""
    return cap_allows(share, nodes)


def counts(node: str, partitions: list[str], rows: list[Row], share: float, ours) -> list[Count]:  # noqa: ANN001
    """Per partition of ``node``: its nodes, and those preflight drained (``ours(reason)``), this node aside."""
    out = []
    for p in partitions:
        members = {r.node for r in rows if r.partition == p} | {node}
        drained = {r.node for r in rows if r.partition == p and r.node != node and ours(r.reason)}
        out.append(Count(p, len(drained), len(members), allowed(share, len(members))))
    return out


def past_cap(found: list[Count]) -> Count | None:
    """The partition where one more drain would pass the cap (the fullest), or None."""
    full = [c for c in found if c.drained >= c.allowed]
    return max(full, key=lambda c: c.drained / c.nodes) if full else None


def would_drain(c: Count, share: float) -> str:
    return (f"would drain: {c.drained} of {c.nodes} nodes already drained by preflight, past the cap "
            f"({share:.0%} of partition {c.partition}, at least 1 node; --drain-cap)")


TEXTFILE = "preflight-slurm.prom"  # beside run's preflight.prom in node_exporter's textfile directory


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def textfile(node: str, held: Count | None, counted: list[Count]) -> str:
    """What `slurm-healthcheck --textfile-dir` leaves for node_exporter: whether it holds a drain back
    (examples/prometheus/preflight-rules.yml alerts on it), and the counts where it made them."""
    n = _label(node)
    lines = ["# HELP preflight_slurm_drain_held 1 while slurm-healthcheck leaves this node in service that it would drain: the partition is past the cap",
             "# TYPE preflight_slurm_drain_held gauge",
             f'preflight_slurm_drain_held{{node="{n}"}} {1 if held else 0}']
    for name, doc, value in (("drained_by_preflight", "nodes of the partition drained by preflight, this one aside", lambda c: c.drained),
                             ("partition_nodes", "nodes in the partition", lambda c: c.nodes),
                             ("drain_allowed", "drains by preflight the cap allows in the partition", lambda c: c.allowed)):
        if counted:
            lines += [f"# HELP preflight_slurm_{name} {doc}", f"# TYPE preflight_slurm_{name} gauge"]
            lines += [f'preflight_slurm_{name}{{node="{n}",partition="{_label(c.partition)}"}} {value(c)}' for c in counted]
    return "\n".join(lines) + "\n"
