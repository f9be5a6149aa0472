"""What a profile expects of the node itself, one table each ([gpu], [topology],
[nccl], [rdma], [fabric], [drift]): the limits a check judges by, each with the
source its number came from. preflight.pipeline.load_expectations holds the
tables of the checks that load the GPUs; preflight.pipeline.profiles the
profile itself, its floors, and how a profile is found and resolved.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_VERSION = r"^[0-9]+(\.[0-9]+)*$"


class GpuExpect(BaseModel):
    """What a healthy GPU of this SKU looks like beyond the numeric floors;
    every expectation cites where it came from."""

    model_config = ConfigDict(extra="forbid")

    # PCI device ids ("0x2330") that confirm the product name where names are
    # shared between boards (H200 SXM vs H200 NVL). Empty: the name decides.
    pci_device_ids: list[Annotated[str, Field(pattern=r"^0x[0-9a-f]{4}$")]] = Field(default_factory=list)
    # The oldest driver branch that supports the SKU. None: no SKU to name one for (generic):
    # the driver that loaded the GPU and answers NVML is the only floor, and the source says so.
    driver_min: str | None = Field(default=None, pattern=_VERSION)
    driver_source: str = Field(min_length=1)
    nvlinks: int = Field(default=0, ge=0, le=64)  # active NVLink links per GPU; 0: none expected
    nvlinks_source: str | None = None
    # No SKU count (generic): where the node joins its GPUs by NVLink, every GPU is held to
    # the most any GPU of the node has.
    nvlinks_from_node: bool = False
    # False (generic): the profile describes no one GPU model, so it holds no model's floor
    # (HBM copy, host copies, GEMM) and no check may ask it for one; the figures are measured
    # and held to the node's own GPUs ([outliers]) and to whatever floors the site adds.
    model_floors: bool = True
    whole_gpus: bool = True  # MIG must be off: the job wants whole GPUs
    memory_min_bytes: int = Field(default=0, ge=0, le=1 << 44)  # NVML memory total at least this
    memory_source: str | None = None
    # The PCIe generation of the SKU's host interface: its h2d and d2h floors are measured over an
    # x16 link of it, and a host whose slots give less is held to that share (checkkit/host_link.py).
    # None: no PCIe host link to scale by (GB10's C2C), or the floors stand as given.
    pcie_gen: int | None = Field(default=None, ge=1, le=6)
    pcie_source: str | None = None

    @model_validator(mode="after")
    def _cited(self) -> GpuExpect:
        if self.nvlinks and not self.nvlinks_source:
            raise ValueError("nvlinks needs nvlinks_source: where the link count came from")
        if self.memory_min_bytes and not self.memory_source:
            raise ValueError("memory_min_bytes needs memory_source")
        if self.pcie_gen and not self.pcie_source:
            raise ValueError("pcie_gen needs pcie_source")
        if self.nvlinks_from_node and self.nvlinks:
            raise ValueError("nvlinks_from_node holds each GPU to the node's own count: set it or nvlinks, not both")
        if self.model_floors and self.driver_min is None:
            raise ValueError("driver_min is needed where the profile describes a GPU model (only model_floors = false goes without)")
        return self


class TopologyExpect(BaseModel):
    """How the GPUs, NICs and CPUs of a healthy node of this SKU are laid out,
    as `nvidia-smi topo -m` and sysfs show it; every expectation is cited."""

    model_config = ConfigDict(extra="forbid")

    # Which GPU pairs NVLink joins: "all" (NVSwitch boards), "pairs" (bridged
    # two-GPU boards: every GPU has one NVLink peer), or "none" (no promise).
    nvlink: Literal["all", "pairs", "none"] = "none"
    nvlink_width: int = Field(default=0, ge=0, le=64)  # the N of NV<N> between joined GPUs
    nvlink_source: str | None = None
    # GPUs on more NUMA nodes than this: WARN (ranks must be pinned); than
    # numa_fail_above: FAIL (the BIOS NUMA setting is not the fleet's).
    numa_warn_above: int = Field(ge=1, le=1024)
    numa_fail_above: int | None = Field(default=None, ge=1, le=1024)
    numa_source: str = Field(min_length=1)
    # Built for multi-node jobs: every GPU needs a NIC at PIX or PXB.
    nic_per_gpu: bool = False
    nic_source: str | None = None

    @model_validator(mode="after")
    def _cited(self) -> TopologyExpect:
        if self.nvlink != "none" and not (self.nvlink_width and self.nvlink_source):
            raise ValueError(f"nvlink = {self.nvlink!r} needs nvlink_width and nvlink_source")
        if self.numa_fail_above is not None and self.numa_fail_above < self.numa_warn_above:
            raise ValueError("numa_fail_above must not be below numa_warn_above")
        if self.nic_per_gpu and not self.nic_source:
            raise ValueError("nic_per_gpu needs nic_source")
        return self


class RdmaExpect(BaseModel):
    """What the RDMA NICs of a healthy node of this SKU look like (checks/rdma.py);
    every expectation is cited."""

    model_config = ConfigDict(extra="forbid")

    # GPUDirect RDMA must be possible (nvidia-peermem, or dma-buf): a node built for
    # multi-node jobs with a NIC beside each GPU. False: not judged (PCIe cards, GB10).
    gpudirect: bool = False
    gpudirect_source: str | None = None
    # The link layer of the ports that carry the job's traffic (with NCCL_IB_HCA
    # unset, and only those beside a GPU where sysfs tells): their state and rate
    # FAIL; another port down or slower is only reported (details.other_ports).
    link_layer: Literal["InfiniBand", "Ethernet", "any"] = "InfiniBand"
    # The rate a site holds each compute port to, in Gb/s (sysfs "400 Gb/sec (4X NDR)"). How fast
    # the fabric runs is the site's choice, not the GPU model's (NDR, NDR200 on split cables,
    # HDR100), so no built-in profile sets it: a site profile does. None: no rate floor; the
    # compute ports are still held to the node's fastest compute port of their link layer.
    rate_gbps: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    rate_source: str | None = None
    # The rate the SKU's reference design cables its compute NICs at (DGX H100: NDR, 400 Gb/s):
    # never a floor; where the node's compute ports all run below it the result says so.
    reference_rate_gbps: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    reference_rate_source: str | None = None
    # Seconds between the two reads of the error counters.
    interval_seconds: float = Field(default=3.0, gt=0, le=60, allow_inf_nan=False)
    interval_source: str = Field(min_length=1)
    # symbol_error growing faster than this (per second) FAILs; slower is reported only. PAM4
    # links (HDR, NDR, 200/400 GbE) count raw bit errors as a matter of course, and even at the
    # IBTA's 1e-12 BER a 200 Gb/s link counts 0.2 a second: one error in the watch is no fault.
    symbol_errors_per_second: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    symbol_source: str = ("10/s: NVIDIA NVSentinel's NIC health monitor's symbol_error rate threshold for PAM4 links "
                          "(docs/nic-health-monitor/link-counter-detection.md), 50x the count of a 200 Gb/s link at the IBTA's 1e-12 BER")

    @model_validator(mode="after")
    def _cited(self) -> RdmaExpect:
        if self.gpudirect and not self.gpudirect_source:
            raise ValueError("gpudirect = true needs gpudirect_source")
        if self.rate_gbps is not None and not self.rate_source:
            raise ValueError("rate_gbps needs rate_source")
        if self.reference_rate_gbps is not None and not self.reference_rate_source:
            raise ValueError("reference_rate_gbps needs reference_rate_source")
        return self


class NcclExpect(BaseModel):
    """How the nccl check runs on this SKU, and what it expects NCCL to choose."""

    model_config = ConfigDict(extra="forbid")

    # gloo ranks on a profile without GPUs; a GPU profile runs one rank per GPU.
    ranks: int | None = Field(default=None, ge=1, le=256)
    small_bytes: int = Field(default=4096, ge=64, le=1 << 20)  # latency-bound: a few KiB
    large_bytes: int = Field(default=32 << 20, ge=1 << 20, le=1 << 30)  # bandwidth-bound: tens of MiB
    # How long init and each collective may take before a rank gives up and
    # says so: far above a healthy node's figures, far below NCCL's 10 minutes.
    op_timeout_seconds: float = Field(default=30.0, gt=0, le=600, allow_inf_nan=False)
    init_warn_seconds: float = Field(default=10.0, gt=0, le=600, allow_inf_nan=False)
    init_source: str = Field(min_length=1)
    # Two local ranks that NCCL joins over SHM or a network instead of P2P:
    # "fail" where the GPUs have NVLink, "warn" where P2P over PCIe is a bonus.
    p2p: Literal["fail", "warn", "any"] = "any"
    p2p_source: str | None = None
    # What channels between nodes must use (preflight.readers.nccl.nccl_net): "ib_gdrdma" where
    # the SKU ships with a NIC per GPU and GPUDirect RDMA, "ib" where an RDMA
    # network is enough, "any" where sockets are fine (report only).
    network: Literal["ib_gdrdma", "ib", "any"] = "any"
    network_source: str | None = None

    @model_validator(mode="after")
    def _cited(self) -> NcclExpect:
        if self.p2p != "any" and not self.p2p_source:
            raise ValueError(f"p2p = {self.p2p!r} needs p2p_source")
        if self.network != "any" and not self.network_source:
            raise ValueError(f"network = {self.network!r} needs network_source")
        if self.small_bytes >= self.large_bytes:
            raise ValueError("small_bytes must be below large_bytes")
        return self


class FabricExpect(BaseModel):
    """The NVSwitch fabric of a SKU built on one (HGX/DGX baseboards): how many
    NVSwitch chips the whole board carries, and whether its GPUs report their fabric
    registration to NVML (Hopper and newer). A profile without it has no NVSwitch."""

    model_config = ConfigDict(extra="forbid")

    # None (generic): no SKU's board to count the switches of; the manager and the GPUs'
    # registration are still judged.
    nvswitches: int | None = Field(default=None, ge=1, le=64)
    board_gpus: int | None = Field(default=None, ge=2, le=256)  # the GPUs of the board that count is for
    nvswitch_source: str = Field(min_length=1)
    gpu_fabric_state: bool
    state_source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _both(self) -> FabricExpect:
        if (self.nvswitches is None) != (self.board_gpus is None):
            raise ValueError("nvswitches and board_gpus go together: the count of switches is for a board of that many GPUs")
        return self


class DriftExpect(BaseModel):
    """When a figure has slid under its own past (preflight.outputs.record.history_judge): the median
    of the last ``recent`` runs more than ``fraction`` under the median of up to ``earlier`` runs
    before them (at least ``earlier_min``), while still above its floor, WARNs "drifting"."""

    model_config = ConfigDict(extra="forbid")

    recent: int = Field(default=5, ge=1, le=1000)
    earlier: int = Field(default=30, ge=1, le=10000)
    earlier_min: int = Field(default=5, ge=1, le=10000)
    fraction: float = Field(gt=0, lt=1)
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _enough(self) -> DriftExpect:
        if self.earlier_min > self.earlier:
            raise ValueError(f"earlier_min {self.earlier_min} must be at most earlier {self.earlier}")
        return self
