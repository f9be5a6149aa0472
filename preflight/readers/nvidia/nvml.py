"""The NVML seam: with the child it runs (nvml_query.py), the only code that
talks to nvidia-ml-py (`import pynvml`).

It exposes only the facts checks use (an ``Inventory``), turns NVML's errors
into a cause and a remedy a person can act on, and offers ``FakeNvml``: the
same facts read from a JSON file, for tests and demos on machines without a
GPU. NVML runs in a child process (preflight/readers/nvidia/nvml_query.py) with a deadline:
on a wedged driver nvmlInit can block forever, and the agent must not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from preflight.base.findings import Finding, Status
from preflight.base.errors import UsageError
from preflight.readers import capture

# The remedies live beside the code that picks them, in the child.
from preflight.readers.nvidia.nvml_query import BROKEN, MISMATCH, NO_ACCESS, NO_DRIVER  # noqa: F401

if TYPE_CHECKING:
    from preflight.base.host import Started


class NvmlUnavailable(Exception):
    def __init__(self, cause: str, remedy: str):
        super().__init__(cause)
        self.cause = cause
        self.remedy = remedy


class _Facts(BaseModel):
    # A fake file with a typo ("ecc_uncorectable_volatile") must be an error,
    # not a silently healthy GPU.
    model_config = ConfigDict(extra="forbid", frozen=True)


# NVML prints "00000000:1B:00.0"; sysfs and lspci "0000:1b:00.0". Both are accepted.
BusId = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")]


class PcieLink(_Facts):
    gen: int | None = Field(default=None, ge=1)
    width: int | None = Field(default=None, ge=1)
    gen_max: int | None = Field(default=None, ge=1)  # the most this GPU *and* its slot can do
    width_max: int | None = Field(default=None, ge=1)


class RemappedRows(_Facts):
    correctable: int = Field(ge=0)
    uncorrectable: int = Field(ge=0)
    pending: bool
    failure: bool


class GpuFabric(_Facts):
    """The GPU's registration with the NVSwitch fabric (nvmlDeviceGetGpuFabricInfo, Hopper and newer)."""

    # nvml.h NVML_GPU_FABRIC_STATE_*: the fabric manager has not started on this GPU,
    # is at it, or is done; "status" says how it ended (meaningful once completed).
    state: Literal["not_supported", "not_started", "in_progress", "completed"]
    status: str = "success"  # NVML's error string where registration failed


class Gpu(_Facts):
    """One GPU as NVML sees it; None where the GPU or driver does not say."""

    index: int = Field(ge=0)
    name: str
    uuid: str
    pci_bus_id: BusId
    pci_device_id: str | None = Field(default=None, pattern=r"^0x[0-9a-f]{4}$")
    serial: str | None = None
    vbios: str | None = None
    inforom_image: str | None = None  # nvmlDeviceGetInforomImageVersion, "G520.0200.00.05"
    persistence_mode: bool | None = None
    mig_mode: bool | None = None
    # nvmlDeviceGetComputeMode: "exclusive_process" lets one process hold a context on the GPU,
    # "prohibited" none; None where NVML did not say (facts recorded before it was read).
    compute_mode: Literal["default", "exclusive_thread", "prohibited", "exclusive_process"] | None = None
    memory_total_bytes: int | None = Field(default=None, ge=0)
    ecc_mode: bool | None = None
    ecc_uncorrectable_volatile: int | None = Field(default=None, ge=0)
    ecc_uncorrectable_aggregate: int | None = Field(default=None, ge=0)
    retired_pages_pending: bool | None = None  # pre-Ampere; Ampere and later remap rows
    remapped_rows: RemappedRows | None = None
    pcie: PcieLink = PcieLink()
    # Names from nvml_inventory.CLOCKS_EVENTS: active in every reading of a short
    # window (persistent), and active in some readings only (transient).
    # Facts of one reading (FakeNvml files written before the window) read as
    # no transient event: every event they name counts as persistent, as it did.
    clocks_events: list[str] | None = None
    clocks_events_transient: list[str] | None = None
    temperature_c: int | None = None
    power_limit_w: float | None = Field(default=None, ge=0)
    power_default_limit_w: float | None = Field(default=None, ge=0)
    nvlinks_active: int | None = Field(default=None, ge=0)
    # Link indices present but inactive, listed only where at least one link is
    # active: a GPU whose every link is inactive has no NVLink partner (nvlinks_active 0).
    nvlinks_down: list[int] = Field(default_factory=list)
    # Active links by what is at their far end: "switch" (NVSwitch, {"switch": 18}
    # on HGX), "gpu" (a bridge or a direct link), "ibmnpu", "unknown" (NVML did not
    # say); None where no link is active or nvidia-ml-py cannot ask.
    nvlink_remote: dict[str, Annotated[int, Field(ge=1)]] | None = None
    # Where the GPU sits and which GPUs its links reach, as NVML says: the facts
    # `nvidia-smi topo -m` prints, for when its matrix cannot be read. None where
    # NVML did not say (a driver without the call, a fake file written before them).
    cpu_affinity: str | None = None  # CPU list of the GPU's NUMA node, nvmlDeviceGetCpuAffinityWithinScope
    numa_affinity: list[Annotated[int, Field(ge=0)]] | None = None  # nvmlDeviceGetMemoryAffinity, NUMA-node scope
    gpu_numa_id: int | None = Field(default=None, ge=0)  # nvmlDeviceGetNumaNodeId: a GPU that is a NUMA node of its own
    # Active links whose far end is a GPU, by that GPU's PCI bus id as NVML prints it
    # (nvmlDeviceGetNvLinkRemotePciInfo_v2); None where no link ends at a GPU, or NVML cannot say.
    nvlink_peers: dict[BusId, Annotated[int, Field(ge=1)]] | None = None
    # None: NVML has no fabric state for this GPU (before Hopper, or a driver without the call).
    fabric: GpuFabric | None = None
    # What the driver says the GPU needs to recover (nvml_inventory.RECOVERY_ACTIONS: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    # through nvmlDeviceGetFieldValues); None where NVML did not say (a driver older than the field, facts
    # recorded before it was read; why, where NVML said, in `unanswered` under nvml_inventory.RECOVERY_ASK).
    recovery_action: Literal["none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset",
                             "recover_imex_domain", "bus_reset", "system_reboot"] | None = None
    processes: list[GpuProcess] | None = None  # compute processes on the GPU now; None: NVML did not say
    # NVML calls that failed with anything but "not supported" -> the error: unknown is not healthy.
    unanswered: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _one_reading(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("clocks_events") is not None and data.get("clocks_events_transient") is None:
            data = {**data, "clocks_events_transient": []}
        return data


class GpuProcess(_Facts):
    pid: int = Field(ge=0)
    used_memory_bytes: int | None = Field(default=None, ge=0)


class LostGpu(_Facts):
    """A GPU the driver counts but cannot talk to (fell off the bus, Unknown Error)."""

    index: int = Field(ge=0)
    pci_bus_id: BusId | None = None
    error: str


class Inventory(_Facts):
    driver_version: str
    cuda_driver_version: str | None = None  # "12.4": the newest CUDA the driver supports
    gpus: list[Gpu]
    lost: list[LostGpu] = Field(default_factory=list)
    source: str = "NVML"

    @model_validator(mode="after")
    def _one_entry_per_index(self) -> Inventory:
        indices = [g.index for g in self.gpus] + [g.index for g in self.lost]
        dup = sorted({i for i in indices if indices.count(i) > 1})
        if dup:
            raise ValueError(f"GPU index {dup[0]} is listed more than once")
        return self


def short_pci(bus_id: str) -> str:
    """``00000000:18:00.0`` -> ``0000:18:00.0``: the form sysfs and lspci use."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


def slot(bus_id: str) -> str:
    """``00000000:18:00.0`` -> ``0000:18:00``: the form kernel Xid lines print."""
    return short_pci(bus_id).rpartition(".")[0]


FAKE_LIMIT = 16 << 20  # bytes of a --nvml-fake file: a node's facts are a few KiB


def _beyond_nvml(data: Any, where: str = "") -> str | None:
    """Where a fake file holds what NVML never reports: an integer past 64 bits (NVML's widest),
    a string past 4 KiB. Such a value would break the checks' arithmetic, not judge a node."""
    if isinstance(data, bool):
        return None
    if isinstance(data, int) and not -(1 << 63) <= data < 1 << 64:
        return f"field {where or 'the top level'}: an integer beyond 64 bits"
    if isinstance(data, float) and data != data or isinstance(data, float) and abs(data) == float("inf"):
        return f"field {where or 'the top level'}: not a finite number"
    if isinstance(data, str) and len(data) > 4096:
        return f"field {where or 'the top level'}: a string of {len(data)} characters"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if why := _beyond_nvml(value, f"{where}.{key}" if where else str(key)):
            return why
    return None


def FakeNvml(path: Path) -> Inventory:  # noqa: N802 - reads like the class it stands in for
    """The facts of a recorded or invented node, from a JSON file (``--nvml-fake``)."""
    try:
        text = capture.read_file(path, FAKE_LIMIT + 1)  # a FIFO would hang the run, /dev/zero fill its memory
    except OSError as e:
        raise UsageError(f"--nvml-fake {path}: cannot read it ({e.strerror or e}); pass an existing JSON file") from None
    if text is None:
        raise UsageError(f"--nvml-fake {path}: not a regular file; pass a JSON file")
    if len(text) > FAKE_LIMIT:
        raise UsageError(f"--nvml-fake {path}: larger than {FAKE_LIMIT >> 20} MiB; a node's facts are a few KiB")
    try:
        data = json.loads(text)
    except ValueError as e:  # UnicodeDecodeError too
        raise UsageError(f"--nvml-fake {path}: not valid JSON: {e}") from None
    except RecursionError:
        raise UsageError(f"--nvml-fake {path}: not valid JSON: nested too deep") from None
    if why := _beyond_nvml(data):
        raise UsageError(f"--nvml-fake {path}: {why}; NVML gives no such value")
    if isinstance(data, dict):
        data["source"] = f"fake {path}"  # whatever the file says: fake facts must never pass for NVML's
    try:
        return Inventory.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the top level"
        raise UsageError(f"--nvml-fake {path}: field {where}: {err['msg']}") from None


def inventory(fake: Path | None = None, timeout: float = 20.0, started: Started | None = None) -> Inventory:
    """Every GPU's facts, from NVML in a child process (or from the fake file).
    ``started``: that child, begun earlier (``Shared.begin``)."""
    if fake is not None:
        return FakeNvml(fake)
    answer = _answer(started or _start("inventory"), timeout)
    try:
        return Inventory.model_validate(answer)
    except ValidationError as e:  # our own child disagreeing with our model: a bug, say so plainly
        raise NvmlUnavailable(f"NVML answered facts preflight cannot read: {e.errors()[0]['msg']}", BROKEN) from None


class Shared:
    """One run's inventory: read at the first ask, then the same facts (or the same
    failure) for every later one. Each read costs a child and its 0.4 s window of clock
    readings, and checks that judge one node must judge one reading of it. A failure is
    kept too: NVML that did not answer at detection is not asked again for each check's
    whole deadline, and each check still gets its cause. ``begin`` starts the child ahead
    of the first ask, so the run's other work goes on while NVML answers. ``forget`` drops
    the reading where the node may have changed since (another run held it meanwhile).
    ``facts``: a reading already made (a report built from recorded facts, or one a check
    waited for); ``given`` says so, and nothing reads this node's NVML again to replace it.
    Whoever begins a reading closes it (``close``), read or not: no child outlives the run."""

    def __init__(self, fake: Path | None = None, facts: Inventory | None = None):
        self.fake = fake
        self.given = facts is not None
        self._got: Inventory | NvmlUnavailable | None = facts
        self._started: Started | None = None

    def begin(self) -> None:
        """Start NVML's child now, where nothing is read yet (a fake file is read at ``get``)."""
        if self._got is None and self._started is None and self.fake is None:
            try:
                self._started = _start("inventory")
            except OSError:
                pass  # ``get`` starts it again and says why it cannot

    @property
    def pending(self) -> bool:
        """Whether a child begun is still to be read."""
        return self._started is not None

    def get(self, timeout: float = 20.0) -> Inventory:
        if self._got is None:
            started, self._started = self._started, None
            try:
                self._got = inventory(self.fake, timeout, started)
            except NvmlUnavailable as e:
                self._got = e
        if isinstance(self._got, NvmlUnavailable):
            raise NvmlUnavailable(self._got.cause, self._got.remedy)
        return self._got

    def forget(self) -> None:
        self.close()
        self._got = None

    def close(self) -> None:
        """End a child begun and not yet read."""
        started, self._started = self._started, None
        if started is not None:
            started.stop()


def pcie_links(timeout: float = 10.0) -> dict[str, PcieLink]:
    """PCIe link state now, by PCI bus id: read while a worker loads the links."""
    try:
        return {bus: PcieLink.model_validate(link) for bus, link in _ask("pcie", timeout).items()}
    except (ValidationError, AttributeError) as e:
        raise NvmlUnavailable(f"NVML answered a PCIe reading preflight cannot read: {e}", BROKEN) from None


def _ask(what: str, timeout: float) -> Any:
    return _answer(_start(what), timeout)


def _start(what: str) -> Started:
    """nvml_query's child for ``what``, started: its answer is read by ``_answer``."""
    from preflight.base.host import Host

    # cwd "/": `python -m` puts the working directory first on sys.path, and a
    # pynvml.py lying there must not run as root.
    return Host().start([sys.executable, "-m", "preflight.readers.nvidia.nvml_query", what], cwd="/")


def _answer(started: Started, timeout: float) -> Any:
    done = started.finish(timeout)
    if done.timed_out:
        raise NvmlUnavailable(f"NVML did not answer within {timeout:g} s: the driver is wedged", BROKEN)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise NvmlUnavailable(f"the NVML query died (exit {done.returncode}): {tail}", BROKEN) from None
    if "failed" in answer:
        raise NvmlUnavailable(answer["failed"]["cause"], answer["failed"]["remedy"])
    return answer["facts"]


class GpuTrace(_Facts):
    """One GPU's NVML samples through a load (nvml_query._samples)."""

    index: int
    pci_bus_id: str
    # (time.time(), SM clock MHz, power W, temperature C, clocks-event reason bits); None where NVML did not say
    samples: list[tuple[float, int | None, float | None, int | None, int | None]]
    ecc_before: int | None = None  # volatile uncorrectable ECC errors
    ecc_after: int | None = None
    max_sm_clock_mhz: int | None = None  # the GPU's own top SM clock: the burn-in's clock floor is a share of it
    unanswered: dict[str, str] = Field(default_factory=dict)


class Sampler:
    """NVML sampled in a child while a load runs: ``start``, then ``stop`` once the load is
    over (it closes the child's stdin) for every GPU's trace. The child stops itself after
    ``most`` seconds, and ``stop`` kills it past its own deadline."""

    def __init__(self, period: float, most: float):
        import subprocess

        self.most = most
        self.proc = subprocess.Popen([sys.executable, "-m", "preflight.readers.nvidia.nvml_query", "sample", f"{period:g}", f"{most:g}"], cwd="/",
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def stop(self, timeout: float = 20.0) -> list[GpuTrace]:
        import subprocess

        try:
            out, err = self.proc.communicate("", timeout=timeout)  # "" closes stdin: the load is over
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise NvmlUnavailable(f"NVML sampling did not end within {timeout:g} s of the load's end: the driver is wedged", BROKEN) from None
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = (err.strip().splitlines() or ["no output"])[-1]
            raise NvmlUnavailable(f"the NVML sampler died (exit {self.proc.returncode}): {tail}", BROKEN) from None
        if "failed" in answer:
            raise NvmlUnavailable(answer["failed"]["cause"], answer["failed"]["remedy"])
        try:
            return [GpuTrace.model_validate(g) for g in answer["facts"]["gpus"]]
        except (ValidationError, KeyError, TypeError) as e:
            raise NvmlUnavailable(f"NVML answered samples preflight cannot read: {e}", BROKEN) from None


def busy(inv: Inventory) -> str | None:
    """Why the GPUs are not free for a recheck (a job holds them), or None.

    A GPU NVML cannot ask about counts as busy: the recheck must never slow a
    running job, and skipping costs only a later recheck."""
    held = []
    for g in inv.gpus:
        if g.processes is None:
            held.append(f"GPU {g.index} (NVML cannot list its processes)")
        elif g.processes:
            pids = ", ".join(str(p.pid) for p in g.processes[:4]) + (" ..." if len(g.processes) > 4 else "")
            held.append(f"GPU {g.index} (pid {pids})")
    return "a job holds " + "; ".join(held) if held else None


def fake_finding(source: str) -> Finding:
    """Fail closed: a run on facts from --nvml-fake has not vouched for this node."""
    return Finding(Status.FAIL, "NVML facts are FAKE", f"the NVML facts came from {source}, not from this node's driver",
                   "drop --nvml-fake / PREFLIGHT_NVML_FAKE for a real verdict")
