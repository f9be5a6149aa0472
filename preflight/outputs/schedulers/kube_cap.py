"""The cap on taints: how many of the cluster's nodes preflight may hold tainted at once.

A bad floor, a bad driver rollout or a preflight bug makes every node fail at once;
tainting them all would empty the cluster (NVIDIA NVSentinel caps its quarantines for
the same reason). kube-label counts the nodes that already carry preflight's taint
on the node list and adds no taint past ``share`` of the nodes (at least one); the
textfile it then writes for node_exporter says so, and
examples/prometheus/preflight-kube-rules.yml alerts on it.
"""

from __future__ import annotations

from typing import NamedTuple

from preflight.base.actions import cap_allows

TEXTFILE = "preflight-kube.prom"  # beside run's preflight.prom in node_exporter's textfile directory


class Count(NamedTuple):
    tainted: int  # nodes carrying preflight's taint (this one has none when it is counted)
    nodes: int
    allowed: int  # max(1, floor(share x nodes))

    @property
    def full(self) -> bool:
        return self.tainted >= self.allowed


def count(tainted: int, nodes: int, share: float) -> Count:
    return Count(tainted, nodes, cap_allows(share, nodes))


def would_taint(c: Count, share: float) -> str:
    return (f"would taint: {c.tainted} of {c.nodes} nodes already tainted by preflight, past the cap "
            f"({share:.0%} of the nodes, at least 1: --taint-cap)")


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def textfile(node: str, held: bool, counted: Count | None) -> str:
    """What `kube-label --textfile-dir` leaves for node_exporter: whether the cap holds a taint
    back from this node, and the counts where a taint was weighed this round."""
    n = _label(node)
    lines = ["# HELP preflight_kube_taint_held 1 while kube-label leaves this node untainted that it would taint: the cluster is past the cap",
             "# TYPE preflight_kube_taint_held gauge",
             f'preflight_kube_taint_held{{node="{n}"}} {1 if held else 0}']
    if counted is not None:
        for name, doc, value in (("tainted_by_preflight", "nodes of the cluster carrying preflight's taint", counted.tainted),
                                 ("cluster_nodes", "nodes in the cluster", counted.nodes),
                                 ("taint_allowed", "taints by preflight the cap allows in the cluster", counted.allowed)):
            lines += [f"# HELP preflight_kube_{name} {doc}", f"# TYPE preflight_kube_{name} gauge", f'preflight_kube_{name}{{node="{n}"}} {value}']
    return "\n".join(lines) + "\n"
