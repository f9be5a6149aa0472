"""settings_view finds the report's path for `status` without pydantic: it must
never accept a config file or environment that settings.load refuses, and must
find the path settings.load finds. Config files and environments, good and bad,
go through both; the settings models' fields are pinned, so a new setting fails
here until settings_view knows it too."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.pipeline import settings, settings_view, tomlfile
from preflight.base.errors import UsageError
from preflight.pipeline.settings import ConfigFile, FloorTable, NodeTable, Settings

EXAMPLE = Path(__file__).parents[2] / "examples" / "config.toml"

CONFIGS = [
    EXAMPLE.read_text(),
    "",
    'report = "/srv/r.json"\n',
    'report = "relative/r.json"\nprofile = "cpu"\n',
    'report = "/srv/r.json"\nonly = ["shm", "nccl"]\nskip = ["train,bandwidth"]\nkeep_going = true\nlock_timeout = 0.5\n',
    'python = "/opt/venv/bin/python"\ndriver_version = "550.54.15"\nnproc_per_node = 8\nrdzv_port = 29400\n',
    'report = "/srv/r.json"\nlevel = "quick"\n',
    'report = "/srv/r.json"\nlevel = "full"\n',
    'nnodes = 2\nnode_rank = 1\nrdzv_endpoint = "10.0.0.1:29400"\nrdzv_id = "job"\nrdzv_timeout = 600\nlisten = "0.0.0.0:9842"\n',
    'textfile_dir = "/var/lib/node_exporter"\n[node]\ngpus = 8\nmulti_node = true\n',
    '[floors]\nshm_min_bytes = 8589934592\nh2d_bandwidth = 52e9\n[floors.p2p_bandwidth]\nvalue = 300e9\nunit = "bytes_per_second"\nsource = "calibrated"\nbound = "min"\ngpus = 8\nfabric = "nvswitch"\n',
    # refused by settings.load, each for its own reason
    'profile = "cpu"\nkeep_goin = true\n',
    'profile = "cpu"\n[floors]\nshm_min_bytes = "1G"\n',
    "[floors]\nshm_min_bytes = -1\n",
    "[floors]\nshm_min_bytes = true\n",
    "[floors]\nshm_min_bytes = nan\n",
    "[floors]\nshm_min_bytes = 1" + "0" * 400 + "\n",
    "lock_timeout = 1" + "0" * 400 + "\n",
    "[floors.x]\nunit = \"bytes\"\n",
    "[floors.x]\nvalue = 1\nunits = \"bytes\"\n",
    '[floors.x]\nvalue = 1\nsource = ""\n',
    '[floors.x]\nvalue = 1\nbound = "least"\n',
    "[floors.x]\nvalue = 1\ngpus = 0\n",
    '[floors.x]\nvalue = 1\nfabric = "ethernet"\n',
    "lock_timeout = -3\n",
    "lock_timeout = 86401\n",
    "lock_timeout = inf\n",
    'lock_timeout = "60"\n',
    'keep_going = "perhaps"\n',
    'profile = "cpu\n',
    "[floors\n",
    "[node]\ngpus = 0\n",
    "[node]\ngpus = 257\n",
    "[node]\ngpus = true\n",
    '[node]\ngpus = "8"\n',
    "[node]\ngpus = 7.5\n",
    "[node]\ngpu = 8\n",
    '[node]\nmulti_node = "yes"\n',
    'report = ""\n',
    'report = "  "\n',
    "report = 3\n",
    'profile = ""\n',
    'only = [""]\n',
    'only = [" , "]\n',
    "only = [1]\n",
    'only = "shm"\n',
    "nproc_per_node = 0\n",
    "nproc_per_node = 2.0\n",
    "rdzv_port = 70000\n",
    "nnodes = 0\n",
    "nnodes = 5000\n",
    "node_rank = -1\n",
    "node_rank = 99999999999999999999\n",
    "node_rank = 1\n",  # a single node (nnodes 1) is node rank 0
    "nnodes = 2\nnode_rank = 2\n",
    "a = " + "[" * 1000 + "]" * 1000 + "\n",  # deeper than tomllib recurses
    "a = " + "[" * 100 + "]" * 100 + "\n",
    "rdzv_timeout = 0\n",
    'driver_version = "latest"\n',
    'driver_version = "550.54\\n"\n',
    'python = "~/venv/bin/python"\n',
    'nvml_fake = "/tmp/healthy.json"\n',
    'floor_overrides = {}\n',
    "report = 1979-05-27T07:32:00Z\n",
    'level = "deep"\n',
    'level = "Quick"\n',
    "level = 1\n",
    'level = ""\n',
    "budget = 30\n",
]

ENVIRONMENTS = [
    {},
    {"PREFLIGHT_REPORT": "/env/r.json"},
    {"PREFLIGHT_LOCK_FILE": "/tmp/preflight.lock", "PREFLIGHT_PROFILE": "cpu", "PREFLIGHT_LISTEN": "127.0.0.1:1"},
    {"PREFLIGHT_PROFILES_DIR": "/nonexistent/profiles", "PREFLIGHT_TEXTFILE_DIR": "/tmp"},
    {"PREFLIGHT_REPORT": ""},
    {"PREFLIGHT_LOCK_FILE": " "},
    {"PREFLIGHT_LOCK_TIMEOUT": "soon"},
    {"PREFLIGHT_LOCK_TIMEOUT": "5"},
    {"PREFLIGHT_KEEP_GOING": "perhaps"},
    {"PREFLIGHT_ONLY": ""},
    {"preflight_report": "/lower/r.json"},
    {"PREFLIGHT_PROFLE": "cpu"},
    {"PREFLIGHT_NVML_FAKE": "/tmp/x.json"},
    {"PREFLIGHT_LEVEL": "quick"},
    {"PREFLIGHT_LEVEL": "deep"},
    {"PREFLIGHT_BUDGET": "0"},
]


def both(monkeypatch, flag: Path | None, config: Path | None, env: dict[str, str]):  # noqa: ANN201
    """(settings_view's answer or "unsure", settings.load's answer or "refused")."""
    for key in [k for k in __import__("os").environ if k.upper().startswith("PREFLIGHT_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        quick = settings_view.report_path(flag, config)
    except settings_view.Unsure:
        quick = "unsure"
    try:
        full = settings.load({"report": flag}, config=config).report
    except UsageError:
        full = "refused"
    return quick, full


@pytest.mark.parametrize("text", CONFIGS, ids=range(len(CONFIGS)))
def test_the_report_path_is_settings_loads_or_left_to_it(tmp_path, monkeypatch, text):
    config = tmp_path / "config.toml"
    config.write_text(text)
    for env in ENVIRONMENTS:
        for flag in (None, Path("/flag/r.json")):
            quick, full = both(monkeypatch, flag, config, env)
            assert quick == "unsure" or quick == full, (env, flag, quick, full)


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=range(len(ENVIRONMENTS)))
def test_without_a_config_file_the_environment_is_judged_alike(tmp_path, monkeypatch, env):
    monkeypatch.chdir(tmp_path)
    for config in (None, tmp_path / "missing.toml", tmp_path):
        quick, full = both(monkeypatch, None, config, env)
        assert quick == "unsure" or quick == full, (env, config, quick, full)


def test_the_forms_a_node_uses_are_read_without_pydantic(tmp_path, monkeypatch):
    for i in range(9):  # the valid configs above
        config = tmp_path / f"{i}.toml"
        config.write_text(CONFIGS[i])
        for env in ENVIRONMENTS[:4]:
            quick, full = both(monkeypatch, None, config, env)
            assert quick == full and quick != "unsure", (i, env)
    quick, _ = both(monkeypatch, None, None, {"PREFLIGHT_CONFIG": str(EXAMPLE)})
    assert quick == Path("/var/lib/preflight/report.json")


def test_a_profiles_dir_that_is_a_file_is_left_to_settings_load(tmp_path, monkeypatch):
    (tmp_path / "notadir").write_text("")
    quick, full = both(monkeypatch, None, None, {"PREFLIGHT_PROFILES_DIR": str(tmp_path / "notadir")})
    assert (quick, full) == ("unsure", "refused")


def test_odd_config_files_are_left_to_settings_load(tmp_path, monkeypatch):
    import os

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # opening it would block: it must not be opened at all
    (tmp_path / "big.toml").write_text("# " + "x" * (2 << 20))
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00garbage")
    for config in (fifo, tmp_path / "big.toml", tmp_path / "bin.toml", Path("/dev/zero")):
        assert both(monkeypatch, None, config, {}) == ("unsure", "refused")


# ---- settings_view knows every setting -------------------------------------------------


def test_the_constants_are_the_loaders():
    # As installed, not as conftest points both at a file that is not there.
    same = "from preflight.pipeline import settings, settings_view; print(settings.DEFAULT_CONFIG == settings_view.DEFAULT_CONFIG)"
    assert subprocess.run([sys.executable, "-c", same], capture_output=True, text=True, timeout=60).stdout == "True\n"
    assert settings_view.ENV_PREFIX == settings.ENV_PREFIX
    assert settings_view.MAX_BYTES == tomlfile.MAX_BYTES
    assert settings_view.MAX_GPUS == settings.MAX_GPUS
    assert settings_view.DEFAULT_PROFILES_DIR == ConfigFile.model_fields["profiles_dir"].default


def toml(value: object) -> str:
    """A value as TOML writes it (the few kinds these tests use)."""
    if isinstance(value, DateTime):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + "}"


def config_text(doc: dict) -> str:
    tables = {k: v for k, v in doc.items() if k in ("floors", "node") and isinstance(v, dict)}
    lines = [f"{k} = {toml(v)}" for k, v in doc.items() if k not in tables]
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {toml(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


FULL = {
    "profile": "cpu", "only": ["shm", "nccl"], "skip": ["train"], "keep_going": True, "report": "/srv/r.json",
    "lock_file": "/run/lock/x.lock", "lock_timeout": 60, "profiles_dir": "/nonexistent/profiles", "python": "/opt/venv/bin/python",
    "nproc_per_node": 8, "rdzv_port": 29400, "nnodes": 2, "node_rank": 1, "rdzv_endpoint": "10.0.0.1:29400", "rdzv_id": "job",
    "rdzv_timeout": 600.0, "textfile_dir": "/tmp", "listen": "127.0.0.1:9842", "driver_version": "550.54.15",
    "floors": {"shm_min_bytes": 8589934592, "p2p_bandwidth": {"value": 3e11, "unit": "bytes_per_second", "source": "calibrated",
                                                              "bound": "min", "gpus": 8, "fabric": "nvswitch"}},
    "node": {"gpus": 8, "multi_node": True},
}
ODD = ["", " ", "x", "cpu", "/a", "~/a", "550.54", "min", "max", "pcie", "nvswitch", "1", 0, -1, 1, 8, 256, 257, 4096, 4097, 65535, 65536,
       2**62, 0.0, 0.5, 2.0, -0.5, 86400, 86401, 1e300, float("inf"), float("nan"), True, False, [], [""], [" , "], ["a"], ["a,b"], [1],
       {}, {"value": 1}, {"value": 1, "source": ""}, {"x": 1}, "1979-05-27T07:32:00Z"]


def test_no_changed_setting_is_accepted_that_settings_load_refuses(tmp_path, monkeypatch):
    config = tmp_path / "config.toml"
    accepted = 0
    keys = [(k,) for k in FULL] + [("floors", "shm_min_bytes")] + [("floors", "p2p_bandwidth", k) for k in FULL["floors"]["p2p_bandwidth"]] + [("node", k) for k in FULL["node"]]
    for path in [*keys, ("unknown",), ("floors", "p2p_bandwidth", "units"), ("node", "gpu")]:
        for value in ODD:
            doc = copy.deepcopy(FULL)
            target = doc
            for p in path[:-1]:
                target = target[p]
            target[path[-1]] = value if not (isinstance(value, str) and value.startswith("1979")) else DateTime(value)
            config.write_text(config_text(doc))
            quick, full = both(monkeypatch, None, config, {})
            assert quick == "unsure" or quick == full, (path, value, quick, full)
            accepted += quick != "unsure"
    assert accepted > 200  # the view takes most sound values itself


class DateTime(str):
    """A TOML date-time, written bare."""


def test_the_view_knows_every_key_of_the_config_file():
    assert set(settings_view._CONFIG) == set(ConfigFile.model_fields), "a setting changed: teach preflight/pipeline/settings_view.py"
    assert set(settings_view._FLOOR_TABLE) == set(FloorTable.model_fields)
    assert set(NodeTable.model_fields) == {"gpus", "multi_node"}
    assert set(settings_view._ENV_TEXT) <= set(Settings.model_fields)
    # The validators settings_view mirrors: when one changes, teach preflight/pipeline/settings_view.py first.
    models = (ConfigFile, FloorTable, NodeTable, Settings)
    validators = {m.__name__: {k: v.info.fields for k, v in m.__pydantic_decorators__.field_validators.items()} for m in models}
    paths = ("profile", "report", "lock_file", "profiles_dir", "python", "textfile_dir", "listen")
    common = {"_absolute": ("python",), "_split_lists": ("only", "skip"), "_paths": paths}
    # The config's numbers are TOML numbers, never a bool or a string: the view's _int and _number take no other type.
    numbers = ("nproc_per_node", "rdzv_port", "nnodes", "node_rank", "rdzv_timeout", "slurm_drain_cap", "history_days", "history_runs", "lemon_fails", "lemon_days")
    assert validators == {"ConfigFile": {**common, "_a_number": numbers}, "FloorTable": {}, "NodeTable": {}, "Settings": common}
    assert all(not m.__pydantic_decorators__.model_validators for m in models)
    # The environment's text settings are exactly those the loader only refuses blank.
    assert set(settings_view._ENV_TEXT) == set(paths) - {"python"}
