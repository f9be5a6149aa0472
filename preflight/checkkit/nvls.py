"""Which algorithm NCCL ran the all_reduce with on an NVSwitch node, NVLS (NVLink
SHARP, the switch reduces) or rings, and the busbw floor that fits it.

NVLS lifts an 8x H100 all_reduce from ~370 GB/s busbw to ~480 (NVIDIA's NCCL
team in NVIDIA/nccl-tests#212; NVIDIA/nccl-tests#309 and NVIDIA/nccl#2140
measured 368.8 and 370 with NVLS off). It is off where the site sets
NCCL_NVLS_ENABLE=0 (its buffers cost GPU memory), where NCCL_ALGO leaves it
out, and where the driver or the fabric has no multicast (VMs, older fabric
software); all of these are healthy. So a node is held to the NVLS floor only
where NVLS ran, and to the ring floor otherwise: a busbw between the two is
what rings give, not a broken NVLink.

"NVLS multicast support is available" does not mean NVLS ran: NCCL prints it
early in init (src/transport/nvls.cc ncclNvlsInit), and clears NVLS later
when its graph search found no NVLS channels (src/init.cc: "if
(graphs[NCCL_ALGO_NVLS]->nChannels == 0) comm->nvlsSupport =
comm->nvlsChannels = 0;"), before it prints "%d coll channels, %d collnet
channels, %d nvls channels, ..." (src/init.cc, NVIDIA/nccl 5067397). So the
fact comes, first, from a setting that leaves NVLS out of the all_reduce
(NCCL_ALGO, NCCL_NVLS_ENABLE=0): NCCL sets its NVLS channels up whatever
NCCL_ALGO says (ncclNvlsInit counts them from NCCL_NVLS_ENABLE and multicast
alone) and NCCL_ALGO only zeroes the tuner's bandwidth for the algorithms it
leaves out (src/graph/tuning.cc ncclTopoTuneModel), so under NCCL_ALGO=Ring
the log still says "16 nvls channels" while the all_reduce runs rings. Then the
bandwidth stage's own NCCL lines: K nvls channels, K above 0, NVLS ran for its
collectives; 0, or "not available", it did not. Then the nccl check's "NVLS
multicast support is (not) available" line. Where "available"
is all any source said, NVLS may or may not have run: a busbw between the
ring and the NVLS floors names both causes, never NVLink alone.
"""

from __future__ import annotations

from pydantic import BaseModel

from preflight.base.findings import Finding, Status
from preflight.base.units import fmt_value
from preflight.pipeline.profiles import ResolvedFloor
from preflight.readers.nccl import nccl_env
from preflight.readers.nccl.nccl_log import Summary

NVLS_FLOOR = "allreduce_bus_bandwidth"  # the profile's all_reduce floor: NVLS's where the profile has a ring one too
RING_FLOOR = "allreduce_bus_bandwidth_ring"


class Nvls(BaseModel):
    on: bool | None  # whether NVLS ran; None: no source said
    source: str  # which source answered, in words; or why none did
    available: bool = False  # with on None: NCCL said NVLS multicast is available, not whether it ran


def from_stage(log: Summary | None) -> Nvls | None:
    """The bandwidth stage's own NCCL lines: whether its collectives' communicator set NVLS up."""
    if log is None:
        return None
    where = "NCCL's log of the bandwidth stage"
    if log.nvls_channels:
        return Nvls(on=True, source=f"{where}: {log.nvls_channels} nvls channels (NCCL set NVLS up for its collectives)")
    if log.nvls_channels == 0:
        return Nvls(on=False, source=f"{where}: 0 nvls channels (NCCL set no NVLS up for its collectives)")
    if log.nvls is False:
        return Nvls(on=False, source=f"{where}: NVLS multicast support is not available")
    return None


def from_shared(nccl_details: dict | None, stage_world: dict | None) -> Nvls | None:
    """The nccl check's "K nvls channels" line, where the bandwidth stage reused the communicator
    the nccl stage made: NCCL prints the line once, at the communicator's init, which in a shared
    launch (gpuwork/world.py; _rank.init_group keeps the group) happened in the nccl stage."""
    d = nccl_details or {}
    channels, world = (d.get("nccl_log") or {}).get("nvls_channels"), d.get("world") or {}
    if channels is None or not stage_world or world.get("launch") != stage_world.get("launch") or world.get("ended_it", True):
        return None
    where = f"NCCL's log of the nccl check, whose communicator the bandwidth stage reused (launch {world['launch']})"
    if channels:
        return Nvls(on=True, source=f"{where}: {channels} nvls channels (NCCL set NVLS up for it)")
    return Nvls(on=False, source=f"{where}: 0 nvls channels (NCCL set no NVLS up for it)")


def from_env(env: dict[str, list[tuple[str, str]]]) -> Nvls | None:
    """NCCL's settings (nccl_env.read): None where they leave NVLS to NCCL."""
    effective = nccl_env.effective(env)
    value, where = effective.get("NCCL_NVLS_ENABLE", ("", ""))
    if value.strip() == "0":
        return Nvls(on=False, source=f"NCCL_NVLS_ENABLE=0 in {where}")
    algo, where = effective.get("NCCL_ALGO", ("", ""))
    if algo.strip() and not allows_nvls(algo):
        return Nvls(on=False, source=f"NCCL_ALGO={algo.strip()} in {where} leaves NVLS out of the all_reduce")
    return None


def allows_nvls(algo: str) -> bool:
    """Whether NCCL_ALGO lets the one-node all_reduce use NVLS, read as NCCL's parseList
    (src/graph/tuning.cc) reads it: ";"-separated entries, the first of which may have no
    "function:" prefix and then sets every collective; each later entry for allreduce sets
    it anew; a list ("Ring,Tree") enables only those, "^" every algorithm but those. Names
    match whole, case aside: NVLSTree is another algorithm, off on one node (tuning.cc)."""
    allowed = True
    for entry in (e for e in algo.split(";") if e):
        parts = [p for p in entry.split(":") if p]  # strtok: the prefix, then the list
        if not parts:
            continue
        prefix, names = (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
        if prefix is not None and prefix.strip().lower() != "allreduce":
            continue  # another collective's entry
        excluded = names.startswith("^")
        listed = {n.strip().lower() for n in names.removeprefix("^").split(",") if n.strip()}
        allowed = ("nvls" not in listed) if excluded else ("nvls" in listed)
    return allowed


def from_log(nccl_details: dict | None) -> Nvls | None:
    """The nccl check's reading of NCCL's INFO lines (details.nccl_log.nvls): "not available"
    means NVLS did not run; "available" only that it could have (``available``, ``on`` None)."""
    said = ((nccl_details or {}).get("nccl_log") or {}).get("nvls")
    if said is None:
        return None
    words = "available" if said else "not available"
    source = f"NCCL's log of the nccl check: NVLS multicast support is {words}"
    return Nvls(on=None, available=True, source=source) if said else Nvls(on=False, source=source)


def decide(env: dict[str, list[tuple[str, str]]], nccl_details: dict | None, stage_log: Summary | None = None,
           stage_world: dict | None = None) -> Nvls:
    """A setting that leaves NVLS out of the all_reduce first (NCCL obeys it, and still sets NVLS
    channels up under NCCL_ALGO: the module's docstring); then what the bandwidth stage's
    communicator set up: its own NCCL lines, or the nccl check's where it reused that stage's
    communicator (``stage_world``: its launch and stage); then the nccl check's NVLS line."""
    found = from_env(env) or from_stage(stage_log) or from_shared(nccl_details, stage_world) or from_log(nccl_details)
    if found is None and stage_log is not None and stage_log.nvls:
        found = Nvls(on=None, available=True, source="NCCL's log of the bandwidth stage: NVLS multicast support is available")
    if found is not None:
        return found
    why = "the nccl check did not run" if nccl_details is None else "NCCL's log of the nccl check has no NVLS line (NCCL_DEBUG=INFO output missing, or an NCCL before 2.17)"
    return Nvls(on=None, source=f"unknown: no NCCL setting names it and {why}")


def fit(floors: dict[str, ResolvedFloor], nvls: Nvls) -> dict[str, ResolvedFloor]:
    """The floors with the all_reduce's set to the algorithm NCCL ran: the NVLS floor
    where NVLS ran, the ring floor where it was off or no source said (never fail a
    healthy node for a fact nobody answered; ``explain`` says what it means)."""
    out = dict(floors)
    ring = out.pop(RING_FLOOR, None)
    top = out.get(NVLS_FLOOR)
    # A site's own all_reduce floor (config) was set for its node as it runs, NVLS or not: it stands.
    if ring is not None and top is not None and top.from_profile and nvls.on is not True:
        out[NVLS_FLOOR] = ring
    return out


def explain(values: list[float], floors: dict[str, ResolvedFloor], nvls: Nvls) -> tuple[list[Finding], list[str]]:
    """For an all_reduce busbw under the NVLS floor but at or over the ring floor: with NVLS
    off, a line saying rings explain it (the site's choice, no finding); with no source
    answering, or NCCL saying only that NVLS is available, a WARN naming both causes, since
    the judge lacks the fact that tells a healthy ring from a degraded NVLS. Under the ring floor the floors' own FAIL (NVLink, NVSwitch) stands."""
    top, ring = floors.get(NVLS_FLOOR), floors.get(RING_FLOOR)
    if not values or top is None or ring is None or nvls.on is True or not top.from_profile:
        return [], []
    low = min(values)
    if not ring.value <= low < top.value:
        return [], []
    busbw, nvls_floor, ring_floor = fmt_value(low, top.unit), fmt_value(top.value, top.unit), fmt_value(ring.value, ring.unit)
    if nvls.on is False:
        return [], [f"all_reduce busbw {busbw} is what NCCL's rings give: NVLS was off ({nvls.source}), so it is judged against the ring floor "
                    f"{ring_floor} ({ring.source}), not the NVLS floor {nvls_floor}"]
    under = (f"all_reduce busbw {busbw} is under the NVLS floor {nvls_floor} ({top.source}) and at or over the ring floor {ring_floor} "
             f"({ring.source})")
    if nvls.available:
        # NCCL drops NVLS after this line when its graph search finds no NVLS channels (src/init.cc).
        cause = (f"{under}: either NVLS was not used by this communicator (NCCL said only that multicast is available: {nvls.source}; "
                 f"it still runs rings where it sets no NVLS channels up) or NVLink/NVSwitch is degraded, and no line of NCCL's said which")
        remedy = ("read NCCL's \"K nvls channels\" line with NCCL_DEBUG=INFO reaching the bandwidth stage (0: rings ran, this figure is theirs); "
                  "with NVLS channels set up, check NVLink and NVSwitch (`nvidia-smi nvlink -s`, fabric manager)")
        return [Finding(Status.WARN, f"all_reduce busbw {busbw}: NVLS may not have run", cause, remedy)], []
    cause = f"{under}: NVLS being off would explain it, a degraded NVLS would too, and no source said which ran ({nvls.source})"
    remedy = ("let NCCL_DEBUG=INFO reach the ranks (the bandwidth stage's \"K nvls channels\" line says whether NVLS ran), "
              "or set NCCL_NVLS_ENABLE=0 where NVLS is off on purpose")
    return [Finding(Status.WARN, f"all_reduce busbw {busbw}: NVLS state unknown", cause, remedy)], []
