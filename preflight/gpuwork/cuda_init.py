"""The cuda_init worker run (checks/workers/cuda_init.py, through launch) and
its report: torch's CUDA init and a checked matmul on every GPU, then copies
to every GPU while NVML reads the PCIe links, since an idle link drops to Gen1
and proves nothing about its generation. Also which of NVML's GPUs each CUDA
device is, so the loaded readings are judged for the GPUs the worker used.

The cuda check (checks/cuda.py) gathers through here and judges the outcome.
"""

from __future__ import annotations

import signal
import time

from pydantic import BaseModel, ValidationError

from preflight.base.progress import Progress
from preflight.gpuwork import interpreter as interpreter_mod, launch
from preflight.gpuwork.world import Worlds
from preflight.readers.nvidia import nvml, nvml_facts
from preflight.readers.nvidia.nvml_facts import Gpu, Inventory, PcieLink

LOAD_SECONDS = 30.0  # the most the worker loads the links; it stops once NVML has read them
STOP = "stop"  # the file in the launch's directory that ends the load


class DeviceReport(BaseModel):
    index: int
    name: str | None = None
    pci_bus_id: str | None = None
    uuid: str | None = None
    seconds: float | None = None
    error_ratio: float | None = None  # matmul error / the fp32 bound: above 1 (or NaN) is a wrong answer
    error: str | None = None
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None
    rank: int | None = None  # the rank that probed it, in a shared launch


class InitReport(BaseModel):
    """What checks/workers/cuda_init.py writes (and rewrites at every stage)."""

    python: str
    stage: str  # import, init, devices, load, done: where it was when it stopped
    error: str | None = None
    error_kind: str | None = None  # no_torch, cpu_build, init, no_device
    devices: list[DeviceReport] = []
    current: int | None = None  # the CUDA device being probed
    # The CUDA devices a crash or hang is laid to, by ``merge``: the one whose rank died of its
    # own where that is known, else every one still being probed when the launch ended.
    unfinished: list[int] = []
    pci_bus_ids: list[str | None] = []  # by CUDA device index
    uuids: list[str | None] = []  # by CUDA device index, as torch prints them (no "GPU-")
    cuda_device_order: str | None = None  # the CUDA_DEVICE_ORDER the worker ran under
    cuda_visible_devices: str | None = None
    torch_version: str | None = None
    cuda_runtime: str | None = None
    nccl_version: str | None = None
    import_seconds: float | None = None
    init_seconds: float | None = None
    device_count: int | None = None
    load_end: str | None = None  # "stop": loaded until NVML had read the links; "time": not
    seconds: float | None = None
    # Which CUDA devices each rank that reported probed (by local rank; None: it stopped before
    # it chose): in a shared launch each its own, so none holds a context on another's GPU.
    probed: dict[int, list[int] | None] = {}


class InitOutcome(BaseModel):
    python: str
    ended: str  # "exit 0", "killed by SIGSEGV", "killed at the deadline after 55 s"
    returncode: int | None
    timed_out: bool
    seconds: float
    report: InitReport | None = None
    unreadable: str | None = None  # why the worker's report could not be used
    log_tail: list[str] = []
    links_unread: str | None = None  # why NVML has no reading of the links taken under load
    interpreter: interpreter_mod.Answer | None = None  # asked where the worker ended at once without a word

    def last_output(self) -> str:
        return self.log_tail[-1] if self.log_tail else "none"


# ---- the run ----------------------------------------------------------------


def run_init(python: str, timeout: float, read_links: bool, progress: Progress | None = None,
             worlds: Worlds | None = None, nproc: int = 1, rdzv_port: int = 0) -> tuple[InitOutcome, dict[str, PcieLink] | None]:
    """The cuda_init worker; while it loads the links, NVML reads them. The
    reading (every GPU's link, by NVML bus id) is returned only where it was
    taken under load; ``loaded_links`` picks the GPUs the worker copied to.
    Given the run's ``worlds``, it is the first stage of the launch of ``nproc``
    ranks the later checks share (each rank probes its own GPU: ``merge``); else a process of its own."""
    loaded, unread = None, None if read_links else "not read: the NVML facts are not this node's (--nvml-fake)"
    # The stop file goes in the launch's own directory (--out): private to root, unlike $TMPDIR's
    # top level, where a name another user chose could be where root touches it.
    args = ["--load-seconds", str(LOAD_SECONDS), "--stop", STOP]
    try:
        if worlds is not None:
            running = worlds.stage(python, launch.Worker("cuda_init.py", args, nproc=nproc, rdzv_port=rdzv_port), timeout, progress)
        else:
            running = launch.start(python, launch.Worker("cuda_init.py", args), timeout, progress)
    except launch.LaunchError as e:
        ended = f"could not be started: {e.cause}"
        return InitOutcome(python=python, ended=ended, returncode=None, timed_out=False, seconds=0.0), None
    except OSError as e:
        ended = f"could not be started: {e.strerror or e}"
        return InitOutcome(python=python, ended=ended, returncode=None, timed_out=False, seconds=0.0), None
    ranks = range(nproc if worlds is not None else 1)
    try:
        while running.alive() and time.monotonic() < running.deadline:
            if loading([running.report(k) for k in ranks]):
                if read_links:
                    try:
                        loaded = nvml.pcie_links(timeout=min(10.0, max(1.0, running.deadline - time.monotonic())))
                    except nvml.NvmlUnavailable as e:
                        unread = f"NVML could not read the links under load: {e.cause}"  # the inventory already spoke
                break
            time.sleep(0.02)
    finally:
        (running.out_dir / STOP).touch()  # also after an error here: the worker must not load on
        done = running.wait()
    outcome = InitOutcome(
        python=python,
        ended=done.how_it_ended,
        returncode=done.returncode,
        timed_out=done.timed_out,
        seconds=round(done.seconds, 4),
        # In a shared launch rank 0's own output; torchrun's where the rank never spoke.
        log_tail=(done.rank_logs.get(0) or done.log_tail) if done.world else done.log_tail,
        links_unread=unread,
    )
    if 0 in done.reports:
        try:
            # A plain worker's own exit is its rank's; in a launch, torchrun's summary says each rank's.
            exits = done.rank_exits if done.world else {0: done.returncode} if done.returncode is not None else {}
            merged = merge({k: done.reports.get(k) for k in ranks}, exits, done.root_cause)
            outcome.report = InitReport.model_validate(merged)
        except ValidationError as e:
            err = e.errors()[0]
            outcome.unreadable = f"its report does not fit the expected shape ({err['loc']}: {err['msg']})"
    else:
        outcome.unreadable = done.unreadable.get(0, "it wrote no report")
        if not done.timed_out and done.returncode is not None and done.returncode >= 0:  # ended by itself, no report: a Python at all?
            outcome.interpreter = interpreter_mod.ask(python)
    r = outcome.report
    if r is None or r.load_end != "stop":
        return outcome, None  # the load ended before NVML read: those were idle numbers
    return outcome, loaded


STAGES = ("import", "init", "devices", "load", "done")


def loading(reports: list[dict | None]) -> bool:
    """Whether every rank is past its probes and one at least is copying: each loads its own
    GPUs, and a reading taken while one still probes would find its links idle."""
    stages = [(r or {}).get("stage") for r in reports]
    return all(s in ("load", "done") for s in stages) and "load" in stages


# What torchrun sends the other ranks once one has failed (and the agent at a deadline): a rank
# that ended so was stopped, and says nothing about its GPU.
_STOPPED = (-signal.SIGTERM, -signal.SIGKILL)


def merge(reports: dict[int, dict | None], exits: dict[int, int] | None = None, root_cause: int | None = None) -> dict:
    """The ranks' reports (by local rank, rank 0's present) as one, as a process probing every
    GPU would have written it: every rank's devices, the stage the slowest rank reached, the
    GPUs the crash or hang is laid to (``unfinished``, ``current`` where that is one), the first
    rank's error, the load ended by the stop file only where every rank's was. A rank with no
    report stopped before it could write one. ``exits`` (local rank -> exit code, negative: the
    signal) and ``root_cause`` are torchrun's, where it said them."""
    first = reports[0] or {}
    out = dict(first)
    out["unfinished"] = _unfinished(reports, exits or {}, root_cause)
    out["current"] = out["unfinished"][0] if len(out["unfinished"]) == 1 else None
    devices, probed = [], {}
    for k, r in sorted(reports.items()):
        if r is None:
            out["stage"] = "import"
            continue
        devices += [{**d, "rank": k} for d in r.get("devices") or []]
        probed[k] = r.get("probed")
        if _order(r.get("stage")) < _order(out.get("stage")):
            out["stage"] = r["stage"]
        if out.get("error") is None and r.get("error") is not None:
            out.update(error=r["error"], error_kind=r.get("error_kind"))
    ends = [r.get("load_end") for r in reports.values() if r and r.get("load_end")]
    out["load_end"] = None if not ends else "stop" if all(e == "stop" for e in ends) else "time"
    times = [r["seconds"] for r in reports.values() if r and r.get("seconds") is not None]
    out.update(devices=sorted(devices, key=lambda d: d["index"]), probed=probed, seconds=max(times) if times else None)
    return out


def _unfinished(reports: dict[int, dict | None], exits: dict[int, int], root_cause: int | None) -> list[int]:
    """All ranks probe at once: when one crashes torchrun stops the others mid-probe, so the
    first rank found probing is no culprit. The rank that died of its own (any end but the
    SIGTERM or SIGKILL it was sent), torchrun's root cause first, names its GPU; where none did,
    as in a hang, every GPU still being probed is named."""
    probing = {k: r["current"] for k, r in reports.items() if r and r.get("current") is not None}
    own = [k for k, code in exits.items() if code and code not in _STOPPED]
    if own:
        culprits = [root_cause] if root_cause in own and root_cause in probing else [k for k in own if k in probing]
        return sorted({probing[k] for k in culprits})  # none: it died outside its probe, no GPU to name
    return sorted(set(probing.values()))


def _order(stage: str | None) -> int:
    return STAGES.index(stage) if stage in STAGES else len(STAGES)


def loaded_links(init: InitOutcome | None, loaded: dict[str, PcieLink] | None, inv: Inventory) -> tuple[dict[str, PcieLink] | None, str | None]:
    """The links NVML read while the worker copied, of the GPUs it copied to
    (CUDA_VISIBLE_DEVICES may hide some; idle ones read Gen1), by the
    inventory's bus id; or None and why the generation goes unjudged."""
    r = init.report if init else None
    if r is None or r.load_end is None:
        return None, "the cuda_init worker never loaded the links"
    if r.load_end != "stop":
        return None, "the worker's load ended before NVML read the links (an idle link reads Gen1)"
    if loaded is None:
        return None, (init.links_unread if init else None) or "NVML did not read the links under load"
    gpus, why = nvml_gpus(r, inv)
    if gpus is None:
        return None, f"the CUDA devices the worker loaded cannot be matched to NVML's GPUs: {why}"
    read = {nvml_facts.short_pci(bus): link for bus, link in loaded.items()}
    return {g.pci_bus_id: read[nvml_facts.short_pci(g.pci_bus_id)] for g in gpus if nvml_facts.short_pci(g.pci_bus_id) in read}, None


def nvml_gpus(r: InitReport, inv: Inventory) -> tuple[list[Gpu] | None, str]:
    """NVML's GPU for every CUDA device, by PCI address (torch's device
    properties), else by UUID, else by position: under CUDA_DEVICE_ORDER=PCI_BUS_ID
    with every GPU visible, CUDA's device N is the Nth GPU in PCI bus order."""
    n = r.device_count if r.device_count is not None else len(r.pci_bus_ids)
    by_bus = {nvml_facts.short_pci(g.pci_bus_id): g for g in inv.gpus}
    if len(r.pci_bus_ids) == n and (found := _every([nvml_facts.short_pci(b) for b in r.pci_bus_ids if b], by_bus, n)):
        return found, ""
    by_uuid = {_bare_uuid(g.uuid): g for g in inv.gpus}
    if len(r.uuids) == n and (found := _every([_bare_uuid(u) for u in r.uuids if u], by_uuid, n)):
        return found, ""
    torch = f"torch {r.torch_version} gives " + ("no PCI address" if not all(r.pci_bus_ids) else "PCI addresses NVML does not list")
    torch += " and " + ("no UUID" if not (r.uuids and all(r.uuids)) else "UUIDs NVML does not list")
    if r.cuda_device_order != "PCI_BUS_ID":
        return None, f"{torch}, and CUDA_DEVICE_ORDER was {r.cuda_device_order or 'unset'}, not PCI_BUS_ID"
    if r.cuda_visible_devices is not None:
        return None, f"{torch}, and CUDA_VISIBLE_DEVICES={r.cuda_visible_devices} renumbers the devices"
    if n != len(inv.gpus):
        return None, f"{torch}, and CUDA sees {n} devices where NVML lists {len(inv.gpus)}"
    return sorted(inv.gpus, key=lambda g: nvml_facts.short_pci(g.pci_bus_id)), ""


def _every(keys: list[str], table: dict[str, Gpu], n: int) -> list[Gpu] | None:
    found = [table[k] for k in keys if k in table]
    return found if len(found) == n else None


def _bare_uuid(u: str) -> str:
    """NVML says "GPU-5c1b0c7e-...", torch "5c1b0c7e-..."."""
    return u.strip().lower().removeprefix("gpu-")
