"""Profiles: hardware truth for one GPU SKU, one TOML file each.

A profile fixes the check order and every floor with the source its number
came from. It holds what is true of a GPU model, never the node's shape: one
profile serves 1-, 2-, 4- and 8-GPU nodes of its model (preflight.pipeline.shape reads
the shape). A floor measured on one shape of node (a collective's busbw on 8
GPUs joined by NVSwitch) says so, and judges only nodes of that shape. A site config may override any floor; the
resolved profile remembers where each value came from, so `show-profile`
can answer "why 1 GiB?".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from preflight.pipeline import levels as levels_mod, tomlfile
from preflight.base.errors import UsageError
from preflight.readers.nvml import BROKEN, Inventory

BUILTIN_DIR = Path(__file__).parent / "profiles"


def _floor_value(v: Any) -> float:
    """A number, finite and >= 0: a quoted "1G" or a `true` must not become a floor."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"a floor must be a number, not {type(v).__name__} {v!r}")
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"a floor must be a finite number >= 0, not {v!r}")
    return float(v)


FloorValue = Annotated[float, BeforeValidator(_floor_value)]
# A day: longer than any check should take, and within what a thread join accepts.
Timeout = Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)]


class Floor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: FloorValue
    unit: str
    source: str = Field(min_length=1)  # where the number came from, for the next person
    # "min": a measurement must reach the value; "max": stay under it (latency).
    bound: Literal["min", "max"] = "min"
    # The node shape a whole-node figure was measured on: it judges only runs
    # on that many GPUs joined that way (preflight.pipeline.shape.floor_fits). None:
    # a per-GPU figure, true on any node of the model.
    gpus: int | None = Field(default=None, ge=1, le=256)
    fabric: Literal["nvswitch", "nvlink", "pcie"] | None = None


_VERSION = r"^[0-9]+(\.[0-9]+)*$"


class GpuExpect(BaseModel):
    """What a healthy GPU of this SKU looks like beyond the numeric floors;
    every expectation cites where it came from."""

    model_config = ConfigDict(extra="forbid")

    # PCI device ids ("0x2330") that confirm the product name where names are
    # shared between boards (H200 SXM vs H200 NVL). Empty: the name decides.
    pci_device_ids: list[Annotated[str, Field(pattern=r"^0x[0-9a-f]{4}$")]] = Field(default_factory=list)
    driver_min: str = Field(pattern=_VERSION)  # oldest driver branch that supports the SKU
    driver_source: str = Field(min_length=1)
    nvlinks: int = Field(default=0, ge=0)  # active NVLink links per GPU; 0: none expected
    nvlinks_source: str | None = None
    whole_gpus: bool = True  # MIG must be off: the job wants whole GPUs
    memory_min_bytes: int = Field(default=0, ge=0)  # NVML memory total at least this
    memory_source: str | None = None

    @model_validator(mode="after")
    def _cited(self) -> GpuExpect:
        if self.nvlinks and not self.nvlinks_source:
            raise ValueError("nvlinks needs nvlinks_source: where the link count came from")
        if self.memory_min_bytes and not self.memory_source:
            raise ValueError("memory_min_bytes needs memory_source")
        return self


class TopologyExpect(BaseModel):
    """How the GPUs, NICs and CPUs of a healthy node of this SKU are laid out,
    as `nvidia-smi topo -m` and sysfs show it; every expectation is cited."""

    model_config = ConfigDict(extra="forbid")

    # Which GPU pairs NVLink joins: "all" (NVSwitch boards), "pairs" (bridged
    # two-GPU boards: every GPU has one NVLink peer), or "none" (no promise).
    nvlink: Literal["all", "pairs", "none"] = "none"
    nvlink_width: int = Field(default=0, ge=0)  # the N of NV<N> between joined GPUs
    nvlink_source: str | None = None
    # GPUs on more NUMA nodes than this: WARN (ranks must be pinned); than
    # numa_fail_above: FAIL (the BIOS NUMA setting is not the fleet's).
    numa_warn_above: int = Field(ge=1)
    numa_fail_above: int | None = Field(default=None, ge=1)
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
    # The ports that carry the job's traffic, by their link_layer: their state and
    # rate FAIL; another port down (a storage NIC's spare port) is a WARN.
    link_layer: Literal["InfiniBand", "Ethernet", "any"] = "InfiniBand"
    # The rate each compute port must run at, in Gb/s (sysfs "400 Gb/sec (4X NDR)"); None: not judged.
    rate_gbps: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    rate_source: str | None = None
    # Seconds between the two reads of the error counters.
    interval_seconds: float = Field(default=3.0, gt=0, le=60, allow_inf_nan=False)
    interval_source: str = Field(min_length=1)

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
    # What channels between nodes must use (preflight.readers.nccl_net): "ib_gdrdma" where
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
    gemm_repeats: int = Field(default=10, ge=5, le=1000)
    gemm_burst: int = Field(default=50, ge=1, le=10000)  # matmuls back to back per timed repeat: long enough for a power cap to show
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
    peak_flops: float | None = Field(default=None, gt=0)
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
    # The SM clock's median under load must not sag below this (MHz); None: not judged against a floor.
    clock_floor_mhz: float | None = Field(default=None, gt=0)
    # Thermal or power-brake throttling in more than this fraction of the samples is sustained.
    throttle_fraction: float = Field(default=0.1, ge=0, lt=1)
    clock_source: str | None = None

    @model_validator(mode="after")
    def _cited(self) -> BurninExpect:
        if self.clock_floor_mhz is not None and not self.clock_source:
            raise ValueError("clock_floor_mhz needs clock_source")
        return self


class MemtestExpect(BaseModel):
    """The memory test (checks/memtest.py): how much memory, for how long."""

    model_config = ConfigDict(extra="forbid")

    ranks: int | None = Field(default=None, ge=1, le=256)  # gloo ranks on a profile without GPUs
    fraction: float = Field(default=0.9, gt=0, le=0.98)  # of the GPU's free memory
    host_bytes: int | None = Field(default=None, ge=1 << 20, le=64 << 30)  # the host buffer on a profile without GPUs
    seconds: float = Field(gt=0, le=86400, allow_inf_nan=False)  # the cap: patterns not reached by then are said so
    seed: int = Field(default=20260522, ge=0)
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

    nvswitches: int = Field(ge=1, le=64)
    board_gpus: int = Field(ge=2, le=256)  # the GPUs of the board that count is for
    nvswitch_source: str = Field(min_length=1)
    gpu_fabric_state: bool
    state_source: str = Field(min_length=1)


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    # Case-insensitive substrings of the NVML product name that select this profile under `auto`.
    match: list[str] = Field(default_factory=list)
    checks: list[str] = Field(min_length=1)
    # Which of the checks run at each level (preflight/pipeline/levels.py). None: a
    # profile written before levels: every check at standard and full, no quick level.
    levels: levels_mod.Levels | None = None
    floors: dict[str, Floor] = Field(default_factory=dict)
    timeouts: dict[str, Timeout] = Field(default_factory=dict)  # per check, seconds
    gpu: GpuExpect | None = None  # None: a profile without GPUs (cpu)
    topology: TopologyExpect | None = None  # None: no GPU layout to judge (cpu)
    nccl: NcclExpect | None = None
    bandwidth: BandwidthExpect | None = None
    train: TrainExpect | None = None
    outliers: OutlierExpect | None = None  # None: no member is judged against the node's median
    rdma: RdmaExpect | None = None  # None: ports and counters judged with no SKU expectation
    fabric: FabricExpect | None = None  # None: no NVSwitch on this SKU
    burnin: BurninExpect | None = None
    memtest: MemtestExpect | None = None

    @property
    def has_gpus(self) -> bool:
        return self.gpu is not None

    @field_validator("checks")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        dup = sorted({c for c in v if v.count(c) > 1})
        if dup:
            raise ValueError(f"lists {', '.join(dup)} more than once")
        return v

    @model_validator(mode="after")
    def _timeouts_name_checks(self) -> Profile:
        stray = sorted(set(self.timeouts) - set(self.checks))
        if stray:
            raise ValueError(f"[timeouts] names {', '.join(stray)}, not in checks ({', '.join(self.checks)})")
        return self

    @model_validator(mode="after")
    def _levels_name_checks(self) -> Profile:
        if self.levels is not None:
            levels_mod.check_against(self.levels, self.checks)
        return self

    @model_validator(mode="after")
    def _gpu_table(self) -> Profile:
        gpus = self.has_gpus
        if gpus and "topology" in self.checks:
            if self.topology is None:
                raise ValueError("checks lists topology but the [topology] table is missing")
            if "vcpus_per_gpu" not in self.floors:
                raise ValueError("checks lists topology but [floors.vcpus_per_gpu] is missing")
        if "nccl" in self.checks:
            if self.nccl is None:
                raise ValueError("checks lists nccl but the [nccl] table is missing")
            if not gpus and not self.nccl.ranks:
                raise ValueError("[nccl] ranks is needed on a profile without a [gpu] table: how many gloo ranks to start")
            if gpus and self.nccl.ranks:
                raise ValueError("[nccl] ranks is only for profiles without GPUs; one rank runs per GPU")
        if "bandwidth" in self.checks:
            b = self.bandwidth
            if b is None:
                raise ValueError("checks lists bandwidth but the [bandwidth] table is missing")
            if not gpus and not b.ranks:
                raise ValueError("[bandwidth] ranks is needed on a profile without a [gpu] table: how many gloo ranks to start")
            if gpus and b.ranks:
                raise ValueError("[bandwidth] ranks is only for profiles without GPUs; one rank runs per GPU")
            if gpus and b.copy_bytes < 1 << 30:
                raise ValueError(f"[bandwidth] copy_bytes {b.copy_bytes} is under 1 GiB: an HBM copy that small runs partly in L2 and reads high")
        if "train" in self.checks:
            t = self.train
            if t is None:
                raise ValueError("checks lists train but the [train] table is missing")
            if not gpus and not t.ranks:
                raise ValueError("[train] ranks is needed on a profile without a [gpu] table: how many gloo ranks to start")
            if gpus and t.ranks:
                raise ValueError("[train] ranks is only for profiles without GPUs; one rank runs per GPU")
        for name in ("burnin", "memtest"):
            if name in self.checks:
                table = getattr(self, name)
                if table is None:
                    raise ValueError(f"checks lists {name} but the [{name}] table is missing")
                if not gpus and not table.ranks:
                    raise ValueError(f"[{name}] ranks is needed on a profile without a [gpu] table: how many gloo ranks to start")
                if gpus and table.ranks:
                    raise ValueError(f"[{name}] ranks is only for profiles without GPUs; one rank runs per GPU")
        if "memtest" in self.checks and not gpus and not self.memtest.host_bytes:  # type: ignore[union-attr]
            raise ValueError("[memtest] host_bytes is needed on a profile without a [gpu] table: the host buffer to test")
        return self


class SiteFloor(NamedTuple):
    """A floor the site's config sets: a bare number takes the profile's unit;
    a table may say its unit (checked against the profile's) and its source."""

    value: float
    origin: str  # "config /etc/preflight/config.toml line 7"
    unit: str | None = None
    source: str | None = None
    bound: str | None = None
    gpus: int | None = None
    fabric: str | None = None


class ResolvedFloor(Floor):
    origin: str  # "profile /…/cpu.toml" or "config /etc/preflight/config.toml line 7"


class ResolvedProfile(BaseModel):
    name: str
    description: str
    path: str
    checks: list[str]
    levels: levels_mod.Levels | None = None
    floors: dict[str, ResolvedFloor]
    timeouts: dict[str, float]
    gpu: GpuExpect | None = None
    topology: TopologyExpect | None = None
    nccl: NcclExpect | None = None
    bandwidth: BandwidthExpect | None = None
    train: TrainExpect | None = None
    outliers: OutlierExpect | None = None
    rdma: RdmaExpect | None = None
    fabric: FabricExpect | None = None
    burnin: BurninExpect | None = None
    memtest: MemtestExpect | None = None
    chosen_because: str  # "--profile cpu" or the detection that picked it

    @property
    def has_gpus(self) -> bool:
        return self.gpu is not None


class DetectionFailed(Exception):
    """`auto` could not pick a profile; the run FAILs with this cause and remedy."""

    def __init__(self, cause: str, remedy: str):
        super().__init__(cause)
        self.cause = cause
        self.remedy = remedy


class NvmlUnreadable(DetectionFailed):
    """`auto` could not ask NVML at all (no driver, or it did not answer): there was no GPU to pick by."""


def available(site_dir: Path | None) -> dict[str, Path]:
    """Profile name -> file; a site profile of the same name wins over a built-in."""
    found = {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.toml"))}
    if site_dir is not None and site_dir.is_dir():
        found.update({p.stem: p for p in sorted(site_dir.glob("*.toml"))})
    return found


def load(path: Path) -> Profile:
    data, text = tomlfile.load(path, "profile")
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        raise UsageError(tomlfile.validation_message(e, path, text, "profile")) from None
    if profile.name != path.stem:
        raise UsageError(f"profile {path}: name {profile.name!r} must match the file name {path.stem!r}")
    return profile


def find(name: str, site_dir: Path | None) -> Path:
    profiles = available(site_dir)
    if name not in profiles:
        known = ", ".join(["auto", *sorted(profiles)])
        raise UsageError(f"unknown profile {name!r}; choose one of: {known} (see 'preflight show-profile NAME')")
    return profiles[name]


def resolve(
    profile: Profile,
    path: Path,
    overrides: dict[str, SiteFloor],
    chosen_because: str,
) -> ResolvedProfile:
    """Apply the site's floors to the profile's. A site floor the profile lacks
    must say its unit (a table, as `preflight calibrate` writes): a bare number
    there is more likely a typo than a new floor."""
    unknown = sorted(name for name, site in overrides.items() if name not in profile.floors and site.unit is None)
    if unknown:
        known = ", ".join(sorted(profile.floors)) or "none"
        raise UsageError(
            f"{overrides[unknown[0]].origin}: floor {unknown[0]!r} is not a floor of profile {profile.name} (its floors: {known}); "
            "to add one, write a [floors.NAME] table with value, unit and source"
        )
    floors = {}
    for name, floor in profile.floors.items():
        site = overrides.get(name)
        if site is None:
            floors[name] = ResolvedFloor(**floor.model_dump(), origin=f"profile {path}")
            continue
        if site.unit is not None and site.unit != floor.unit:
            raise UsageError(
                f"{site.origin}: floor {name!r} is in {site.unit!r}, but profile {profile.name} measures it in {floor.unit!r}; "
                f"convert the value to {floor.unit} (48 GB/s is 48e9 bytes_per_second, 80 us is 8e-05 seconds)"
            )
        if site.bound is not None and site.bound != floor.bound:
            raise UsageError(f"{site.origin}: floor {name!r} has bound {site.bound!r}, but profile {profile.name}'s is {floor.bound!r}")
        # The site's number is for the site's nodes: it carries the shape the site gave it (calibrate
        # writes the shape it measured on), not the shape the profile's number was measured on.
        floors[name] = ResolvedFloor(**{**floor.model_dump(), "value": site.value, "source": site.source or floor.source,
                                        "gpus": site.gpus, "fabric": site.fabric}, origin=site.origin)
    for name, site in overrides.items():
        if name not in profile.floors:
            floors[name] = ResolvedFloor(value=site.value, unit=site.unit, source=site.source or site.origin, bound=site.bound or "min",
                                         gpus=site.gpus, fabric=site.fabric, origin=site.origin)
    return ResolvedProfile(
        name=profile.name,
        description=profile.description,
        path=str(path),
        checks=profile.checks,
        levels=profile.levels,
        floors=floors,
        timeouts=profile.timeouts,
        gpu=profile.gpu,
        topology=profile.topology,
        nccl=profile.nccl,
        bandwidth=profile.bandwidth,
        train=profile.train,
        outliers=profile.outliers,
        rdma=profile.rdma,
        fabric=profile.fabric,
        burnin=profile.burnin,
        memtest=profile.memtest,
        chosen_because=chosen_because,
    )


def pick(gpus: list[tuple[str, str | None]], profiles: dict[str, Profile]) -> tuple[str, str]:
    """The profile that fits every GPU, and why (pure, for tests).

    ``gpus`` holds (NVML product name, PCI device id or None). A profile fits
    when one of its ``match`` patterns is in the name and, where both sides
    know it, the device id is one it lists: the name selects, the id confirms
    (an "NVIDIA H200 NVL" must not run under the H200 SXM's floors). The
    longest matching pattern wins, so "H100 NVL" beats "H100".
    """
    if not gpus:
        raise DetectionFailed(
            "the NVIDIA driver is loaded but NVML reports no GPU",
            "check `nvidia-smi`, the PCI devices (`lspci -d 10de:`) and `preflight xid` for errors; "
            "drain the node until the GPUs are back",
        )
    if len(set(gpus)) > 1:
        kinds = sorted(f"{name} ({device or 'device id unknown'})" for name, device in set(gpus))
        raise DetectionFailed(
            f"mixed GPU models on one node: {', '.join(kinds)}",
            "pass --profile explicitly if this mix is intended; otherwise drain the node",
        )
    gpu, device = gpus[0]
    best: tuple[int, str, str] | None = None
    for name, profile in profiles.items():
        ids = profile.gpu.pci_device_ids if profile.gpu else []
        if device and ids and device not in ids:
            continue
        for pattern in profile.match:
            if pattern.lower() in gpu.lower() and (best is None or len(pattern) > best[0]):
                best = (len(pattern), name, pattern)
    if best is None:
        raise DetectionFailed(
            f"no profile matches GPU model {gpu!r} (PCI device id {device or 'unknown'})",
            "pass --profile NAME (see 'preflight show-profile'), or add a profile for this SKU "
            "to /etc/preflight/profiles/",
        )
    _, chosen, pattern = best
    confirmed = f" and PCI device id {device}" if device and profiles[chosen].gpu and profiles[chosen].gpu.pci_device_ids else ""
    return chosen, f"auto: {len(gpus)} x {gpu} matched profile {chosen} by name {pattern!r}{confirmed}"


def detect(site_dir: Path | None, fake: Path | None = None) -> tuple[str, str]:
    """Pick a profile from what NVML (or the ``--nvml-fake`` file) reports: (name, why)."""
    from preflight.readers import nvml

    try:
        inventory = nvml.inventory(fake)
    except nvml.NvmlUnavailable as e:
        raise NvmlUnreadable(e.cause, e.remedy) from None
    return choose(inventory, site_dir)


def choose(inventory: Inventory, site_dir: Path | None) -> tuple[str, str]:
    if not inventory.gpus and inventory.lost:
        lost = inventory.lost[0]
        raise DetectionFailed(
            f"NVML counts {len(inventory.lost)} GPU(s) but cannot reach any: GPU {lost.index} "
            f"({lost.pci_bus_id or 'PCI address unknown'}): {lost.error}",
            BROKEN,
        )
    profiles = {name: load(path) for name, path in available(site_dir).items()}
    return pick([(g.name, g.pci_device_id) for g in inventory.gpus], profiles)
