"""What the NVML child's answers are read into on the parent's side (readers/nvidia/nvml.py
asks): ``Inventory`` with its ``Gpu``s and ``LostGpu``s, a ``PcieLink`` reading, the burn-in's
``GpuTrace``; and the forms of a PCI bus id (``short_pci``, ``slot``). The checks judge these.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Facts(BaseModel):
    # A fake file with a typo ("ecc_uncorectable_volatile") must be an error,
    # not a silently healthy GPU.
    model_config = ConfigDict(extra="forbid", frozen=True)


# NVML prints "00000000:1B:00.0"; sysfs and lspci "0000:1b:00.0". Both are accepted.
BusId = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")]
P2pStatus = Literal["ok", "chipset_not_supported", "gpu_not_supported", "topology_not_supported", "disabled_by_regkey", "not_supported", "unknown"]


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
    # Whether the InfoROM's checksums hold (nvmlDeviceValidateInforom): False where NVML answers
    # NVML_ERROR_CORRUPTED_INFOROM; None where it cannot say (a vGPU guest, facts recorded before it was read).
    inforom_valid: bool | None = None
    persistence_mode: bool | None = None
    mig_mode: bool | None = None
    # nvmlDeviceGetComputeMode: "exclusive_process" lets one process hold a context on the GPU,
    # "prohibited" none; None where NVML did not say (facts recorded before it was read).
    compute_mode: Literal["default", "exclusive_thread", "prohibited", "exclusive_process"] | None = None
    memory_total_bytes: int | None = Field(default=None, ge=0)
    ecc_mode: bool | None = None
    # The board's ECC mode as it ships (nvmlDeviceGetDefaultEccMode): workstation cards ship with
    # ECC off, and off is then how the card was sold, not a setting someone changed.
    ecc_default: bool | None = None
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
    # Whether this GPU may read another's memory over PCIe, by the other's PCI bus id, as NVML
    # says (nvmlDeviceGetP2PStatus, READ; nvml_topology.P2P_STATUS); None where NVML did not say.
    # "gpu_not_supported" is the product's design (GeForce cards: `nvidia-smi topo -p2p r` GNS).
    p2p_read: dict[BusId, P2pStatus] | None = None
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


class RefusedGpu(_Facts):
    """A GPU NVML counts but will not hand this process (nvmlDeviceGetHandleByIndex answered
    NVML_ERROR_NO_PERMISSION): not given to this run, as under a Slurm job's device cgroup
    (ConstrainDevices), where nvmlDeviceGetCount_v2 still counts every GPU of the node."""

    index: int = Field(ge=0)
    error: str


class Inventory(_Facts):
    driver_version: str
    cuda_driver_version: str | None = None  # "12.4": the newest CUDA the driver supports
    gpus: list[Gpu]
    lost: list[LostGpu] = Field(default_factory=list)
    refused: list[RefusedGpu] = Field(default_factory=list)  # not this run's: never lost, never counted
    source: str = "NVML"

    @model_validator(mode="after")
    def _one_entry_per_index(self) -> Inventory:
        indices = [g.index for g in self.gpus] + [g.index for g in self.lost] + [g.index for g in self.refused]
        dup = sorted({i for i in indices if indices.count(i) > 1})
        if dup:
            raise ValueError(f"GPU index {dup[0]} is listed more than once")
        return self


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


def short_pci(bus_id: str) -> str:
    """``00000000:18:00.0`` -> ``0000:18:00.0``: the form sysfs and lspci use."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


def slot(bus_id: str) -> str:
    """``00000000:18:00.0`` -> ``0000:18:00``: the form kernel Xid lines print."""
    return short_pci(bus_id).rpartition(".")[0]
