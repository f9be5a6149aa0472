"""What a profile asks of the checks that load the GPUs, one table each
([bandwidth], [train], [burnin], [memtest]), and how far a member may fall below
the node's own median ([outliers]): the sizes, repeats and durations each runs at,
when a timed figure is sure (``Converging``), and the limits it judges by, each
with the source its number came from. preflight.pipeline.expectations holds the
tables of what the node itself looks like.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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
