"""What a profile expects of each check, one table each ([gpu], [topology],
[nccl], [bandwidth], [train], [rdma], [fabric], [burnin], [memtest],
[outliers], [drift]): the sizes a check runs at and the limits it judges by, each with
the source its number came from. preflight.pipeline.profiles holds the
profile itself, its floors, and how a profile is found and resolved.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

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
    # The rate each compute port must run at, in Gb/s (sysfs "400 Gb/sec (4X NDR)"); None: not judged.
    rate_gbps: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    rate_source: str | None = None
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


class Converging(BaseModel):
    """When a timed figure is sure (checks/workers/_converge.py): its least repeats
    always run, then more until the 95% interval of its median lies within
    ``tolerance`` of it, or a cap is reached; a figure stopped by a cap is reported
    as not converged. The defaults are a GPU node's; a profile that sets any of these
    says why in ``converge_source``."""

    # 2%: under half the 5% margin within which a figure WARNs, so a figure that
    # converged is on the right side of the margin or within 2% of it.
    tolerance: float = Field(default=0.02, gt=0, le=0.5)
    converge_source: str | None = None

    CAPS: ClassVar[tuple[tuple[str, str], ...]] = ()  # (cap, the least count it must not be under)

    @model_validator(mode="after")
    def _converge_cited(self) -> Converging:
        own = {"tolerance", "max_seconds", *(cap for cap, _ in self.CAPS)}
        if own & self.model_fields_set and not self.converge_source:
            raise ValueError(f"{', '.join(sorted(own & self.model_fields_set))} set without converge_source: say where the tolerance and caps came from")
        for cap, least in self.CAPS:
            if getattr(self, cap) < getattr(self, least):
                raise ValueError(f"{cap} ({getattr(self, cap)}) must not be below {least} ({getattr(self, least)}): {least} always runs")
        return self


class BandwidthExpect(Converging):
    """How the bandwidth check measures on this SKU: sizes and repeats, so a boot
    profile can be quicker than a deep one. The floors live in [floors]."""

    model_config = ConfigDict(extra="forbid")
    CAPS = (("max_repeats", "repeats"), ("max_latency_iters", "latency_iters"))

    ranks: int | None = Field(default=None, ge=1, le=256)  # gloo ranks on a profile without GPUs
    # HBM copy (GPU) or memcpy (CPU) buffer; on a GPU at least 1 GiB, far past any L2.
    copy_bytes: int = Field(default=1 << 30, ge=1 << 20, le=64 << 30)
    host_bytes: int = Field(default=512 << 20, ge=1 << 20, le=16 << 30)  # pinned host<->device buffer
    p2p_bytes: int = Field(default=512 << 20, ge=1 << 20, le=16 << 30)
    collective_bytes: int = Field(default=1 << 30, ge=1 << 20, le=64 << 30)  # all_reduce buffer (nccl-tests' size)
    small_bytes: int = Field(default=4096, ge=4, le=1 << 20)  # the latency all_reduce: a few KiB
    warmup: int = Field(default=3, ge=1, le=100)
    repeats: int = Field(default=10, ge=5, le=1000)  # the median of at least 5; more until it is sure
    latency_iters: int = Field(default=200, ge=100, le=100000)  # p99 needs at least 100
    # Caps of the repeats past the least (Converging): nvbench's default minimum is
    # 10 samples (--min-samples); 3x that bounds a noisy figure's cost to 3x a quiet one's.
    max_repeats: int = Field(default=30, ge=5, le=10000)
    max_latency_iters: int = Field(default=1000, ge=100, le=1000000)
    # nvbench gives up on a measurement after 15 s of wall time (--timeout, NVIDIA/nvbench
    # docs/cli_help.md); an 8-GPU node has 8 + 8 host copies and 56 GPU pairs, each its own
    # figure, so each gets a second (its warm-up and least repeats included).
    max_seconds: float = Field(default=1.0, gt=0, le=600, allow_inf_nan=False)
    graph: bool = True  # also time the small all_reduce inside a CUDA graph (information)
    op_timeout_seconds: float = Field(default=30.0, gt=0, le=600, allow_inf_nan=False)
    # A figure within this fraction above its floor (below its ceiling) WARNs: the node is marginal.
    margin: float = Field(default=0.05, ge=0, le=0.5)
    sizes_source: str = Field(min_length=1)  # why these sizes and repeats

    @model_validator(mode="after")
    def _sizes(self) -> BandwidthExpect:
        if self.small_bytes >= self.collective_bytes:
            raise ValueError("small_bytes must be below collective_bytes")
        return self


class TrainExpect(Converging):
    """How the train check's probe runs on this SKU: the model, the steps, the GEMM,
    and how much slower than the median one rank may be. Floors live in [floors]."""

    model_config = ConfigDict(extra="forbid")
    CAPS = (("max_steps", "steps"), ("max_compute_steps", "compute_steps"), ("max_gemm_repeats", "gemm_repeats"))

    ranks: int | None = Field(default=None, ge=1, le=256)  # gloo ranks on a profile without GPUs
    layers: int = Field(default=12, ge=1, le=256)
    d_model: int = Field(default=1024, ge=8, le=16384)
    heads: int = Field(default=16, ge=1, le=256)
    seq: int = Field(default=1024, ge=8, le=65536)
    batch: int = Field(default=8, ge=1, le=4096)  # sequences per rank per step
    vocab: int = Field(default=32768, ge=16, le=1 << 20)
    warmup_steps: int = Field(default=3, ge=1, le=100)
    steps: int = Field(default=10, ge=3, le=1000)
    compute_steps: int = Field(default=3, ge=1, le=100)  # per-rank forward+backward without the sync
    gemm_n: int = Field(default=8192, ge=64, le=32768)
    gemm_repeats: int = Field(default=6, ge=5, le=1000)  # 6: the least count whose median has a 95% interval
    gemm_burst: int = Field(default=50, ge=1, le=10000)  # matmuls back to back per timed repeat: long enough for a power cap to show
    # Untimed GEMM bursts before the first timed one: a GPU boosts for its first ~0.1 s under a
    # GEMM until the power limiter settles its clocks (the H200 in tests/fixtures/node/h200-1x-vm).
    gemm_warmup_seconds: float = Field(default=0.5, ge=0, le=60, allow_inf_nan=False)
    # Caps past the least counts (Converging). The compute passes' first quartile has a
    # 95% interval only from 13 passes on (0.75^13 < 2.5%), so their cap is at least 20.
    max_steps: int = Field(default=30, ge=3, le=10000)
    max_compute_steps: int = Field(default=20, ge=1, le=10000)
    max_gemm_repeats: int = Field(default=30, ge=5, le=10000)
    # Three figures (steps, compute passes, GEMM bursts of ~0.1 s on an H100): 30 bursts fit.
    max_seconds: float = Field(default=3.0, gt=0, le=600, allow_inf_nan=False)
    op_timeout_seconds: float = Field(default=60.0, gt=0, le=600, allow_inf_nan=False)
    # The slowest rank's own compute time over the median rank's: past this, FAIL naming it.
    straggler_max: float = Field(default=1.15, gt=1, le=10)
    straggler_source: str = Field(min_length=1)
    # Dense bf16 peak of one GPU (flop/s), for MFU; None: MFU is not computed (CPU).
    peak_flops: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    peak_source: str | None = None
    margin: float = Field(default=0.05, ge=0, le=0.5)
    sizes_source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self) -> TrainExpect:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} must be a multiple of heads {self.heads}")
        if self.peak_flops is not None and not self.peak_source:
            raise ValueError("peak_flops needs peak_source")
        return self


class BurninExpect(BaseModel):
    """The burn-in (checks/burnin.py): how long, what load, and what the NVML trace must show."""

    model_config = ConfigDict(extra="forbid")

    ranks: int | None = Field(default=None, ge=1, le=256)  # gloo ranks on a profile without GPUs
    seconds: float = Field(gt=0, le=86400, allow_inf_nan=False)  # the sustained load, per rank
    seconds_source: str = Field(min_length=1)
    gemm_n: int = Field(default=8192, ge=16, le=32768)  # square bf16 (fp32 on CPU) GEMM checked against its reference
    gemms_per_burst: int = Field(default=20, ge=1, le=10000)  # back to back, then the result is compared
    copy_bytes: int = Field(default=1 << 30, ge=1 << 20, le=64 << 30)  # the HBM (host memory) copy of each burst
    sizes_source: str = Field(min_length=1)
    sample_seconds: float = Field(default=1.0, gt=0, le=60, allow_inf_nan=False)  # NVML's sampling period
    # The SM clock's median under load must not sag below this (MHz), or below this share of
    # the GPU's own top SM clock as NVML reports it; a site's clock_floor_mhz wins. Neither: not judged.
    clock_floor_mhz: float | None = Field(default=None, gt=0, le=10000, allow_inf_nan=False)
    clock_floor_fraction: float | None = Field(default=None, ge=0.1, le=1)
    # Thermal or power-brake throttling in more than this fraction of the samples is sustained.
    throttle_fraction: float = Field(default=0.1, ge=0, lt=1)
    # Which of NVML's clocks-event reasons count as throttling (checks/burnin.py THROTTLE names them
    # all); a profile of cards that sit at their thermal target by design (generic) leaves out SW thermal.
    throttle_reasons: list[Literal["hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"]] = Field(
        default_factory=lambda: ["hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"], min_length=1)
    clock_source: str | None = None

    @model_validator(mode="after")
    def _cited(self) -> BurninExpect:
        if (self.clock_floor_mhz is not None or self.clock_floor_fraction is not None) and not self.clock_source:
            raise ValueError("clock_floor_mhz and clock_floor_fraction need clock_source")
        return self

    def clock_floor(self, max_mhz: float | None) -> float | None:
        """The SM clock floor (MHz) for a GPU whose top SM clock is ``max_mhz``, or None."""
        if self.clock_floor_mhz is not None:
            return self.clock_floor_mhz
        if self.clock_floor_fraction is not None and max_mhz:
            return self.clock_floor_fraction * max_mhz
        return None


class MemtestExpect(BaseModel):
    """The memory test (checks/memtest.py): how much memory, for how long."""

    model_config = ConfigDict(extra="forbid")

    ranks: int | None = Field(default=None, ge=1, le=256)  # gloo ranks on a profile without GPUs
    fraction: float = Field(default=0.9, gt=0, le=0.98)  # of the GPU's free memory
    host_bytes: int | None = Field(default=None, ge=1 << 20, le=64 << 30)  # the host buffer on a profile without GPUs
    seconds: float = Field(gt=0, le=86400, allow_inf_nan=False)  # the cap: patterns not reached by then are said so
    seed: int = Field(default=20260522, ge=0, le=2**32 - 1)  # the worker seeds torch with seed * 1000003 + offset: within 64 bits
    source: str = Field(min_length=1)


class OutlierBand(BaseModel):
    """How much worse than the node's own median a member's figure may be
    (preflight.checkkit.outliers): WARN past ``warn``, FAIL past ``fail``, as fractions."""

    model_config = ConfigDict(extra="forbid")

    warn: float = Field(gt=0, lt=1)
    fail: float = Field(gt=0, lt=1)
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _ordered(self) -> OutlierBand:
        if self.warn >= self.fail:
            raise ValueError(f"warn {self.warn:g} must be below fail {self.fail:g}")
        return self


class OutlierExpect(OutlierBand):
    """The band for every per-GPU, per-pair or per-rank figure; ``figures`` gives a
    figure (by its floor's name: memcpy_bandwidth, gemm_throughput...) a band of its own."""

    figures: dict[str, OutlierBand] = Field(default_factory=dict)

    def band(self, figure: str) -> OutlierBand:
        return self.figures.get(figure, self)


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
