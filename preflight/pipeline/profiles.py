"""Profiles: hardware truth for one GPU SKU, one TOML file each.

A profile fixes the check order and every floor with the source its number
came from. It holds what is true of a GPU model, never the node's shape: one
profile serves 1-, 2-, 4- and 8-GPU nodes of its model (preflight.pipeline.shape reads
the shape). A floor measured on one shape of node (a collective's busbw on 8
GPUs joined by NVSwitch) says so, and judges only nodes of that shape. A site config may override any floor; the
resolved profile remembers where each value came from, so `show-profile`
can answer "why 1 GiB?". Which profile `auto` picks is preflight.pipeline.profile_detect's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

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
from preflight.pipeline.expectations import DriftExpect, FabricExpect, GpuExpect, NcclExpect, RdmaExpect, TopologyExpect
from preflight.pipeline.load_expectations import BandwidthExpect, BurninExpect, MemtestExpect, OutlierExpect, TrainExpect
from preflight.base.errors import UsageError

BUILTIN_DIR = Path(__file__).parent / "profiles"


def _floor_value(v: Any) -> float:
    """A number, finite and >= 0: a quoted "1G" or a `true` must not become a floor."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"a floor must be a number, not {type(v).__name__} {v!r}")
    try:
        f = float(v)  # an integer past a float's range (1 and 400 zeros) is no finite number either
    except OverflowError:
        raise ValueError(f"a floor must be a finite number >= 0, not an integer of {len(str(abs(v)))} digits") from None
    if not math.isfinite(f) or f < 0:
        raise ValueError(f"a floor must be a finite number >= 0, not {v!r}")
    return f


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
    # The GPUs whose ranks the value provides for (shm_min_bytes: an 8-GPU node's segments and
    # batches): a run on fewer of them is held to its share (checks/shm.py). None: as given.
    for_gpus: int | None = Field(default=None, ge=1, le=256)


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
    drift: DriftExpect | None = None  # None: no figure is judged against its own history

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
        if self.fabric is not None and self.fabric.nvswitches is None and (self.gpu is None or self.gpu.model_floors):
            raise ValueError("[fabric] nvswitches and board_gpus are needed where the profile describes a GPU model (only model_floors = false goes without)")
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

    @property
    def from_profile(self) -> bool:
        """The profile's own cited floor, not a site's (config, calibrate): the one a check may fit to the node."""
        return self.origin.startswith("profile")


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
    drift: DriftExpect | None = None  # None: no figure is judged against its own history
    chosen_because: str  # "--profile cpu" or the detection that picked it

    @property
    def has_gpus(self) -> bool:
        return self.gpu is not None


def available(site_dir: Path | None) -> dict[str, Path]:
    """Profile name -> file; a site profile of the same name wins over a built-in."""
    found = {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.toml"))}
    if site_dir is not None and site_dir.is_dir():
        found.update({p.stem: p for p in sorted(site_dir.glob("*.toml"))})
    return found


def _whole_floats_as_ints(data: Any) -> Any:
    """TOML's floats that are whole numbers as ints, all through ``data``: strict validation takes an int
    where a float is wanted, never a float where an int is, and lax validation took 80e9 for 80000000000."""
    if isinstance(data, dict):
        return {k: _whole_floats_as_ints(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_whole_floats_as_ints(v) for v in data]
    if isinstance(data, float) and data.is_integer():
        return int(data)
    return data


def load(path: Path) -> Profile:
    data, text = tomlfile.load(path, "profile")
    try:
        # Strictly, as TOML is typed: `seconds = true` or `ranks = true` would read as 1, `seconds = "12"` as 12.
        # A whole number written as a float (`memory_min_bytes = 80e9`) is still that number.
        profile = Profile.model_validate(_whole_floats_as_ints(data), strict=True)
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
        drift=profile.drift,
        chosen_because=chosen_because,
    )

