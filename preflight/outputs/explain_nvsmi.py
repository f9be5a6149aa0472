"""`preflight explain` for a saved `nvidia-smi -q`: judged by the cuda check's own
judge (one judge, two readers), so a pasted capture and a live run say the same
about the same GPU.

Each GPU block becomes the `nvml.Gpu` NVML would have answered, and the whole
capture an `Inventory` for `judge_inventory`. Two things differ from a live run:

- One snapshot is one reading, so every clocks-event reason printed Active counts
  as held (as a FakeNvml file of one reading does).
- The PCIe generation is judged only where the capture shows the GPU at work
  (a P0-P2 state, not idle, utilization above 0 % where printed): an idle GPU
  drops its link to Gen1 to save power, and that is no fault. The width is
  judged always, as the cuda check judges it.

The judge names a GPU by its NVML index; a capture has no index (a paste may
hold the second GPU of four), so every finding names the GPU by the bus id the
capture prints, and `nvidia-smi -i` takes that bus id.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from preflight.checks import cuda
from preflight.outputs.explained import Explained, Item, items
from preflight.pipeline.profiles import ResolvedProfile
from preflight.readers import nvml, nvsmi

KIND, TITLE = "nvidia-smi-q", "nvidia-smi -q"
_WORKING = ("P0", "P1", "P2")  # the performance states a GPU holds under load (P8 and above: idle)


def explain(text: str, source: str, profile: ResolvedProfile | None = None) -> Explained:
    capture = nvsmi.parse(text)
    expect = profile.gpu if profile else None
    if expect is not None and capture.driver_version is None:
        # A fragment without its header: the driver floor cannot be judged, the rest can.
        expect = expect.model_copy(update={"driver_min": ""})
    gpus = [to_gpu(i, g) for i, g in enumerate(capture.gpus)]
    names = [_name(g, i, len(capture.gpus)) for i, g in enumerate(capture.gpus)]
    loaded = {gpu.pci_bus_id: link for gpu, g in zip(gpus, capture.gpus) if (link := under_load(g)[0])}
    inventory = nvml.Inventory(driver_version=capture.driver_version or "", cuda_driver_version=capture.cuda_version,
                               gpus=gpus, source=f"nvidia-smi -q {source}")
    found: list[Item] = []
    for f in cuda.judge_inventory(inventory, None, expect, None, loaded):
        who = next((i for i, gpu in enumerate(gpus) if cuda._who(gpu) in f.summary), None)
        if who is None:
            found += items([f])
            continue
        bus = capture.gpus[who].bus_id
        renamed = {k: _rename(getattr(f, k), gpus[who], names[who], bus) for k in ("summary", "cause", "remedy")}
        found += items([dataclasses.replace(f, **renamed)], gpu=bus or (names[who] if len(gpus) > 1 else None))
    facts: dict[str, Any] = capture.model_dump(mode="json")
    for g, name, out in zip(capture.gpus, names, facts["gpus"]):
        out["clocks_events_active"] = g.events_active
        out["unjudged"] = unjudged(g)
        link, why = under_load(g)
        gen, top = g.pcie.gen_current, g.pcie.gen_max
        if link is None and gen and top and gen < top:
            found.append(Item(severity="info", summary=f"{name}: PCIe Gen{gen} of Gen{top} not judged", gpu=g.bus_id,
                              cause=f"{name} was not at work when captured ({why}): an idle GPU drops its link to Gen1 to save power",
                              fix="capture the whole `nvidia-smi -q` while a job loads the GPU (`-d` has no PCIe section), or run `preflight run --only cuda`, which reads the link under load"))
    return Explained(kind=KIND, title=TITLE, source=source, findings=found, facts=facts)


def to_gpu(index: int, g: nvsmi.SmiGpu) -> nvml.Gpu:
    """The facts NVML would have given for this block; None where the capture has none."""
    rows = g.remapped_rows
    complete = None not in (rows.correctable, rows.uncorrectable, rows.pending, rows.failure)
    return nvml.Gpu(
        index=index,
        name=g.product_name or "unknown GPU",
        uuid=g.uuid or "",
        # A stand-in: the capture's own bus id can be of any driver's form, and every finding is renamed anyway.
        pci_bus_id=f"00000000:{index // 32:02x}:{index % 32:02x}.0",
        pci_device_id=g.pci_device_id,
        persistence_mode=g.persistence_mode,
        mig_mode=g.mig_mode,
        memory_total_bytes=g.memory_total_mib * 2**20 if g.memory_total_mib is not None else None,
        ecc_mode=g.ecc.mode,
        ecc_uncorrectable_volatile=g.ecc.volatile_uncorrectable,
        ecc_uncorrectable_aggregate=g.ecc.aggregate_uncorrectable,
        retired_pages_pending=g.retired_pages.pending,
        remapped_rows=nvml.RemappedRows(**rows.model_dump()) if complete else None,
        pcie=nvml.PcieLink(gen=_lane(g.pcie.gen_current), width=_lane(g.pcie.width_current),
                           gen_max=_lane(g.pcie.gen_max), width_max=_lane(g.pcie.width_max)),
        clocks_events=g.events_active if g.clocks_events else None,
        clocks_events_transient=[] if g.clocks_events else None,
        temperature_c=g.temperature_c,
        power_limit_w=g.power_limit_w,
        power_default_limit_w=g.power_default_limit_w,
    )


def under_load(g: nvsmi.SmiGpu) -> tuple[nvml.PcieLink | None, str]:
    """The link as the judge's loaded reading where the capture shows the GPU at work, and why (not)."""
    state, idle, util = g.performance_state, g.clocks_events.get("gpu_idle"), g.utilization_gpu_pct
    seen = ", ".join(x for x in (state, f"{util} % utilization" if util is not None else None, "Idle reason active" if idle else None) if x)
    if state is None:
        return None, "no performance state printed"
    if state not in _WORKING or idle:
        return None, seen
    if util == 0 or (util is None and idle is None):
        return None, seen + ("" if util == 0 else ", neither utilization nor the Idle reason printed")
    return nvml.PcieLink(gen=_lane(g.pcie.gen_current), width=_lane(g.pcie.width_current)), seen


def unjudged(g: nvsmi.SmiGpu) -> dict[str, str]:
    """The rules the judge could not apply to this GPU, and why: a fragment judges what it holds."""
    def why(group: str) -> str:
        return "not in the capture" if group in g.not_printed else "printed N/A or blank"
    rows = g.remapped_rows
    out = {}
    if g.ecc.volatile_uncorrectable is None:
        out["ecc_volatile_uncorrectable"] = why("ecc")
    if None in (rows.correctable, rows.uncorrectable, rows.pending, rows.failure):
        out["remapped_rows"] = "printed N/A: this GPU does not remap rows" if g.remapped_rows_na else why("remap")
    if g.retired_pages.pending is None:
        out["retired_pages_pending"] = why("retired")
    if g.pcie.width_current is None or g.pcie.width_max is None:
        out["pcie_width"] = why("pcie")
    if under_load(g)[0] is None:
        out["pcie_generation"] = why("pcie") if g.pcie.gen_current is None else f"not at work when captured ({under_load(g)[1]})"
    if not g.clocks_events:
        out["clocks_events"] = why("reasons")
    return out


def _name(g: nvsmi.SmiGpu, i: int, count: int) -> str:
    """As the capture names the GPU: its bus id; a fragment's GPUs by their order in it."""
    return f"GPU {g.bus_id}" if g.bus_id else ("the GPU" if count == 1 else f"GPU #{i + 1} of the fragment")


def _rename(text: str, gpu: nvml.Gpu, name: str, bus: str | None) -> str:
    text = text.replace(cuda._who(gpu), name)
    return re.sub(rf"(?<=-i ){gpu.index}\b", bus or "N", text)


def _lane(n: int | None) -> int | None:
    return n if n and n >= 1 else None
