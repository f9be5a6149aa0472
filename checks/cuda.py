"""The driver, every GPU's health as NVML reports it, Xid errors since boot,
and CUDA init on every GPU.

The first check of every GPU profile, because it catches the nodes that burn
money before anything else runs: a driver that lost a GPU, `CUDA unknown
error` at init, pending row remaps, a PCIe link trained at x8, a GPU held
back by hardware slowdown, a fatal Xid since boot.

How the PCIe link is judged: idle GPUs drop their link to Gen1 to save power,
so an idle reading proves nothing about the generation. The cuda_init worker
copies to every GPU after its matmuls, and NVML reads the links again while
it does; only that loaded reading is judged for generation. A narrow width is
judged from either reading, since links do not narrow to save power.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, ValidationError

from preflight import launch, nvml, xid
from preflight.check import Check, Context, Finding, Measurement, Result, Status
from preflight.host import Host
from preflight.nvml import Gpu, Inventory, PcieLink
from preflight.profiles import GpuExpect

MARGIN = 5.0  # seconds kept from the check's deadline to judge and report a hung worker
LOAD_SECONDS = 3.0  # the most the worker loads the links; it stops as soon as NVML has read them

DRAIN = "drain the node and run `dcgmi diag -r 3` on it; open an RMA if the fault returns"
RESET = "reset the GPU (`nvidia-smi -r -i {i}`, with no process on it) or reboot the node"
TORCH = "point --python at the training environment's interpreter, or install a CUDA build of torch there"


class DeviceReport(BaseModel):
    index: int
    name: str | None = None
    pci_bus_id: str | None = None
    uuid: str | None = None
    seconds: float | None = None
    error_ratio: float | None = None  # matmul error / the fp32 bound: above 1 is a wrong answer
    error: str | None = None
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None


class InitReport(BaseModel):
    """What checks/workers/cuda_init.py writes (and rewrites at every stage)."""

    python: str
    stage: str  # import, init, devices, load, done: where it was when it stopped
    error: str | None = None
    error_kind: str | None = None  # no_torch, cpu_build, init, no_device
    devices: list[DeviceReport] = []
    current: int | None = None  # the device being probed
    cuda_visible_devices: str | None = None
    torch_version: str | None = None
    cuda_runtime: str | None = None
    nccl_version: str | None = None
    import_seconds: float | None = None
    init_seconds: float | None = None
    device_count: int | None = None
    seconds: float | None = None


class InitOutcome(BaseModel):
    python: str
    ended: str  # "exit 0", "killed by SIGSEGV", "killed at the deadline after 55 s"
    returncode: int | None
    timed_out: bool
    seconds: float
    report: InitReport | None = None
    unreadable: str | None = None  # why the worker's report could not be used
    log_tail: list[str] = []


class CudaFacts(BaseModel):
    inventory: Inventory
    sysfs_gpus: list[str] = []  # NVIDIA GPUs on the PCI bus ("0000:18:00.0"), seen or not by NVML
    xid_events: list[xid.XidEvent] = []
    kernel_log: str  # where the Xid scan read, or why it could not
    init: InitOutcome | None = None  # None: not attempted
    init_skipped: str | None = None
    pcie_loaded: dict[str, PcieLink] | None = None  # bus id -> link while the worker copied


# ---- gathering -------------------------------------------------------------


def sysfs_gpus(host: Host) -> list[str]:
    """PCI addresses of NVIDIA display and 3D controllers (NVSwitches are bridges)."""
    found = []
    devices = host.path("/sys/bus/pci/devices")
    try:
        entries = sorted(os.listdir(devices))
    except OSError:
        return []
    for entry in entries:
        try:
            vendor = (devices / entry / "vendor").read_text().strip()
            klass = (devices / entry / "class").read_text().strip()
        except OSError:
            continue
        if vendor == "0x10de" and klass[:6] in ("0x0300", "0x0302"):
            found.append(entry.lower())
    return found


def run_init(python: str, timeout: float, read_links: bool) -> tuple[InitOutcome, dict[str, PcieLink] | None]:
    """The cuda_init worker; while it loads the links, NVML reads them."""
    loaded = None
    with tempfile.TemporaryDirectory(prefix="preflight-cuda-") as tmp:
        stop = Path(tmp) / "stop"
        worker = launch.Worker("cuda_init.py", ["--load-seconds", str(LOAD_SECONDS), "--stop", str(stop)])
        try:
            running = launch.start(python, worker, timeout)
        except OSError as e:
            return InitOutcome(python=python, ended=f"could not start: {e.strerror or e}", returncode=None, timed_out=False, seconds=0.0), None
        try:
            while running.alive() and time.monotonic() < running.deadline:
                if (running.report() or {}).get("stage") == "load":
                    if read_links:
                        try:
                            loaded = nvml.pcie_links(timeout=min(10.0, max(1.0, running.deadline - time.monotonic())))
                        except nvml.NvmlUnavailable:
                            loaded = None  # judged from the idle reading; the inventory already spoke
                    stop.touch()
                    break
                time.sleep(0.02)
        finally:
            done = running.wait()
    outcome = InitOutcome(
        python=python,
        ended=done.how_it_ended,
        returncode=done.returncode,
        timed_out=done.timed_out,
        seconds=round(done.seconds, 4),
        log_tail=done.log_tail,
    )
    if 0 in done.reports:
        try:
            outcome.report = InitReport.model_validate(done.reports[0])
        except ValidationError as e:
            outcome.unreadable = f"its report does not fit the expected shape: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}"
    else:
        outcome.unreadable = done.unreadable.get(0, "it wrote no report")
    return outcome, loaded


def gather(ctx: Context) -> CudaFacts:
    """Raises NvmlUnavailable when NVML cannot answer at all."""
    fake = ctx.settings.nvml_fake
    inventory = nvml.inventory(fake, timeout=min(20.0, _left(ctx)))
    try:
        text, where = xid.read_kernel_log(ctx.host, timeout=min(10.0, _left(ctx)))
        events, kernel_log = xid.parse(text), where
    except xid.KernelLogUnavailable as e:
        events, kernel_log = [], f"unavailable: {e}"
    facts = CudaFacts(inventory=inventory, sysfs_gpus=sysfs_gpus(ctx.host), xid_events=events, kernel_log=kernel_log)
    if inventory.lost or not inventory.gpus:
        # A lost GPU can hang CUDA init for the whole deadline; NVML already named the fault.
        facts.init_skipped = "NVML reports lost GPUs" if inventory.lost else "NVML reports no GPU"
        return facts
    python = str(ctx.settings.python) if ctx.settings.python else _own_python()
    facts.init, facts.pcie_loaded = run_init(python, _left(ctx) - MARGIN, read_links=fake is None)
    return facts


def _left(ctx: Context) -> float:
    return max(1.0, min(ctx.deadline - time.monotonic(), 3600.0))


def _own_python() -> str:
    import sys

    return sys.executable


# ---- judging ---------------------------------------------------------------


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isdigit())


def _gpu(g: Gpu) -> str:
    return f"GPU {g.index} ({nvml.short_pci(g.pci_bus_id)})"


def judge_inventory(
    inv: Inventory,
    sysfs: list[str],
    gpu_count: int,
    expect: GpuExpect | None,
    driver_pin: str | None = None,
    loaded: dict[str, PcieLink] | None = None,
) -> list[Finding]:
    F = Finding
    out: list[Finding] = []
    for lost in inv.lost:
        where = nvml.short_pci(lost.pci_bus_id) if lost.pci_bus_id else "PCI address unknown"
        out.append(F(Status.FAIL, f"GPU {lost.index} ({where}) is lost", f"NVML cannot reach GPU {lost.index} ({where}): {lost.error}", RESET.format(i=lost.index) + "; if it stays lost, " + DRAIN))
    seen = len(inv.gpus) + len(inv.lost)
    if seen < gpu_count:
        visible = {nvml.short_pci(g.pci_bus_id) for g in inv.gpus} | {nvml.short_pci(g.pci_bus_id) for g in inv.lost if g.pci_bus_id}
        missing = [bus for bus in sysfs if bus not in visible]
        slots = f"; on the PCI bus but not in NVML: {', '.join(missing)}" if missing else "; the missing GPUs are not on the PCI bus either"
        out.append(F(Status.FAIL, f"{seen} of {gpu_count} GPUs visible", f"NVML sees {seen} GPUs, the profile expects {gpu_count}{slots if sysfs else ''}", "look for 'fallen off the bus' in `preflight xid`; reseat or replace the GPU; " + DRAIN))
    elif seen > gpu_count:
        out.append(F(Status.FAIL, f"{seen} GPUs, profile expects {gpu_count}", f"NVML sees {seen} GPUs but the profile describes a node with {gpu_count}", "choose the profile for this node (--profile) or a site profile with the right gpu_count"))
    models = Counter((g.name, g.pci_device_id) for g in inv.gpus)
    if len(models) > 1:
        mix = ", ".join(f"{n} x {name}" + (f" ({dev})" if dev else "") for (name, dev), n in models.most_common())
        out.append(F(Status.FAIL, "mixed GPU models", f"one node, several SKUs: {mix}", "a data-parallel job runs at the slowest GPU's speed: make the node uniform, or drain it"))
    if expect is not None:
        for (name, dev) in models:
            if dev and expect.pci_device_ids and dev not in expect.pci_device_ids:
                out.append(F(Status.FAIL, f"{name} is not this profile's GPU", f"PCI device id {dev} ({name}) is not one of the profile's {', '.join(expect.pci_device_ids)}", "run with the profile for this GPU (`preflight detect` names it)"))
        if _version(inv.driver_version) < _version(expect.driver_min):
            out.append(F(Status.FAIL, f"driver {inv.driver_version} is too old", f"driver {inv.driver_version} is older than {expect.driver_min}, the first that supports this GPU ({expect.driver_source})", f"install driver {expect.driver_min} or newer and reboot"))
    if driver_pin and inv.driver_version != driver_pin:
        out.append(F(Status.FAIL, f"driver {inv.driver_version}, site pins {driver_pin}", f"the site config pins driver {driver_pin}; this node runs {inv.driver_version}", f"install driver {driver_pin} (fleet uniformity), or change driver_version in the config"))
    for g in inv.gpus:
        out += judge_gpu(g, expect, (loaded or {}).get(g.pci_bus_id))
    return out


def judge_gpu(g: Gpu, expect: GpuExpect | None, loaded: PcieLink | None = None) -> list[Finding]:
    F, who, reset = Finding, _gpu(g), RESET.format(i=g.index)
    out: list[Finding] = []
    if g.ecc_uncorrectable_volatile:
        out.append(F(Status.FAIL, f"{who}: uncorrectable ECC errors", f"{who} has {g.ecc_uncorrectable_volatile} uncorrectable (volatile) ECC errors since the driver loaded: its memory returned wrong data", f"{reset}; " + DRAIN))
    if g.ecc_mode is False:
        out.append(F(Status.WARN, f"{who}: ECC is off", f"ECC is disabled on {who}: memory errors go undetected", f"`nvidia-smi -i {g.index} -e 1` and reboot"))
    rows = g.remapped_rows
    if rows and rows.failure:
        out.append(F(Status.FAIL, f"{who}: row remapping failed", f"{who} could not remap a failing memory row (out of spare rows)", "drain the node and RMA the GPU"))
    elif rows and rows.pending:
        out.append(F(Status.FAIL, f"{who}: row remap pending", f"{who} has a memory row remap pending ({rows.uncorrectable} uncorrectable, {rows.correctable} correctable rows remapped): the faulty row is still in use", f"{reset}: a reset activates the remap (reset required)"))
    if g.retired_pages_pending:
        out.append(F(Status.FAIL, f"{who}: page retirement pending", f"{who} has retired memory pages waiting for a reset", f"{reset}: a reset completes the retirement (reset required)"))
    out += judge_link(g, loaded)
    events = set(g.clocks_events or [])
    if "hw_power_brake_slowdown" in events:
        out.append(F(Status.FAIL, f"{who}: power brake active", f"{who} is held back by hardware power brake (the system asserted it: PSU or power-delivery fault)", "check the node's power supplies and BMC event log; " + DRAIN))
    elif "hw_slowdown" in events and "hw_thermal_slowdown" not in events:
        out.append(F(Status.FAIL, f"{who}: hardware slowdown active", f"{who} runs with HW slowdown engaged (clocks cut by half or more: power or temperature sensor)", "check the BMC's power and thermal events and `nvidia-smi -q -d PERFORMANCE`; " + DRAIN))
    if events & {"hw_thermal_slowdown", "sw_thermal_slowdown"}:
        temp = f" at {g.temperature_c} C" if g.temperature_c is not None else ""
        out.append(F(Status.WARN, f"{who}: thermal slowdown", f"{who} is slowed by temperature{temp}", "check fans, airflow and inlet temperature; the GPU throttles under load"))
    if g.persistence_mode is False:
        out.append(F(Status.WARN, f"{who}: persistence mode off", f"persistence mode is off on {who}: every CUDA start re-initialises the GPU (seconds each)", "enable nvidia-persistenced (`systemctl enable --now nvidia-persistenced`)"))
    if g.mig_mode and (expect is None or expect.whole_gpus):
        out.append(F(Status.FAIL, f"{who}: MIG enabled", f"MIG mode is on for {who}; the profile expects whole GPUs", f"`nvidia-smi -i {g.index} -mig 0`, then reset the GPU"))
    if g.power_limit_w and g.power_default_limit_w and g.power_limit_w < g.power_default_limit_w * 0.99:
        out.append(F(Status.WARN, f"{who}: power capped", f"{who}'s power limit is {g.power_limit_w:g} W, below its default {g.power_default_limit_w:g} W", f"`nvidia-smi -i {g.index} -pl {g.power_default_limit_w:g}` unless the cap is intended"))
    if expect and expect.nvlinks and g.nvlinks_active is not None and g.nvlinks_active < expect.nvlinks:
        down = f" (down: link {', '.join(map(str, g.nvlinks_down))})" if g.nvlinks_down else ""
        out.append(F(Status.FAIL, f"{who}: {g.nvlinks_active} of {expect.nvlinks} NVLinks active", f"{who} has {g.nvlinks_active} active NVLinks{down}, the SKU has {expect.nvlinks} ({expect.nvlinks_source})", f"check nvidia-fabricmanager and `nvidia-smi nvlink -s -i {g.index}`; {reset}; " + DRAIN))
    if expect and expect.memory_min_bytes and g.memory_total_bytes is not None and g.memory_total_bytes < expect.memory_min_bytes:
        out.append(F(Status.FAIL, f"{who}: less memory than the SKU", f"{who} reports {g.memory_total_bytes} bytes of memory, the SKU at least {expect.memory_min_bytes} ({expect.memory_source})", "check the GPU model and retired pages; " + DRAIN))
    return out


def judge_link(g: Gpu, loaded: PcieLink | None) -> list[Finding]:
    """Width from any reading (links do not narrow at idle); generation only under load."""
    idle, who = g.pcie, _gpu(g)
    width = loaded.width if loaded and loaded.width else idle.width
    fix = "reseat the GPU or its riser/cable, check the slot's BIOS link settings; " + DRAIN
    out = []
    if width and idle.width_max and width < idle.width_max:
        out.append(Finding(Status.FAIL, f"{who}: PCIe link x{width} of x{idle.width_max}", f"{who}'s PCIe link trained at x{width}, its slot and GPU allow x{idle.width_max}: host<->GPU copies run at {width / idle.width_max:.0%} speed", fix))
    if loaded and loaded.gen and idle.gen_max and loaded.gen < idle.gen_max:
        out.append(Finding(Status.FAIL, f"{who}: PCIe Gen{loaded.gen} of Gen{idle.gen_max} under load", f"{who}'s PCIe link ran at Gen{loaded.gen} while the worker copied to it; GPU and slot allow Gen{idle.gen_max}", fix))
    return out


def judge_xid(events: list[xid.XidEvent], inv: Inventory) -> list[Finding]:
    """One finding per (kind, code, GPU), with how often it was logged."""
    # Kernel lines print "0000:10:1c" (no function); NVML "00000000:10:1C.0".
    by_pci = {nvml.short_pci(g.pci_bus_id)[:10]: g.index for g in inv.gpus}
    remaps_pending = any((g.remapped_rows and g.remapped_rows.pending) or g.retired_pages_pending for g in inv.gpus)
    counts: Counter[tuple[str, int | None, str | None]] = Counter()
    first: dict[tuple[str, int | None, str | None], xid.XidEvent] = {}
    for e in events:
        key = (e.kind, e.code, e.pci)
        counts[key] += e.count
        first.setdefault(key, e)
    out = []
    for key, n in counts.items():
        kind, code, pci = key
        info = xid.explain(kind, code, first[key].message)
        if info.severity == "info":
            continue
        gpu = f"GPU {by_pci[pci]} ({pci})" if pci in by_pci else (pci or "an unknown GPU")
        label = {"xid": f"Xid {code}", "sxid": f"SXid {code}"}.get(kind, kind.replace("_", " "))
        status = Status.FAIL if info.severity == "fatal" else Status.WARN
        if kind == "xid" and code == 63 and not remaps_pending:
            status = Status.WARN  # NVML's remap state is the truth: a reset since has activated it
        times = f" ({n} times since boot)" if n > 1 else ""
        out.append(Finding(status, f"{label} on {gpu}", f"{label} on {gpu}{times}: {info.meaning}", info.action))
    return out


_INIT_CAUSES = [
    # The driver's own words -> what has fixed it on real nodes.
    ("system not yet initialized", "the NVSwitch fabric is not up: nvidia-fabricmanager is not running or failed", "`systemctl enable --now nvidia-fabricmanager` (its version must equal the driver's), then retry"),
    ("unknown error", "CUDA could not initialise a GPU (`CUDA unknown error`)", "check CUDA_VISIBLE_DEVICES; compare `cat /proc/driver/nvidia/version` with `nvidia-smi` (a kernel module/driver mismatch after an upgrade needs a reboot); reset the GPUs (`nvidia-smi -r`) or reboot; if it persists, " + DRAIN),
    ("no cuda-capable device", "CUDA finds no usable GPU", "check CUDA_VISIBLE_DEVICES and the permissions on /dev/nvidia*; in a container, pass the GPUs (--gpus all / the NVIDIA runtime)"),
    ("driver version is insufficient", "the driver is older than the CUDA runtime torch was built with", "install a newer driver, or a torch built for an older CUDA"),
    ("forward compatibility", "the CUDA forward-compatibility libraries do not work with this GPU or driver", "remove cuda-compat from LD_LIBRARY_PATH, or install a newer driver"),
]


def judge_init(init: InitOutcome | None, inv: Inventory) -> list[Finding]:
    F = Finding
    if init is None:
        return []
    python, r = init.python, init.report
    by_index = {g.index: g for g in inv.gpus}
    if init.timed_out:
        if r and r.current is not None:
            g = by_index.get(r.current)
            who = _gpu(g) if g else f"GPU {r.current}"
            return [F(Status.FAIL, f"CUDA init hung on {who}", f"{who} did not answer CUDA within the deadline ({init.ended}); it was the first device of {r.device_count} still being probed", RESET.format(i=r.current) + "; if it hangs again, " + DRAIN)]
        stage = {"import": f"importing torch with {python}", "init": "torch.cuda.init()", "load": "copying to the GPUs"}.get(r.stage if r else "import", "the worker")
        return [F(Status.FAIL, "CUDA init hung", f"the cuda_init worker hung in {stage} ({init.ended}); last output: {init.log_tail[-1] if init.log_tail else 'none'}", RESET.format(i="N") + "; " + DRAIN)]
    if r is None:
        last = init.log_tail[-1] if init.log_tail else "no output"
        return [F(Status.FAIL, "the CUDA init worker failed", f"the cuda_init worker under {python} ended ({init.ended}) and {init.unreadable}; last output: {last}", "run it by hand to see why: " + f"{python} {launch.WORKERS_DIR / 'cuda_init.py'}")]
    if r.error_kind == "no_torch":
        return [F(Status.FAIL, "torch is not importable", f"torch not importable by {python}: {r.error}", TORCH)]
    if r.error_kind == "cpu_build":
        return [F(Status.FAIL, "no CUDA device: torch is a CPU-only build", f"no CUDA device: {r.error}, under {python}", TORCH)]
    if r.error_kind in ("init", "no_device"):
        error = r.error or ""
        for words, cause, remedy in _INIT_CAUSES:
            if words in error.lower():
                return [F(Status.FAIL, f"CUDA init failed: {cause.split(':')[0]}", f"{cause}: {error}", remedy)]
        return [F(Status.FAIL, "CUDA init failed", f"torch.cuda.init() failed: {error}", RESET.format(i="N") + "; " + DRAIN)]
    out = []
    if r.device_count is not None and r.device_count != len(inv.gpus):
        hidden = f" (CUDA_VISIBLE_DEVICES={r.cuda_visible_devices})" if r.cuda_visible_devices is not None else ""
        out.append(F(Status.FAIL, f"CUDA sees {r.device_count} GPUs, NVML {len(inv.gpus)}", f"torch.cuda.device_count() is {r.device_count} but NVML lists {len(inv.gpus)} GPUs{hidden}", "unset CUDA_VISIBLE_DEVICES for preflight; otherwise " + DRAIN))
    for d in r.devices:
        g = by_index.get(d.index)
        who = _gpu(g) if g else f"CUDA device {d.index}"
        if d.error:
            out.append(F(Status.FAIL, f"{who}: CUDA failed", f"{who}: {d.error}", RESET.format(i=d.index) + "; " + DRAIN))
        elif d.error_ratio is not None and d.error_ratio > 1.0:
            out.append(F(Status.FAIL, f"{who} computes wrong results", f"{who}'s fp32 matmul is off by {d.error_ratio:.3g} x the rounding bound against a float64 CPU reference: silent data corruption suspect", DRAIN))
    if not out and (r.stage != "done" or init.returncode != 0):
        out.append(F(Status.FAIL, "the CUDA init worker failed", f"the worker reached stage {r.stage!r} and ended ({init.ended}); last output: {init.log_tail[-1] if init.log_tail else 'none'}", "run it by hand: " + f"{python} {launch.WORKERS_DIR / 'cuda_init.py'}"))
    return out


def judge(facts: CudaFacts, gpu_count: int, expect: GpuExpect | None, driver_pin: str | None) -> tuple[dict[str, list[Finding]], list[Measurement]]:
    """Findings by part (inventory, xid, cuda_init), so a report says which part failed."""
    inv = facts.inventory
    xids = judge_xid(facts.xid_events, inv)
    if facts.kernel_log.startswith("unavailable"):
        xids.append(Finding(Status.WARN, "Xid scan impossible", f"the kernel log could not be read, so Xid errors since boot are unknown: {facts.kernel_log}", "run preflight as root (or set kernel.dmesg_restrict=0), or check `preflight xid` by hand"))
    parts = {
        "inventory": judge_inventory(inv, facts.sysfs_gpus, gpu_count, expect, driver_pin, facts.pcie_loaded),
        "xid": xids,
        "cuda_init": judge_init(facts.init, inv),
    }
    return parts, measurements(facts)


def measurements(facts: CudaFacts) -> list[Measurement]:
    out = []
    init = {d.index: d for d in facts.init.report.devices} if facts.init and facts.init.report else {}
    for g in facts.inventory.gpus:
        labels = {"gpu": str(g.index), "UUID": g.uuid}
        link = (facts.pcie_loaded or {}).get(g.pci_bus_id) or g.pcie
        values = [
            ("gpu_temperature", "celsius", g.temperature_c),
            ("gpu_power_limit", "watts", g.power_limit_w),
            ("gpu_ecc_uncorrectable_volatile", "errors", g.ecc_uncorrectable_volatile),
            ("gpu_ecc_uncorrectable_aggregate", "errors", g.ecc_uncorrectable_aggregate),
            ("gpu_nvlinks_active", "links", g.nvlinks_active),
            ("gpu_pcie_link_width", "lanes", link.width),
            ("gpu_pcie_link_generation", "generation", link.gen),
            ("gpu_cuda_init_duration", "seconds", init[g.index].seconds if g.index in init else None),
        ]
        out += [Measurement(name=n, unit=u, value=float(v), labels=labels) for n, u, v in values if v is not None]
    return out


def summary(facts: CudaFacts) -> str:
    inv = facts.inventory
    names = Counter(g.name for g in inv.gpus)
    gpus = ", ".join(f"{n} x {name}" for name, n in names.items()) or "no GPU"
    r = facts.init.report if facts.init else None
    cuda = f"; CUDA init on every GPU in {facts.init.seconds:.1f} s (torch {r.torch_version}, CUDA {r.cuda_runtime}, NCCL {r.nccl_version})" if r else ""
    fake = f" [FAKE NVML from {inv.source.removeprefix('fake ')}]" if inv.source != "NVML" else ""
    return f"{gpus}, driver {inv.driver_version} (CUDA {inv.cuda_driver_version}){cuda}; no fatal Xid since boot{fake}"


class Cuda(Check):
    name = "cuda"
    description = "driver and NVML health of every GPU (ECC, row remaps, PCIe link, slowdown, MIG), Xid errors since boot, CUDA init on every GPU"
    timeout_seconds = 60.0
    order = 10

    def run(self, ctx: Context) -> Result:
        try:
            facts = gather(ctx)
        except nvml.NvmlUnavailable as e:
            return self.result(Status.FAIL, e.cause, cause=e.cause, remedy=e.remedy)
        parts, values = judge(facts, ctx.profile.gpu_count, ctx.profile.gpu, ctx.settings.driver_version)
        details = facts.model_dump(mode="json")
        details["parts"] = {name: _worst(found) for name, found in parts.items()}
        if facts.init is None:
            details["parts"]["cuda_init"] = f"not run: {facts.init_skipped}"
        if facts.init and facts.init.report:
            r = facts.init.report
            details["versions"] = {"driver": facts.inventory.driver_version, "cuda_driver": facts.inventory.cuda_driver_version, "torch": r.torch_version, "cuda_runtime": r.cuda_runtime, "nccl": r.nccl_version}
        findings = [f for found in parts.values() for f in found]
        result = self.conclude(findings, summary(facts), measurements=values, details=details)
        passed = [name for name, found in parts.items() if not found and not (name == "cuda_init" and facts.init is None)]
        if findings and passed:
            result.summary += f" ({' and '.join(passed)} passed)"
        if facts.inventory.source != "NVML" and "FAKE NVML" not in result.summary:
            result.summary += f" [FAKE NVML from {facts.inventory.source.removeprefix('fake ')}]"
        return result


def _worst(findings: list[Finding]) -> str:
    for status in (Status.FAIL, Status.WARN):
        if any(f.status == status for f in findings):
            return status.value
    return Status.PASS.value
