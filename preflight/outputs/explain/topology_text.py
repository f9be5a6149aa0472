"""The text and JSON of `preflight topology`: the topology check's facts,
judges and advice, outside a run, for this machine or a saved `nvidia-smi
topo -m` capture from any machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from preflight.base.errors import UsageError
from preflight.base.findings import Finding, Status
from preflight.base.host import Host
from preflight.checkkit.placement import Advice, advise
from preflight.checkkit.topology_judges import name_list
from preflight.checks.topology import ANY_SKU, Topology, gather, judge, sources
from preflight.pipeline import plan as pipeline
from preflight.pipeline import profile_detect
from preflight.pipeline.profiles import ResolvedProfile
from preflight.pipeline.settings import Settings
from preflight.pipeline.shape import NodeShape
from preflight.readers import capture
from preflight.readers.nvidia import nvml, topo
from preflight.readers.machine.layout import TopologyFacts, machine_cpus, nics
from preflight.readers.machine.layout_queries import gpu_numa, nvlink_count
from preflight.readers.nvidia.topo import NEAR, Topo

FAIL = Status.FAIL


class Unreadable(Exception):
    """This machine's layout cannot be read; the message says why and what to do instead.
    ``shown``: what could be read all the same (text, JSON): the CPUs, NUMA nodes and NICs."""

    def __init__(self, message: str, shown: tuple[str, dict] | None = None):
        super().__init__(message)
        self.shown = shown


def explain_capture(path: Path, settings: Settings, profile_named: bool) -> tuple[str, dict, bool]:
    """`preflight topology --from FILE`: judged against the profile only where one is named.
    Raises UsageError for a file that is no `nvidia-smi topo -m` output."""
    text = capture.read_text(path, topo.MAX_BYTES, "an `nvidia-smi topo -m` output is a few KiB; is this the right file?")
    try:
        facts = from_text(text, str(path))
    except topo.TopoParseError as e:
        raise UsageError(f"--from {path}: {e}; pass the unedited output of `nvidia-smi topo -m`") from None
    resolved = pipeline.resolve_profile(settings) if profile_named else None
    return explain(facts, resolved, live=False)  # a saved capture is judged by the profile's word, not a shape


def explain_host(settings: Settings, note: Callable[[str], None]) -> tuple[str, dict, bool]:
    """`preflight topology` on this machine; ``note`` hears that no profile could be picked.
    Raises Unreadable when NVML cannot answer; where `nvidia-smi topo -m` cannot, the
    layout comes from NVML and sysfs, and the text says so."""
    pipeline.check_inputs(settings)
    if settings.python is not None:
        pipeline.check_python_trusted(settings)  # the layout asks its torchrun, as root: no other user's
    host = Host()
    try:
        facts = from_host(host, settings)
    except nvml.NvmlUnavailable as e:
        # No GPU to lay out: the CPUs, NUMA nodes and NICs still are. A profile without GPUs
        # asks for nothing more; any other (auto, a GPU profile) cannot be judged here.
        text, data = cpu_layout(host, e.cause)
        if settings.profile != "auto" and not pipeline.resolve_profile(settings).has_gpus:
            return text, {**data, "profile": settings.profile}, False
        raise Unreadable(f"{e.cause}; {e.remedy}; to explain a saved capture use --from FILE", (text, data)) from None
    if facts.matrix is None:
        raise Unreadable(f"cannot read this machine's GPU topology: {facts.matrix_error}; to explain a saved capture use --from FILE")
    resolved = None
    try:
        resolved = pipeline.resolve_profile(settings)
    except profile_detect.DetectionFailed as e:
        note(f"judging without a profile: {e.cause}")
    fake = str(settings.nvml_fake) if settings.nvml_fake is not None else None
    return explain(facts, resolved, live=True, fake=fake, shape=pipeline.read_shape(settings, host))


def cpu_layout(host: Host, no_gpu: str) -> tuple[str, dict]:
    """This machine's CPUs, NUMA nodes and RDMA NICs, read from sysfs and its cpuset, where NVML
    shows no GPU (``no_gpu`` says why): (text for a person, JSON for a machine)."""
    cpus, found = machine_cpus(host), nics(host)
    quota = f", a cgroup quota of {cpus.quota:g} CPUs" if cpus.quota is not None else ""
    lines = [f"no GPU layout: NVML says {no_gpu}",
             f"CPUs online {cpus.online}; this process may use {cpus.allowed} ({cpus.usable():g} usable{quota})"]
    lines += [f"[NUMA node {node}  CPUs {cpu_list}]" for node, cpu_list in cpus.nodes.items()] or ["NUMA: sysfs lists no node"]
    for n in found:
        ports = ", ".join(f"port {p.port} {p.state}" + (f" {p.rate}" if p.rate else "") for p in n.ports) or "no port"
        where = f"NUMA node {n.numa_node}" if n.numa_node is not None else "NUMA unknown"
        lines.append(f"NIC {n.name} ({where}{', ' + '/'.join(n.netdevs) if n.netdevs else ''}): {ports}")
    if not found:
        lines.append("NICs: no RDMA NIC (/sys/class/infiniband)")
    data = {"gpus": [], "no_gpu": no_gpu, "machine": {"cpus": cpus.model_dump(mode="json"), "nics": [n.model_dump(mode="json") for n in found]}}
    return "\n".join(lines) + "\n", data


def explain(facts: TopologyFacts, profile: ResolvedProfile | None, live: bool, fake: str | None = None,
            shape: NodeShape | None = None) -> tuple[str, dict, bool]:
    """(text for a person, JSON for a machine, whether a finding failed).
    Without a profile only what needs no SKU is judged; ``fake`` names the
    --nvml-fake file, which, as in a run, fails closed; ``shape`` is this
    node's (None for a saved capture)."""
    floor = profile.floors["vcpus_per_gpu"].value if profile and "vcpus_per_gpu" in profile.floors else None
    parts = judge(facts, (profile.topology if profile else None) or ANY_SKU, floor, shape)
    if fake is not None:
        parts["source"] = [nvml.fake_finding(fake)]
    advice = advise(facts)
    data = facts.matrix.model_dump(mode="json") if facts.matrix else {}
    if live:
        data["machine"] = facts.model_dump(mode="json", include={"gpus", "nics", "cpus", "cuda_visible_devices", "torch_numa_binding"})
        data.update(sources(facts).details(), matrix_source=facts.matrix_source, unanswered=facts.unanswered)
    data["profile"] = profile.name if profile else None
    data["shape"] = shape.model_dump(mode="json") if shape else None
    data["findings"] = [{"part": part, "status": f.status.value, "summary": f.summary, "cause": f.cause, "remedy": f.remedy}
                        for part, found in parts.items() for f in found]
    data["advice"] = advice.model_dump(mode="json")
    judged = (f"profile {profile.name}" + ("" if profile.topology else " (no topology expectations: only what needs no SKU is judged)")
              if profile else "no profile (only what needs no SKU is judged)")
    text = render(facts, parts, advice).replace("\nfindings", f"\nfindings against {judged}", 1)
    if shape is not None:
        text = f"node: {shape.describe()}; GPUs from {shape.gpus_from}; links from {shape.fabric_from}\n" + text
    return text, data, any(f.status == FAIL for found in parts.values() for f in found)


def from_text(text: str, source: str) -> TopologyFacts:
    """A saved capture from another machine: the matrix is all there is. Raises TopoParseError."""
    return TopologyFacts(matrix=topo.parse(text), matrix_source=source)


def from_host(host: Host, settings: Settings) -> TopologyFacts:
    """This machine, live. Raises NvmlUnavailable."""
    return gather(host, settings, time.monotonic() + Topology.timeout_seconds)


def _link_summary(m: Topo) -> list[str]:
    by_type: dict[str, list[str]] = {}
    for pair, link in m.links.items():
        by_type.setdefault(link, []).append(pair)
    total = len(m.links)
    every = "the one GPU pair" if total == 1 else f"all {total} GPU pairs"
    return [f"{link}: {every if len(pairs) == total else name_list(pairs, 12)}"
            for link, pairs in sorted(by_type.items(), key=lambda kv: (-nvlink_count(kv[0]), kv[0]))]


def render(facts: TopologyFacts, parts: dict[str, list[Finding]], advice: Advice) -> str:
    m = facts.matrix
    lines = []
    if m is not None:
        lines.append(f"{len(m.gpus)} GPU(s), {len(m.nics)} NIC(s) from {facts.matrix_source}")
        lines.append(f"  {'GPU':<5} {'NUMA':<5} {'CPUs':<24} {'nearest NIC':<28} NVLink to peers")
        for g in m.gpus:
            node = gpu_numa(facts, g.index)
            near = m.nearest_nics.get(str(g.index), [])
            nic = f"{','.join(near)} ({g.nics[near[0]]})" if near else "-"
            peers = sorted({m.link(g.index, j) for j in range(len(m.gpus)) if j != g.index}, key=lambda t: (-nvlink_count(t), t))  # ties by name: a set's order changes with each process's hash seed
            lines.append(f"  GPU{g.index:<2} {node if node is not None else '?':<5} {g.cpu_affinity or '?':<24} {nic:<28} {'/'.join(peers) or '-'}")
        lines.append("")
        groups: dict[str, list[int]] = {}
        for g in m.gpus:
            node = gpu_numa(facts, g.index)
            key = f"NUMA node {node}" if node is not None else f"CPUs {g.cpu_affinity}" if g.cpu_affinity else "NUMA unknown"
            groups.setdefault(key, []).append(g.index)
        for key, gpus in groups.items():
            cpus = facts.cpus.nodes.get(key.removeprefix("NUMA node "), "") if facts.cpus and key.startswith("NUMA node") else ""
            cpus = cpus or (m.gpus[gpus[0]].cpu_affinity or "" if key.startswith("NUMA node") else "")
            lines.append(f"[{key}{f'  CPUs {cpus}' if cpus else ''}]")
            cells = []
            for i in gpus:
                near = [n for n in m.nearest_nics.get(str(i), []) if m.gpus[i].nics[n] in NEAR]
                cells.append(f"GPU{i}" + (f" -- {'/'.join(near)}" if near else ""))
            lines.append("  " + "   ".join(cells))
        used = {n for g in m.gpus for n, t in g.nics.items() if t in NEAR}
        others = [n for n in m.nics if n not in used]
        if others:
            lines.append(f"  NICs beside no GPU: {', '.join(others)}")
        lines += [f"  {s}" for s in _link_summary(m)] if m.links else []
        lines += [f"  note: {n}" for n in m.notes]
        lines += [f"  unanswered: {fact}: {why}" for fact, why in facts.unanswered.items()]
        if facts.matrix_error and (unread := sources(facts).line()):
            lines.append(f"  {unread}")
    else:
        lines.append(f"no GPU link matrix: {facts.matrix_error}")
    findings = [f for found in parts.values() for f in found]
    lines.append("")
    lines.append("findings:" if findings else "findings: none")
    for f in sorted(findings, key=lambda f: f.status != FAIL):
        lines += [f"  {f.status.value:<4}  {f.summary}", f"        cause: {f.cause}", f"        fix:   {f.remedy}"]
    lines += ["", f"advice: {advice.summary}"]
    for r in advice.ranks:
        nic = f"  NIC {r.nic} ({r.nic_link})" if r.nic else ""
        lines.append(f"  local rank {r.local_rank} -> GPU{r.gpu}  NUMA {r.numa_node if r.numa_node is not None else '?'}  CPUs {r.cpus or ('none allowed' if facts.live else '?')}{nic}")
    lines += [f"  $ {cmd}" for cmd in advice.launch]
    if advice.launch:
        lines.append("  (put the job's own command where these say `train.py` / `python train.py`)")
    return "\n".join(lines) + "\n"
