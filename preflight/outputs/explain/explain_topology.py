"""`preflight explain` of an `nvidia-smi topo -m` matrix: the topology check's
judges (checks/topology.py) over the capture, exactly as `preflight topology
--from FILE` runs them (outputs/explain/topology_text.py: no node shape, the profile's
[topology] where one is named, else only what needs no SKU), and the facts:
GPUs with their NUMA and CPU affinity, NICs, the link of every GPU pair, and
the per-rank pinning advice.
"""

from __future__ import annotations

from preflight.base.errors import UsageError
from preflight.checkkit.placement import advise
from preflight.checks.topology import ANY_SKU, judge
from preflight.outputs.explain import topology_text
from preflight.outputs.explain.explained import Explained, items
from preflight.pipeline.profiles import ResolvedProfile
from preflight.readers.nvidia import topo
from preflight.readers.machine.layout import TopologyFacts

KIND, TITLE = "topology", "nvidia-smi topo -m"
UNEDITED = "pass the unedited output of `nvidia-smi topo -m`"  # what `topology --from` says of a damaged matrix


def _facts(facts: TopologyFacts, profile: ResolvedProfile | None) -> dict:
    """The matrix as `topology --from --json` prints it (GPUs with their CPU and NUMA affinity and
    NIC links, NICs, the link of every GPU pair, nearest NICs), the profile and the pinning advice."""
    assert facts.matrix is not None  # from_text either reads a matrix or raises
    return {
        **facts.matrix.model_dump(mode="json"),
        "profile": profile.name if profile else None,
        "judged_against": (f"profile {profile.name}" + ("" if profile.topology else " (no topology expectations: only what needs no SKU)")
                           if profile else "no profile (only what needs no SKU is judged)"),
        "advice": advise(facts).model_dump(mode="json"),
    }


def explain(text: str, source: str, profile: ResolvedProfile | None) -> Explained:
    """Refuses a damaged matrix in `topology --from`'s words."""
    try:
        facts = topology_text.from_text(text, source)
    except topo.TopoParseError as e:
        raise UsageError(f"{source}: {e}; {UNEDITED}") from None
    floor = profile.floors["vcpus_per_gpu"].value if profile and "vcpus_per_gpu" in profile.floors else None
    parts = judge(facts, (profile.topology if profile else None) or ANY_SKU, floor, None)
    return Explained(kind=KIND, title=TITLE, source=source,
                     findings=[i for found in parts.values() for i in items(found)], facts=_facts(facts, profile))
