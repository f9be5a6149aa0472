"""Which algorithm NCCL ran the all_reduce with on an NVSwitch node, NVLS (NVLink
SHARP, the switch reduces) or rings, and the busbw floor that fits it.

NVLS lifts an 8x H100 all_reduce from ~370 GB/s busbw to ~480 (NVIDIA's NCCL
team in NVIDIA/nccl-tests#212; NVIDIA/nccl-tests#309 and NVIDIA/nccl#2140
measured 368.8 and 370 with NVLS off). It is off where the site sets
NCCL_NVLS_ENABLE=0 (its buffers cost GPU memory), where NCCL_ALGO leaves it
out, and where the driver or the fabric has no multicast (VMs, older fabric
software); all of these are healthy. So a node is held to the NVLS floor only
where NVLS ran, and to the ring floor otherwise: a busbw between the two is
what rings give, not a broken NVLink. The fact comes from whichever source
answered: the environment NCCL runs under (a setting wins), else NCCL's own
"NVLS multicast support is (not) available" line in the nccl check's log.
"""

from __future__ import annotations

from pydantic import BaseModel

from preflight.base.findings import Finding, Status
from preflight.base.units import fmt_value
from preflight.pipeline.profiles import ResolvedFloor
from preflight.readers import nccl_env

NVLS_FLOOR = "allreduce_bus_bandwidth"  # the profile's all_reduce floor: NVLS's where the profile has a ring one too
RING_FLOOR = "allreduce_bus_bandwidth_ring"


class Nvls(BaseModel):
    on: bool | None  # None: no source said
    source: str  # which source answered, in words; or why none did


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
    """Whether NCCL_ALGO lets the all_reduce use NVLS: a list ("Ring,Tree"), an exclusion
    ("^NVLS"), or per collective since NCCL 2.24 ("allreduce:ring;allgather:ring")."""
    v = algo.strip().lower()
    if ":" in v:
        per = dict(part.split(":", 1) for part in v.split(";") if ":" in part)
        if "allreduce" not in per:
            return True  # the all_reduce is left to NCCL
        v = per["allreduce"].strip()
    names = [n.strip() for n in v.lstrip("^").split(",")]
    if v.startswith("^"):
        return "nvls" not in names
    return any(n.startswith("nvls") for n in names)


def from_log(nccl_details: dict | None) -> Nvls | None:
    """The nccl check's reading of NCCL's INFO lines (details.nccl_log.nvls)."""
    said = ((nccl_details or {}).get("nccl_log") or {}).get("nvls")
    if said is None:
        return None
    words = "available" if said else "not available"
    return Nvls(on=bool(said), source=f"NCCL's log of the nccl check: NVLS multicast support is {words}")


def decide(env: dict[str, list[tuple[str, str]]], nccl_details: dict | None) -> Nvls:
    """The environment first (NCCL obeys it whatever the hardware offers), then NCCL's own log."""
    found = from_env(env) or from_log(nccl_details)
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
    if ring is not None and top is not None and top.origin.startswith("profile") and nvls.on is not True:
        out[NVLS_FLOOR] = ring
    return out


def explain(values: list[float], floors: dict[str, ResolvedFloor], nvls: Nvls) -> tuple[list[Finding], list[str]]:
    """For an all_reduce busbw under the NVLS floor but at or over the ring floor: with NVLS
    off, a line saying rings explain it (the site's choice, no finding); with no source
    answering, a WARN, since the judge lacks the fact that tells a healthy ring from a
    degraded NVLS. Under the ring floor the floors' own FAIL (NVLink, NVSwitch) stands."""
    top, ring = floors.get(NVLS_FLOOR), floors.get(RING_FLOOR)
    if not values or top is None or ring is None or nvls.on is True or not top.origin.startswith("profile"):
        return [], []
    low = min(values)
    if not ring.value <= low < top.value:
        return [], []
    busbw, nvls_floor, ring_floor = fmt_value(low, top.unit), fmt_value(top.value, top.unit), fmt_value(ring.value, ring.unit)
    if nvls.on is False:
        return [], [f"all_reduce busbw {busbw} is what NCCL's rings give: NVLS was off ({nvls.source}), so it is judged against the ring floor "
                    f"{ring_floor} ({ring.source}), not the NVLS floor {nvls_floor}"]
    cause = (f"all_reduce busbw {busbw} is under the NVLS floor {nvls_floor} ({top.source}) and at or over the ring floor {ring_floor} "
             f"({ring.source}): NVLS being off would explain it, a degraded NVLS would too, and no source said which ran ({nvls.source})")
    remedy = ("run the nccl check before bandwidth with NCCL_DEBUG=INFO reaching it (its log says whether NVLS multicast is available), "
              "or set NCCL_NVLS_ENABLE=0 where NVLS is off on purpose")
    return [Finding(Status.WARN, f"all_reduce busbw {busbw}: NVLS state unknown", cause, remedy)], []
