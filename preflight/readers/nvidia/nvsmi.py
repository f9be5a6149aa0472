"""`nvidia-smi -q` text read into per-GPU facts, whatever the driver that printed it.

The layout is a tree drawn by indentation (4 spaces a level) of `key : value`
lines and section names. Drivers differ in the padding (the colon at column 36
before ~450, 42 after), in names (`Clocks Throttle Reasons` became `Clocks Event
Reasons`; ECC counters went from Single/Double Bit totals to SRAM/DRAM lines;
`Power Limit` became `Current Power Limit`, which driver 610 moved under `GPU
Ceiling Power Limit`), and people paste it de-indented,
cut to the sections they ran (`-q -d ECC`), grepped down to a few lines, or with
`[...]` where they left something out. So the tree is rebuilt from relative
indentation only, and each fact is found by its key and the section just above
it, never by column or line number. A key whose name says what it is (`Pending
Page Blacklist`, `HW Slowdown`) is taken even when a grep dropped its section;
an ambiguous one (`Pending`, `Max`) is not.

A GPU's block also holds blocks of other things that print the GPU's own key
names: a `MIG Device` with MIG on (its own `FB Memory Usage` and `BAR1 Memory
Usage` until a driver renamed them `Shared ...`), a process of `Processes`, a
`vGPU ID` of `nvidia-smi vgpu -q`. A fact is the GPU's only where every section
above it nests as in the GPU's own tree (_WITHIN), so a key in any such block,
whatever its name, is none of the GPU's; a paste cut short above a section
still reads.
"""

from __future__ import annotations

import re
from pydantic import BaseModel, Field

from preflight.base import tooltext
from preflight.base.errors import UsageError

_BANNER = re.compile(r"^\s*=+\s*NVSMI LOG\s*=+\s*$")
# "GPU 00000000:10:1C.0"; drivers of 2011 printed "GPU 0:2:0".
_GPU = re.compile(r"^\s*GPU\s+(?P<bus>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?)\s*$")
_ELISION = re.compile(r"^\s*(\[\s*(\.\.\.|…)\s*\]|\.\.\.|…)\s*$")


def _key_value(line: str) -> tuple[str, str | None] | None:
    """(key, value) of a stripped line; value None for a section's name; None for no key. A key
    never holds a colon; a value may ("19:32:16", a bus id). The colon must be followed by a space
    or the line's end, so "GPU 0000:10:1C.0" is no key. Split, not a regular expression: a lazy
    key before optional spaces backtracks quadratically on a long line of spaces."""
    key, sep, rest = line.partition(":")
    if not sep or not key or (rest and rest[0] != " "):
        return None
    return key.rstrip(), (rest[1:] if rest else None)

HEADER = {"Timestamp": "timestamp", "Driver Version": "driver_version", "CUDA Version": "cuda_version", "Attached GPUs": "attached_gpus"}
# Printed name -> NVML's name (preflight/readers/nvidia/nvml_inventory.py CLOCKS_EVENTS), so the cuda judge reads them.
REASONS = {
    "Idle": "gpu_idle", "Applications Clocks Setting": "applications_clocks_setting", "User Defined Clocks": "applications_clocks_setting",
    "SW Power Cap": "sw_power_cap", "HW Slowdown": "hw_slowdown", "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal_slowdown", "HW Thermal Slowdown": "hw_thermal_slowdown",
    "HW Power Brake Slowdown": "hw_power_brake_slowdown", "Display Clock Setting": "display_clock_setting",
}
_REASON_SECTIONS = {"Clocks Event Reasons", "Clocks Throttle Reasons", "Clocks Reasons"}
_ECC = {"SRAM Correctable", "SRAM Uncorrectable", "SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED", "DRAM Correctable", "DRAM Uncorrectable"}
_POWER = {"Power Readings", "GPU Power Readings"}
# Driver 610 moved the GPU's limits one level down, under `GPU Ceiling Power Limit` inside
# `GPU Power Readings`, beside a `GPU Base Power` trio of its own names (NVIDIA's nvidia-smi
# documentation of that driver); `Module Power Readings` prints the same key names for the module.
_CEILING = "GPU Ceiling Power Limit"
# The sections that sit inside another in the GPU's own tree, and what they sit in; every
# other section sits at the GPU's top. Where a section holding a key sits elsewhere (FB
# Memory Usage inside a MIG Device), the key is not the GPU's.
_WITHIN: dict[str, set[str]] = {
    "GPU Link Info": {"PCI"}, "PCIe Generation": {"GPU Link Info"}, "Link Width": {"GPU Link Info"},
    "Volatile": {"ECC Errors"}, "Aggregate": {"ECC Errors"},
    "Single Bit": {"Volatile", "Aggregate"}, "Double Bit": {"Volatile", "Aggregate"},  # drivers before ~450
    "HW Slowdown": _REASON_SECTIONS,  # `HW Slowdown : Active` and, under it, HW Thermal and HW Power Brake
    _CEILING: _POWER, "GPU Base Power": _POWER,
}
# field id -> (the section right above the key (None: none), its keys, taken with no section above it)
_FIELDS: dict[str, tuple[set, set[str], bool]] = {
    "gpu.product_name": ({None}, {"Product Name"}, True),
    "gpu.uuid": ({None}, {"GPU UUID"}, True),
    "gpu.bus_id": ({"PCI"}, {"Bus Id"}, True),
    "gpu.device_id": ({"PCI"}, {"Device Id"}, False),
    "gpu.persistence_mode": ({None}, {"Persistence Mode"}, True),
    "gpu.mig_mode": ({"MIG Mode"}, {"Current"}, False),
    "gpu.memory_total_mib": ({"FB Memory Usage"}, {"Total"}, False),
    "gpu.temperature_c": ({"Temperature"}, {"GPU Current Temp", "Gpu"}, False),
    "perf.state": ({None}, {"Performance State"}, True),
    "perf.utilization": ({"Utilization"}, {"Gpu", "GPU"}, False),
    "ecc.mode": ({"ECC Mode", "Ecc Mode"}, {"Current"}, False),
    "retired.single_bit": ({"Retired Pages"}, {"Single Bit ECC"}, False),
    "retired.double_bit": ({"Retired Pages"}, {"Double Bit ECC"}, False),
    "retired.pending": ({"Retired Pages"}, {"Pending Page Blacklist", "Pending Page Retirement", "Pending"}, False),
    "retired.blacklist": ({None}, {"Pending Page Blacklist"}, True),
    "remap.one_line": ({None}, {"Remapped Rows"}, True),
    "remap.correctable": ({"Remapped Rows"}, {"Correctable Error"}, False),
    "remap.uncorrectable": ({"Remapped Rows"}, {"Uncorrectable Error"}, False),
    "remap.pending": ({"Remapped Rows"}, {"Pending"}, False),
    "remap.failure": ({"Remapped Rows"}, {"Remapping Failure Occurred"}, True),
    "pcie.gen_max": ({"PCIe Generation"}, {"Max"}, False),
    "pcie.gen_current": ({"PCIe Generation"}, {"Current"}, False),
    "pcie.gen_device_max": ({"PCIe Generation"}, {"Device Max"}, False),
    "pcie.gen_host_max": ({"PCIe Generation"}, {"Host Max"}, False),
    "pcie.width_max": ({"Link Width"}, {"Max"}, False),
    "pcie.width_current": ({"Link Width"}, {"Current"}, False),
    "clocks.graphics": ({"Clocks"}, {"Graphics"}, False),
    "clocks.sm": ({"Clocks"}, {"SM"}, False),
    "clocks.memory": ({"Clocks"}, {"Memory"}, False),
    "clocks.sm_max": ({"Max Clocks"}, {"SM"}, False),
    "clocks.graphics_max": ({"Max Clocks"}, {"Graphics"}, False),
    "power.draw": (_POWER, {"Power Draw"}, False),
    "power.draw_average": (_POWER, {"Average Power Draw"}, False),
    "power.limit": (_POWER | {_CEILING}, {"Current Power Limit", "Enforced Power Limit"}, False),
    "power.limit_old": (_POWER, {"Power Limit"}, False),
    "power.default_limit": (_POWER | {_CEILING}, {"Default Power Limit"}, False),
}
# The groups of facts a judge rule reads: a group with no line at all in the capture is "not printed".
GROUPS = ("ecc", "retired", "remap", "pcie", "reasons", "perf", "clocks", "power")


class Ecc(BaseModel):
    mode: bool | None = None  # ECC Mode, Current
    volatile_correctable: int | None = None  # sums of the counters below; None where none was a number
    volatile_uncorrectable: int | None = None
    aggregate_correctable: int | None = None
    aggregate_uncorrectable: int | None = None
    counters: dict[str, int | None] = Field(default_factory=dict)  # "volatile DRAM Uncorrectable" -> 0, as printed


class RetiredPages(BaseModel):
    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


class RemappedRows(BaseModel):
    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None


class Pcie(BaseModel):
    gen_max: int | None = None  # what the GPU and its slot allow (NVML's max)
    gen_current: int | None = None
    gen_device_max: int | None = None
    gen_host_max: int | None = None
    width_max: int | None = None
    width_current: int | None = None


class SmiGpu(BaseModel):
    """One GPU's block; None where the capture printed N/A, nothing, or not the line at all."""

    bus_id: str | None = None  # as printed; None: a fragment with no `GPU <bus id>` line
    product_name: str | None = None
    uuid: str | None = None
    pci_device_id: str | None = None  # "0x20b2", as NVML names it
    persistence_mode: bool | None = None
    mig_mode: bool | None = None
    memory_total_mib: int | None = None
    temperature_c: int | None = None
    performance_state: str | None = None  # "P0"
    utilization_gpu_pct: int | None = None
    ecc: Ecc = Field(default_factory=Ecc)
    retired_pages: RetiredPages = Field(default_factory=RetiredPages)
    remapped_rows: RemappedRows = Field(default_factory=RemappedRows)
    remapped_rows_na: bool = False  # the one-line `Remapped Rows : N/A`: this GPU does not remap rows
    pcie: Pcie = Field(default_factory=Pcie)
    clocks_events: dict[str, bool] = Field(default_factory=dict)  # NVML's reason name -> Active
    clocks_mhz: dict[str, int | None] = Field(default_factory=dict)  # graphics, sm, memory, sm_max, graphics_max
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    not_printed: list[str] = Field(default_factory=list)  # GROUPS with no line in the capture
    # Fields whose line is there with no answer (N/A, blank), as "remap.failure", "ecc.volatile DRAM Uncorrectable":
    # a fact missing from the capture and one the driver would not give are told apart.
    printed_na: list[str] = Field(default_factory=list)

    @property
    def events_active(self) -> list[str]:
        return [name for name, on in self.clocks_events.items() if on]


class SmiCapture(BaseModel):
    timestamp: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    attached_gpus: int | None = None
    gpus: list[SmiGpu]
    elided: bool = False  # the paste holds `[...]` or `...`: what is not there may still have been printed


_PADDED = re.compile(r"^\s*[^:\s][^:]*?\s+:(\s|$)")  # nvidia-smi pads every key: "Max        : 4"
_KNOWN_KEY = re.compile(r"^\s*(%s)\s+:(\s|$)" % "|".join(re.escape(k) for k in [
    "Driver Version", "CUDA Version", "Attached GPUs", *REASONS, "Product Name", "Bus Id", "GPU UUID", "Performance State",
    "Persistence Mode", "Remapped Rows", "Pending Page Blacklist", "Remapping Failure Occurred", *_ECC,
    "Single Bit ECC", "Double Bit ECC", "Correctable Error", "Uncorrectable Error"]))
_SECTIONS = {*_REASON_SECTIONS, "ECC Errors", "Volatile", "Aggregate", "Retired Pages", "Remapped Rows", "GPU Link Info",
             "PCIe Generation", "Link Width", "Clocks", "Max Clocks", "FB Memory Usage", "Utilization", *_POWER, _CEILING}


def looks_like(text: str) -> bool:
    """An `nvidia-smi -q` of any layout: its banner, a `GPU <bus id>` line, a padded
    `key : value` line whose key is nvidia-smi's own, or one of its section names
    with a deeper `key : value` line under it (a de-indented or grepped paste)."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    lines = [line.expandtabs(8).rstrip() for line in text.splitlines()[:200]]
    lines = [line for line in lines if line.strip()]
    for i, line in enumerate(lines):
        if _BANNER.match(line) or _GPU.match(line) or _KNOWN_KEY.match(line):
            return True
        if line.strip() in _SECTIONS and i + 1 < len(lines):
            below = lines[i + 1]
            if _indent(below) > _indent(line) and _PADDED.match(below):
                return True
    return False


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


class _Block:
    def __init__(self, bus: str | None):
        self.bus = bus
        self.values: dict[str, str] = {}


def parse(text: str) -> SmiCapture:
    """Raises UsageError where not one line is an nvidia-smi -q fact."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    header: dict[str, str] = {}
    blocks: list[_Block] = []
    stack: list[tuple[int, str]] = []  # (indent, name) of the lines above this one
    elided = False
    for raw in text.splitlines():
        line = raw.expandtabs(8).rstrip()
        if not line.strip() or _BANNER.match(line):
            continue
        if _ELISION.match(line):
            elided = True  # the tree goes on by indentation: what follows is placed by its own
            continue
        gpu = _GPU.match(line)
        if gpu:
            blocks.append(_Block(gpu["bus"]))
            stack = []
            continue
        indent = _indent(line)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        kv = _key_value(line.strip())
        key = (kv[0] if kv else line).strip()
        value = ((kv[1] or "").strip()) if kv else None
        parents = [name for _, name in stack]
        if not parents and key in HEADER and value is not None:
            header[HEADER[key]] = value  # no section: a GPU block pasted without its GPU line is not under it
            continue
        stack.append((indent, key))
        if value is None:
            continue  # a section's name: it only places the lines below it
        field = _field(parents, key, value)
        if field is None:
            continue
        if not blocks or (blocks[-1].bus is None and field in blocks[-1].values):
            # A fragment with no GPU line: a fact seen again is the next GPU's.
            blocks.append(_Block(None))
        blocks[-1].values[field] = value or ""
    if not any(b.values for b in blocks) and not {"driver_version", "cuda_version"} & header.keys():
        raise UsageError("no nvidia-smi -q field in it (no `GPU <bus id>` line, no `Driver Version`, "
                         "no ECC, remapped rows, PCIe or clocks line); save `nvidia-smi -q` to a file and pass that")
    return SmiCapture(timestamp=header.get("timestamp"), driver_version=_text(header.get("driver_version")),
                      cuda_version=_text(header.get("cuda_version")), attached_gpus=_int(header.get("attached_gpus")),
                      gpus=[_gpu(b) for b in blocks], elided=elided)


def _gpu_level(parents: list[str]) -> bool:
    """Whether the sections above a key nest as in the GPU's own tree, or as its lower end where a
    paste starts inside it: `MIG Device`, `FB Memory Usage` is a GPU instance's memory, not the GPU's."""
    return all(outer in _WITHIN.get(inner, ()) for outer, inner in zip(parents, parents[1:]))


def _field(parents: list[str], key: str, value: str | None) -> str | None:
    if not _gpu_level(parents):
        return None  # a block of something else inside the GPU's: a MIG device, a process, a vGPU
    parent = parents[-1] if parents else None
    if key in REASONS and (_REASON_SECTIONS & set(parents) or (value or "").lower() in ("active", "not active")):
        return "reasons." + REASONS[key]
    if parent in ("Volatile", "Aggregate") and key in _ECC:
        return f"ecc.{parent.lower()} {key}"
    if len(parents) >= 2 and parents[-2] in ("Volatile", "Aggregate") and parent in ("Single Bit", "Double Bit") and key == "Total":
        return f"ecc.{parents[-2].lower()} {parent}"  # drivers before ~450: totals of single and double bit errors
    for field, (sections, keys, alone) in _FIELDS.items():
        if key in keys and (parent in sections or (alone and parent is None)):
            return field
    return None


def _gpu(b: _Block) -> SmiGpu:
    v = b.values
    device = re.match(r"0x([0-9A-Fa-f]{4})[0-9A-Fa-f]{4}$", v.get("gpu.device_id", ""))
    g = SmiGpu(
        bus_id=b.bus or _text(v.get("gpu.bus_id")), product_name=_text(v.get("gpu.product_name")), uuid=_text(v.get("gpu.uuid")),
        pci_device_id=f"0x{device[1].lower()}" if device else None,
        persistence_mode=_flag(v.get("gpu.persistence_mode")), mig_mode=_flag(v.get("gpu.mig_mode")),
        memory_total_mib=_int(v.get("gpu.memory_total_mib")), temperature_c=_int(v.get("gpu.temperature_c")),
        performance_state=_text(v.get("perf.state")), utilization_gpu_pct=_int(v.get("perf.utilization")),
        retired_pages=RetiredPages(single_bit=_int(v.get("retired.single_bit")), double_bit=_int(v.get("retired.double_bit")),
                                   pending=_flag(v.get("retired.pending", v.get("retired.blacklist")))),
        remapped_rows=RemappedRows(correctable=_int(v.get("remap.correctable")), uncorrectable=_int(v.get("remap.uncorrectable")),
                                   pending=_flag(v.get("remap.pending")), failure=_flag(v.get("remap.failure"))),
        remapped_rows_na="remap.one_line" in v and _text(v["remap.one_line"]) is None,
        pcie=Pcie(**{k: _int(v.get("pcie." + k)) for k in Pcie.model_fields}),
        clocks_events={f.removeprefix("reasons."): val.lower() == "active" for f, val in v.items()
                       if f.startswith("reasons.") and val.lower() in ("active", "not active")},
        clocks_mhz={k: _int(v["clocks." + k]) for k in ("graphics", "sm", "memory", "sm_max", "graphics_max") if "clocks." + k in v},
        power_draw_w=_float(v.get("power.draw", v.get("power.draw_average"))),
        power_limit_w=_float(v.get("power.limit", v.get("power.limit_old"))),
        power_default_limit_w=_float(v.get("power.default_limit")),
        not_printed=[grp for grp in GROUPS if not any(f.startswith(grp + ".") for f in v)],
        printed_na=[f for f, val in v.items() if _text(val) is None],
    )
    counters = {f.removeprefix("ecc."): _int(val) for f, val in v.items() if f.startswith("ecc.") and f != "ecc.mode"}
    g.ecc = Ecc(mode=_flag(v.get("ecc.mode")), counters=counters,
                **{f"{scope}_{kind}": _sum(counters, scope, kind) for scope in ("volatile", "aggregate") for kind in ("correctable", "uncorrectable")})
    return g


def _sum(counters: dict[str, int | None], scope: str, kind: str) -> int | None:
    """NVML's total for a scope: every memory's counters of that kind (single bit = correctable)."""
    old = "Single Bit" if kind == "correctable" else "Double Bit"
    picked = [n for name, n in counters.items() if name.startswith(scope + " ") and n is not None
              and (name.endswith(old) or name.split(" ", 2)[-1].lower().startswith(kind))]
    return sum(picked) if picked else None


def _text(value: str | None) -> str | None:
    """None for what nvidia-smi prints where it has no answer."""
    if value is None or not value.strip() or value.strip() in ("N/A", "[N/A]", "Unknown Error") or "deprecated" in value or "Not Supported" in value:
        return None
    return value.strip()


def _int(value: str | None) -> int | None:
    m = re.match(r"^x?(-?\d{1,19})\s*(x|%|MHz|MiB|C|bank\(s\))?$", _text(value) or "")  # "16x", "x16", "0 %", "382 MHz"; longer: no answer
    return int(m[1]) if m else None


def _float(value: str | None) -> float | None:
    m = re.match(r"^(\d+(?:\.\d+)?)\s*W$", _text(value) or "")
    return float(m[1]) if m else None


def _flag(value: str | None) -> bool | None:
    return {"yes": True, "enabled": True, "active": True, "no": False, "disabled": False, "not active": False}.get((_text(value) or "").lower())
