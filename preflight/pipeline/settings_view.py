"""Where the report is, from the settings, read without pydantic.

`status` needs one setting, the report's path, yet must refuse a bad config
file or PREFLIGHT_* variable exactly as every other command does (exit 2,
naming the file, line and key). ``report_path`` reads the flag, the
environment and the config file in the forms people write, each value
against the settings models' own types and constraints, and raises Unsure
for anything else: the caller then loads the settings the full way
(settings.load), so what is refused, and every message, stay that loader's.
It never accepts what settings.load refuses: tests/pipeline/test_settings_view.py
holds it to that, and fails when the settings gain a field it does not know.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from preflight.pipeline.report_schema import LEVELS, MAX_NODES, Declined, one_of
from preflight.readers import capture

# As in settings.py and tomlfile.py, which import pydantic; the tests hold them equal.
DEFAULT_CONFIG = Path("/etc/preflight/config.toml")
DEFAULT_PROFILES_DIR = Path("/etc/preflight/profiles")
ENV_PREFIX = "PREFLIGHT_"
MAX_BYTES = 1 << 20
MAX_GPUS = 256


# Not a form this reader vouches for: settings.load decides. One class with the
# report reader's, so the checks below can be shared.
Unsure = Declined


def report_path(flag: Path | None, config: Path | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """``settings.load({"report": flag}, config).report``, or Unsure."""
    environ = os.environ if environ is None else environ
    env = {}
    for key, value in environ.items():
        if key == ENV_PREFIX + "CONFIG" or not key.upper().startswith(ENV_PREFIX):
            continue
        field = key[len(ENV_PREFIX):].lower()
        if key != ENV_PREFIX + field.upper() or field not in _ENV_TEXT or not value.strip():
            raise Unsure  # another setting, another spelling, or a value the loader refuses
        env[field] = value
    path = config if config is not None else Path(environ[ENV_PREFIX + "CONFIG"]) if environ.get(ENV_PREFIX + "CONFIG") else None
    if path is None and DEFAULT_CONFIG.exists():
        path = DEFAULT_CONFIG
    data = _config(path) if path is not None else {}
    profiles_dir = Path(env.get("profiles_dir") or data.get("profiles_dir") or DEFAULT_PROFILES_DIR)
    if profiles_dir.exists() and not profiles_dir.is_dir():
        raise Unsure
    report = flag or env.get("report") or data.get("report")
    return Path(report) if report is not None else None


def _config(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    try:
        fd, st = capture.open_nonblocking(path)  # a FIFO must not block, even one swapped in after a stat
        try:
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
                raise Unsure
            data = tomllib.loads(capture.read_regular(fd, MAX_BYTES).decode("utf-8"))
        finally:
            os.close(fd)
    except (OSError, ValueError, RecursionError):  # UnicodeDecodeError and TOMLDecodeError are ValueErrors
        raise Unsure from None
    config = _table(_CONFIG)(data)
    if config.get("node_rank", 0) >= config.get("nnodes", 1):
        raise Unsure  # the loader names both settings
    return config


# ---- the settings models' field types, strictly -------------------------------------

Check = Callable[[Any], Any]


def _text(v: Any) -> str:
    """A path or name the loader takes: any text but blank."""
    if type(v) is not str or not v.strip():
        raise Unsure
    return v


def _str(v: Any) -> str:
    if type(v) is not str:
        raise Unsure
    return v


def _bool(v: Any) -> bool:
    if type(v) is not bool:
        raise Unsure
    return v


def _int(lo: int, hi: float = math.inf) -> Check:
    def check(v: Any) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise Unsure
        return v

    return check


def _finite(v: float) -> bool:
    """A finite float, or an integer within a float's range (1 and 400 zeros is neither)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _number(lo: float, hi: float, above: bool = False) -> Check:
    def check(v: Any) -> float:
        if type(v) not in (int, float) or not _finite(v) or not lo <= v <= hi or (above and v == lo):
            raise Unsure
        return v

    return check


def _checks(v: Any) -> list[str]:
    """--only/--skip names: a list of strings, naming at least one check if not empty."""
    if type(v) is not list or not all(type(x) is str for x in v):
        raise Unsure
    if v and not any(part.strip() for x in v for part in x.split(",")):
        raise Unsure
    return v


def _python(v: Any) -> str:
    if _text(v).startswith("~"):  # the loader expands it against a home that may not exist
        raise Unsure
    return v


def _driver_version(v: Any) -> str:
    if type(v) is not str or not re.fullmatch(r"[0-9]+(\.[0-9]+)*", v):
        raise Unsure
    return v


def _firmware(pattern: str) -> Check:
    def check(v: Any) -> str:
        if type(v) is not str or not re.fullmatch(pattern, v):
            raise Unsure
        return v

    return check


_floor_value = _number(0, math.inf)
_FLOOR_TABLE = {
    "value": _floor_value,
    "unit": _str,
    "source": _text,
    "bound": one_of("min", "max"),
    "gpus": _int(1, MAX_GPUS),
    "fabric": one_of("nvswitch", "nvlink", "pcie"),
}


def _table(fields: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    def check(v: Any) -> dict[str, Any]:
        if type(v) is not dict or not set(v) <= set(fields) or not set(required) <= set(v):
            raise Unsure
        return {k: fields[k](x) for k, x in v.items()}

    return check


def _floor(v: Any) -> Any:
    return _table(_FLOOR_TABLE, required=("value",))(v) if type(v) is dict else _floor_value(v)


def _floors(v: Any) -> dict[str, Any]:
    if type(v) is not dict:
        raise Unsure
    return {k: _floor(x) for k, x in v.items()}


# settings.ConfigFile: the config file's schema (extra keys forbidden).
_CONFIG = {
    "profile": _text,
    "level": one_of(*LEVELS),
    "only": _checks,
    "skip": _checks,
    "keep_going": _bool,
    "report": _text,
    "lock_file": _text,
    "lock_timeout": _number(0, 86400),
    "profiles_dir": _text,
    "python": _python,
    "python_of_another_user": _bool,
    "nproc_per_node": _int(1, MAX_GPUS),
    "rdzv_port": _int(0, 65535),
    "nnodes": _int(1, MAX_NODES),
    "node_rank": _int(0, MAX_NODES - 1),
    "rdzv_endpoint": _str,
    "rdzv_id": _str,
    "rdzv_timeout": _number(0, 86400, above=True),
    "textfile_dir": _text,
    "slurm_drain_cap": _number(0, 1, above=True),
    "history_days": _number(0, 36500, above=True),
    "history_runs": _int(1, 1_000_000),
    "lemon_fails": _int(1, 1000),
    "lemon_days": _number(0, 3650, above=True),
    "listen": _text,
    "driver_version": _driver_version,
    "vbios_version": _firmware(r"[0-9A-Fa-f]{2}(\.[0-9A-Fa-f]{2}){4}"),
    "inforom_version": _firmware(r"[A-Z0-9]+\.[0-9]{4}\.[0-9]{2}\.[0-9]{2}"),
    "floors": _floors,
    "node": _table({"gpus": _int(1, MAX_GPUS), "multi_node": _bool}),
}
# PREFLIGHT_* variables taken here: settings whose value is any text but blank.
_ENV_TEXT = ("profile", "report", "lock_file", "profiles_dir", "textfile_dir", "listen")
