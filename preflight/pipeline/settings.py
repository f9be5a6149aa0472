"""Deployment choices, layered: CLI flags > PREFLIGHT_* env > config TOML > defaults.

Settings say *how* to run here (which profile, where the report goes, lock
behaviour). Hardware truth lives in profiles; the config file's ``[floors]``
table may override a profile's floors for this site.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, PrivateAttr, StrictBool, Tag, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from preflight.pipeline import levels, lock, tomlfile
from preflight.base.errors import UsageError
from preflight.pipeline.profiles import FloorValue, SiteFloor
from preflight.pipeline.report_paths import default_report_path
from preflight.pipeline.report_schema import MAX_NODES

DEFAULT_CONFIG = Path("/etc/preflight/config.toml")
# The most GPUs one node can hold: more than any board's slots (HGX: 8,
# GB200 NVL72 trays: 4), and what torchrun's per-node rank settings allow here.
MAX_GPUS = 256
ENV_PREFIX = "PREFLIGHT_"

CheckList = Annotated[list[str], NoDecode]


def _split(v: Any) -> Any:
    """``"shm,nccl"`` (env) and ``["shm,nccl"]`` (repeated flags) both mean two checks."""
    if isinstance(v, str):
        v = [v]
    if isinstance(v, list):
        names = [part.strip() for item in v for part in str(item).split(",") if part.strip()]
        if v and not names:
            raise ValueError("names no check; leave it out to run every check")
        return names
    return v


def _not_empty(v: Any) -> Any:
    if isinstance(v, str) and not v.strip():
        raise ValueError("must not be empty")
    return v


class _Common(BaseModel):
    """Fields shared by the settings and the config file (which forbids other keys)."""

    profile: str = "auto"
    # How deep the run looks (preflight/pipeline/levels.py): quick, standard or full.
    # None: standard, or under a budget the deepest level that fits.
    level: Annotated[str | None, BeforeValidator(levels.parse_level)] = None
    only: CheckList = Field(default_factory=list)
    skip: CheckList = Field(default_factory=list)
    keep_going: bool = False
    report: Path | None = None
    # Root: /run/preflight/preflight.lock; anyone else: a directory of their own (pipeline/lock.py).
    lock_file: Path = Field(default_factory=lock.default_path)
    lock_timeout: float = Field(default=60.0, ge=0, le=86400, allow_inf_nan=False)
    profiles_dir: Path = Path("/etc/preflight/profiles")
    # The interpreter that runs GPU workers: the training environment's own, so
    # preflight validates the torch, CUDA runtime and NCCL the job will use.
    python: Path | None = None
    # As root, a workers' Python another user owns or can change (a team's venv) is refused: that user
    # would decide what root runs on the node. A site that accepts it says so here, and each run warns.
    python_of_another_user: bool = False
    # Local ranks for torchrun workers; default: one per GPU (the profile's [nccl] ranks without GPUs).
    nproc_per_node: int | None = Field(default=None, ge=1, le=256)
    # torchrun's rendezvous port on 127.0.0.1 (a firewall may want it fixed); 0: a free one.
    rdzv_port: int = Field(default=0, ge=0, le=65535)
    # A group of nodes (preflight/gpuwork/multinode.py): nccl and bandwidth run across all of
    # them. nnodes 1 is a single node; the endpoint is node rank 0's HOST:PORT.
    nnodes: int = Field(default=1, ge=1, le=MAX_NODES)
    node_rank: int = Field(default=0, ge=0, lt=MAX_NODES)  # and below nnodes: load() says so naming both
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    # How long a node waits for its peers at each meeting (before nccl): nodes of
    # one job start minutes apart under Kubernetes (image pulls), seconds under srun.
    rdzv_timeout: float = Field(default=300.0, gt=0, le=86400, allow_inf_nan=False)
    # node_exporter's --collector.textfile.directory: `run` writes preflight.prom there.
    textfile_dir: Path | None = None
    # slurm-healthcheck drains no node while this share of a partition (at least one node) is
    # drained by preflight already: a bad floor or rollout must not empty a partition (outputs/schedulers/slurm_cap.py).
    slurm_drain_cap: float = Field(default=0.10, gt=0, le=1, allow_inf_nan=False)
    # Where `preflight serve` listens. Loopback unless the site chooses otherwise:
    # the report names the node's faults, which is not for every network to read.
    listen: str = "127.0.0.1:9842"
    # Pin the driver exactly (fleet uniformity); the profile only sets a minimum.
    driver_version: str | None = Field(default=None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    # Pin every GPU's VBIOS and InfoROM image (the firmware check), as nvidia-smi -q prints them.
    vbios_version: str | None = Field(default=None, pattern=r"^[0-9A-Fa-f]{2}(\.[0-9A-Fa-f]{2}){4}$")
    inforom_version: str | None = Field(default=None, pattern=r"^[A-Z0-9]+\.[0-9]{4}\.[0-9]{2}\.[0-9]{2}$")
    # The node's history, history.db beside the report (outputs/record/history.py): runs older than
    # history_days, and past the newest history_runs, are dropped as each run is added.
    history_days: float = Field(default=90.0, gt=0, le=36500, allow_inf_nan=False)
    history_runs: int = Field(default=10000, ge=1, le=1_000_000)
    # A lemon (outputs/record/history_judge.py): lemon_fails failed runs within lemon_days make the
    # node's action `service`, even when the latest run passes.
    lemon_fails: int = Field(default=3, ge=1, le=1000)
    lemon_days: float = Field(default=7.0, gt=0, le=3650, allow_inf_nan=False)

    @field_validator("python")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        # Workers start in a directory of their own: "venv/bin/python" must
        # mean the one beside the person who typed it. absolute(), not
        # resolve(): a venv's python is a symlink that must stay in the venv.
        return v.expanduser().absolute() if v is not None else None

    _split_lists = field_validator("only", "skip", mode="before")(_split)
    _paths = field_validator("profile", "report", "lock_file", "profiles_dir", "python", "textfile_dir", "listen", mode="before")(_not_empty)


class FloorTable(BaseModel):
    """``[floors.NAME]`` with value, unit and source: what `preflight calibrate` writes."""

    model_config = ConfigDict(extra="forbid")

    value: FloorValue
    unit: str | None = None
    source: str | None = Field(default=None, min_length=1)
    bound: Literal["min", "max"] | None = None
    # The node shape the value was measured on (what calibrate writes for whole-node figures).
    gpus: int | None = Field(default=None, ge=1, le=MAX_GPUS, strict=True)
    fabric: Literal["nvswitch", "nvlink", "pcie"] | None = None


# A bare number, or a table: told apart before validating, so an error names the key, not the union.
SiteFloorValue = Annotated[
    Union[Annotated[FloorValue, Tag("number")], Annotated[FloorTable, Tag("table")]],
    Discriminator(lambda v: "table" if isinstance(v, (dict, FloorTable)) else "number"),
]


def _gpu_count(v: Any, strict: bool) -> int:
    """A whole number of GPUs: `gpus = true` must not pin one GPU, nor "8" in TOML pass as a number."""
    text = v.strip() if isinstance(v, str) and not strict else None
    if text is not None and text.isdigit():
        v = int(text)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_GPUS:
        raise ValueError(f"must be a whole number of GPUs from 1 to {MAX_GPUS} (no node holds more), not {v!r}")
    return v


GpuCount = Annotated[int, BeforeValidator(lambda v: _gpu_count(v, strict=False))]


class NodeTable(BaseModel):
    """``[node]``: what the site knows of its nodes that a node cannot show."""

    model_config = ConfigDict(extra="forbid")

    gpus: Annotated[int, BeforeValidator(lambda v: _gpu_count(v, strict=True))] | None = None
    multi_node: StrictBool = False


class ConfigFile(_Common):
    """The config file's schema. TOML has real booleans and numbers, so unlike
    environment strings they are taken strictly: `keep_going = "yes"` is an error."""

    model_config = ConfigDict(extra="forbid")

    keep_going: StrictBool = False
    lock_timeout: float = Field(default=60.0, ge=0, le=86400, allow_inf_nan=False, strict=True)
    floors: dict[str, SiteFloorValue] = Field(default_factory=dict)
    node: NodeTable = Field(default_factory=NodeTable)

    @field_validator("nproc_per_node", "rdzv_port", "nnodes", "node_rank", "rdzv_timeout", "slurm_drain_cap",
                     "history_days", "history_runs", "lemon_fails", "lemon_days", mode="before")
    @classmethod
    def _a_number(cls, v: Any) -> Any:
        # `slurm_drain_cap = true` would read as 1.0 (no cap), `history_days = true` as a day of history
        # kept, `nnodes = "2"` as a number: TOML writes numbers bare.
        if isinstance(v, (bool, str)):
            raise ValueError(f"must be a number, written without quotes, not {v!r}")
        return v


_file_data: ContextVar[dict[str, Any]] = ContextVar("preflight_config_file", default={})


class _ConfigFileSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole file

    def __call__(self) -> dict[str, Any]:
        data = _file_data.get()
        out = {k: v for k, v in data.items() if k not in ("floors", "node")}
        # [node] gpus -> node_gpus: the names flags (--node-gpus) and PREFLIGHT_NODE_GPUS use.
        out.update({f"node_{k}": v for k, v in (data.get("node") or {}).items()})
        return out


class Settings(_Common, BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    # Facts from a JSON file instead of NVML, for tests and demos. Flag or
    # environment only: a config file must never make a real node read fakes.
    nvml_fake: Path | None = None
    # `[node]` in the config: a count of GPUs the site pins (fewer seen FAILs), and
    # that this node serves multi-node jobs (so it must have RDMA NICs).
    node_gpus: GpuCount | None = None
    node_multi_node: bool = False
    # Seconds this run may be expected to take: the deepest level that fits runs.
    # Flag or environment only: a site-wide budget in the config would also bound the boot gate.
    budget: Annotated[float | None, BeforeValidator(levels.parse_budget)] = None

    # Private, so no environment variable can set them: only the config file sets floors.
    _config: Path | None = PrivateAttr(default=None)
    _floor_overrides: dict[str, SiteFloor] = PrivateAttr(default_factory=dict)
    _report_is_default: bool = PrivateAttr(default=False)
    _outputs_of_node: tuple[bool, bool] = PrivateAttr(default=(False, False))
    _profile_given: bool = PrivateAttr(default=False)

    @property
    def config(self) -> Path | None:
        """The config file that was read, for the report."""
        return self._config

    @property
    def report_is_default(self) -> bool:
        """``report`` is the default (report_paths.default_report_path), which `run` writes where
        neither --report nor the settings name one: outputs_of sets it."""
        return self._report_is_default

    @property
    def report_of_node(self) -> bool:
        """``report`` is the node's own: the default, or one the config or environment names (the
        site's gate's), not one this command line gave: outputs_of sets it."""
        return self._outputs_of_node[0]

    @property
    def profile_given(self) -> bool:
        """``profile`` was chosen for this run (--profile, PREFLIGHT_PROFILE, a --config that sets it):
        not the node's own (its config where it lies, or `auto`), which the gate runs by."""
        return self._profile_given

    @property
    def textfile_of_node(self) -> bool:
        """``textfile_dir`` is the node's own: named by the config or environment, not this command line."""
        return self._outputs_of_node[1]

    @property
    def floor_overrides(self) -> dict[str, SiteFloor]:
        """Floor name -> (value, "config FILE line N", unit, source)."""
        return self._floor_overrides

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _ConfigFileSource(settings_cls))


def _config_path(flag: Path | None, environ: dict[str, str]) -> Path | None:
    if flag is not None:
        return flag
    if env := environ.get(ENV_PREFIX + "CONFIG"):
        return Path(env)
    return DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None


def _read_config(path: Path) -> tuple[dict[str, Any], dict[str, SiteFloor]]:
    data, text = tomlfile.load(path, "config")
    try:
        config = ConfigFile.model_validate(data)
    except ValidationError as e:
        raise UsageError(tomlfile.validation_message(e, path, text, "config")) from None
    origins = {}
    for name, value in config.floors.items():
        origin = f"config {path} line {tomlfile.line_of(text, ('floors', name))}"
        if isinstance(value, FloorTable):
            origins[name] = SiteFloor(value.value, origin, value.unit, value.source, value.bound, value.gpus, value.fabric)
        else:
            origins[name] = SiteFloor(value, origin)
    return data, origins


def load(flags: dict[str, Any], config: Path | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Settings from CLI ``flags`` (only those the person gave), env, and config file."""
    environ = dict(os.environ if environ is None else environ)
    path = _config_path(config, environ)
    data, origins = _read_config(path) if path else ({}, {})
    given = {k: v for k, v in flags.items() if v is not None and v != []}
    token = _file_data.set(data)
    try:
        settings = Settings(**given)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        if field in given:
            where = "--" + field.replace("_", "-")
        else:
            env = ENV_PREFIX + field.upper()
            where = f"{env}={environ.get(env, '')!r}"
        raise UsageError(f"{where}: {first['msg']}") from None
    finally:
        _file_data.reset(token)
    settings._config, settings._floor_overrides = path, origins
    # A choice for this run: --profile, PREFLIGHT_PROFILE, or a config named on the command line (a trial
    # config); the node's own comes from its config where it lies (or PREFLIGHT_CONFIG) or from `auto`.
    # `auto` named anywhere is the node's own: what it picks is the node's. The environment is read as
    # pydantic-settings reads it, its names in any case.
    named_in_env = any(k.upper() == ENV_PREFIX + "PROFILE" for k in environ)
    settings._profile_given = settings.profile != "auto" and ("profile" in given or named_in_env or (config is not None and "profile" in data))
    if settings.node_rank >= settings.nnodes:
        rank, nodes = _origin("node_rank", given, environ, path, data), _origin("nnodes", given, environ, path, data)
        raise UsageError(f"node_rank {settings.node_rank} ({rank}) is not below nnodes {settings.nnodes} ({nodes}): a group of N nodes "
                         "has node ranks 0 to N-1; give each node its own rank below nnodes (a single node is rank 0)")
    if settings.profiles_dir.exists() and not settings.profiles_dir.is_dir():
        # A missing directory only means no site profiles; a file there is a mistake.
        raise UsageError(f"profiles_dir {settings.profiles_dir}: not a directory; point it at a directory of NAME.toml profiles")
    return settings


def _origin(field: str, given: dict[str, Any], environ: dict[str, str], path: Path | None, data: dict[str, Any]) -> str:
    """Where a setting's value came from, in the words a person would look for it."""
    if field in given:
        return "--" + field.replace("_", "-")
    if ENV_PREFIX + field.upper() in environ:
        return ENV_PREFIX + field.upper()
    return f"config {path}" if field in data else "the default"


def unknown_env(environ: dict[str, str] | None = None) -> list[str]:
    """PREFLIGHT_* variables that set nothing: a typo silently ignored is worse than a warning."""
    environ = os.environ if environ is None else environ
    # PREFLIGHT_WORKER_FAULT is the workers' test-only fault knob (checks/workers/_rank.py); PREFLIGHT_AGENT and
    # PREFLIGHT_LAUNCHER_PID are what preflight/base/tether.py gives every process it starts (selftest's stages too).
    known = {ENV_PREFIX + f.upper() for f in Settings.model_fields} | {ENV_PREFIX + n for n in ("CONFIG", "WORKER_FAULT", "AGENT", "LAUNCHER_PID")}
    return sorted(k for k in environ if k.upper().startswith(ENV_PREFIX) and k.upper() not in known)


def outputs_of(s: Settings, report: Path | None, textfile_dir: Path | None, scratch: bool) -> str | None:
    """Which report and textfile this run writes (``report`` and ``textfile_dir``:
    what its command line gave). A single-node run with no report given or
    configured writes the default one (report_paths.default_report_path), where
    `status`, `serve`, `report` and `history` read by default. The configured
    ones, and the default, are the node's gate, which neither a scratch run (a
    pairwise side, a trial) nor a group run may replace: one failing node fails
    the whole group, and every reader of the gate would then refuse the good
    nodes too. Returns what to tell the user, if anything."""
    if scratch:
        if report is not None or textfile_dir is not None:
            raise UsageError("--scratch writes no report and no textfile; leave out --report and --textfile-dir")
        s.report = s.textfile_dir = None
        return None
    if s.nnodes == 1:
        if s.report is None and s.nvml_fake is not None:
            # Fake NVML facts are a test's node, not this one: its verdict must not become the node's.
            return "a run on fake NVML facts (--nvml-fake) writes no default report; give --report FILE to keep its verdict"
        if s.report is None:
            s.report, s._report_is_default = default_report_path(), True
        s._outputs_of_node = (report is None, s.textfile_dir is not None and textfile_dir is None)
        return None
    dropped = [f"{what} {path}" for what, path, given in (("report", s.report, report), ("textfile dir", s.textfile_dir, textfile_dir)) if path is not None and given is None]
    s.report, s.textfile_dir = report, textfile_dir
    if not dropped:
        return None
    return f"a {s.nnodes}-node run does not write the node's own {' or '.join(dropped)} (from config or environment); give --report or --textfile-dir to keep its verdict"
