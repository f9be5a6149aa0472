import os
from pathlib import Path

import pytest

from preflight.pipeline import settings
from preflight.base.errors import UsageError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults(monkeypatch):
    monkeypatch.delenv("PREFLIGHT_REPORT")  # the tests' own (conftest): here, no report is set at all
    s = settings.load({})
    assert (s.profile, s.only, s.keep_going, s.report, s.lock_timeout) == ("auto", [], False, None, 60.0)
    assert s.config is None


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path, monkeypatch):
    cfg = write(tmp_path, 'profile = "from-file"\nkeep_going = true\nlock_timeout = 7\nonly = ["shm"]\n')
    s = settings.load({}, config=cfg)
    assert (s.profile, s.keep_going, s.lock_timeout, s.only) == ("from-file", True, 7.0, ["shm"])
    monkeypatch.setenv("PREFLIGHT_PROFILE", "from-env")
    monkeypatch.setenv("PREFLIGHT_LOCK_TIMEOUT", "9")
    s = settings.load({}, config=cfg)
    assert (s.profile, s.lock_timeout, s.keep_going) == ("from-env", 9.0, True)
    s = settings.load({"profile": "from-flag", "keep_going": False, "lock_timeout": None}, config=cfg)
    assert (s.profile, s.keep_going, s.lock_timeout) == ("from-flag", False, 9.0)


def test_config_comes_from_env_when_no_flag(tmp_path, monkeypatch):
    cfg = write(tmp_path, 'profile = "cpu"\n')
    monkeypatch.setenv("PREFLIGHT_CONFIG", str(cfg))
    s = settings.load({})
    assert s.profile == "cpu" and s.config == cfg


def test_default_config_file_is_read_when_present(tmp_path, monkeypatch):
    cfg = write(tmp_path, 'profile = "cpu"\n')
    monkeypatch.setattr(settings, "DEFAULT_CONFIG", cfg)
    assert settings.load({}).profile == "cpu"


def test_check_lists_split_on_commas_from_env_and_flags(monkeypatch):
    monkeypatch.setenv("PREFLIGHT_SKIP", "nccl, train")
    s = settings.load({"only": ["shm,cuda", "topology"]})
    assert s.only == ["shm", "cuda", "topology"] and s.skip == ["nccl", "train"]


def test_floor_overrides_remember_their_line(tmp_path):
    cfg = write(tmp_path, '# site\nprofile = "cpu"\n\n[floors]\nshm_min_bytes = 2147483648\n')
    s = settings.load({}, config=cfg)
    assert s.floor_overrides == {"shm_min_bytes": (2147483648.0, f"config {cfg} line 5", None, None, None, None, None)}


def test_a_floor_table_keeps_its_unit_source_and_bound(tmp_path):
    cfg = write(tmp_path, '[floors.allreduce_latency]\nvalue = 9e-05\nunit = "seconds"\nbound = "max"\nsource = "calibrated"\n')
    s = settings.load({}, config=cfg)
    assert s.floor_overrides == {"allreduce_latency": (9e-05, f"config {cfg} line 1", "seconds", "calibrated", "max", None, None)}


def test_a_floor_table_keeps_the_shape_it_was_measured_on(tmp_path):
    cfg = write(tmp_path, '[floors.allreduce_bus_bandwidth]\nvalue = 3e11\nunit = "bytes_per_second"\ngpus = 2\nfabric = "nvswitch"\nsource = "calibrated"\n')
    site = settings.load({}, config=cfg).floor_overrides["allreduce_bus_bandwidth"]
    assert (site.gpus, site.fabric) == (2, "nvswitch")


def test_node_gpus_comes_from_the_config_the_environment_or_the_flag(tmp_path, monkeypatch):
    cfg = write(tmp_path, "[node]\ngpus = 8\nmulti_node = true\n")
    s = settings.load({}, config=cfg)
    assert (s.node_gpus, s.node_multi_node) == (8, True)
    monkeypatch.setenv("PREFLIGHT_NODE_GPUS", "4")
    assert settings.load({}, config=cfg).node_gpus == 4
    assert settings.load({"node_gpus": 2}, config=cfg).node_gpus == 2
    monkeypatch.setenv("PREFLIGHT_NODE_GPUS", "four")
    with pytest.raises(UsageError, match="PREFLIGHT_NODE_GPUS='four': .*whole number of GPUs"):
        settings.load({}, config=cfg)


def test_a_floor_table_with_an_unknown_key_names_it(tmp_path):
    cfg = write(tmp_path, '[floors.h2d_bandwidth]\nvalue = 48\nunits = "GB/s"\n')
    with pytest.raises(UsageError, match=r"line 3: floors.h2d_bandwidth.units: unknown key"):
        settings.load({}, config=cfg)


@pytest.mark.parametrize(
    "text, message",
    [
        ('profile = "cpu"\nkeep_goin = true\n', r"config .*config.toml line 2: keep_goin: unknown key"),
        ('profile = "cpu"\n[floors]\nshm_min_bytes = "1G"\n', r"line 3: floors.shm_min_bytes: Value error, a floor must be a number, not str '1G'"),
        ('[floors]\nshm_min_bytes = -1\n', r"line 2: floors.shm_min_bytes: Value error, a floor must be a finite number >= 0, not -1"),
        ('[floors]\nshm_min_bytes = true\n', r"line 2: floors.shm_min_bytes: Value error, a floor must be a number, not bool"),
        ('[floors]\nshm_min_bytes = nan\n', r"a floor must be a finite number"),
        ('lock_timeout = -3\n', r"line 1: lock_timeout: Input should be greater than or equal to 0"),
        ('keep_going = "perhaps"\n', r"line 1: keep_going: Input should be a valid boolean"),
        ('profile = "cpu\n', r"config .*config.toml: invalid TOML: .*line 1"),
        ('[floors\n', r"invalid TOML"),
        # A site's GPU pin: a whole number a node can hold, named by file, line and key.
        ("[node]\ngpus = 0\n", r"config .*config.toml line 2: node.gpus: .*whole number of GPUs from 1 to 256"),
        ("[node]\ngpus = -8\n", r"line 2: node.gpus: .*whole number of GPUs from 1 to 256"),
        ("[node]\ngpus = 100000\n", r"line 2: node.gpus: .*from 1 to 256 \(no node holds more\), not 100000"),
        ("[node]\ngpus = true\n", r"line 2: node.gpus: .*not True"),
        ('[node]\ngpus = "8"\n', r"line 2: node.gpus: .*not '8'"),
        ("[node]\ngpus = 7.5\n", r"line 2: node.gpus: .*not 7.5"),
        ("[node]\ngpu = 8\n", r"line 2: node.gpu: unknown key"),
    ],
)
def test_bad_config_names_file_line_and_key(tmp_path, text, message):
    with pytest.raises(UsageError, match=message):
        settings.load({}, config=write(tmp_path, text))


def test_missing_or_binary_config_file(tmp_path):
    with pytest.raises(UsageError, match=r"config file .*nope.toml does not exist"):
        settings.load({}, config=tmp_path / "nope.toml")
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError, match=r"is not UTF-8 text"):
        settings.load({}, config=tmp_path / "bin.toml")
    with pytest.raises(UsageError, match=r"is a directory"):
        settings.load({}, config=tmp_path)


def test_bad_env_and_flag_values_name_their_source(monkeypatch):
    monkeypatch.setenv("PREFLIGHT_LOCK_TIMEOUT", "soon")
    with pytest.raises(UsageError, match=r"PREFLIGHT_LOCK_TIMEOUT='soon': Input should be a valid number"):
        settings.load({})
    monkeypatch.delenv("PREFLIGHT_LOCK_TIMEOUT")
    with pytest.raises(UsageError, match=r"--lock-timeout: Input should be greater than or equal to 0"):
        settings.load({"lock_timeout": -1.0})


def test_unknown_preflight_env_vars_are_reported():
    env = {"PREFLIGHT_PROFILE": "cpu", "PREFLIGHT_PROFLE": "cpu", "PATH": "/bin"}
    assert settings.unknown_env(env) == ["PREFLIGHT_PROFLE"]



def test_what_the_tether_gives_its_children_is_no_unknown_setting():
    from preflight.base import tether

    # Before: each selftest stage's `preflight run` warned "PREFLIGHT_AGENT is not a preflight setting".
    env = {tether.AGENT_ENV: "1:2", tether.LAUNCHER_ENV: "3", "PREFLIGHT_PROFLE": "cpu"}
    assert settings.unknown_env(env) == ["PREFLIGHT_PROFLE"]

def test_the_example_config_is_valid_as_shipped(monkeypatch):
    from pathlib import Path

    monkeypatch.delenv("PREFLIGHT_REPORT")  # the tests' own (conftest) would win over the file's
    example = Path(__file__).parents[2] / "examples" / "config.toml"
    s = settings.load({}, config=example)
    assert (s.profile, s.keep_going, s.lock_timeout) == ("auto", False, 60.0)
    assert str(s.report) == "/var/lib/preflight/report.json"


def test_floors_cannot_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("PREFLIGHT_FLOOR_OVERRIDES", '{"shm_min_bytes": [1, "config /etc/x line 3"]}')
    assert settings.load({}).floor_overrides == {}
    assert "PREFLIGHT_FLOOR_OVERRIDES" in settings.unknown_env()


@pytest.mark.parametrize(
    "var, value, message",
    [
        ("PREFLIGHT_ONLY", "", "PREFLIGHT_ONLY='': Value error, names no check"),
        ("PREFLIGHT_REPORT", "", "PREFLIGHT_REPORT='': Value error, must not be empty"),
        ("PREFLIGHT_LOCK_FILE", " ", "PREFLIGHT_LOCK_FILE=' ': Value error, must not be empty"),
        ("PREFLIGHT_KEEP_GOING", "perhaps", "PREFLIGHT_KEEP_GOING='perhaps': Input should be a valid boolean"),
        ("PREFLIGHT_LOCK_TIMEOUT", "inf", "PREFLIGHT_LOCK_TIMEOUT='inf': Input should be a finite number"),
    ],
)
def test_bad_environment_values_name_the_variable(monkeypatch, var, value, message):
    monkeypatch.setenv(var, value)
    with pytest.raises(UsageError) as e:
        settings.load({})
    assert str(e.value).startswith(message)


def test_environment_booleans_read_as_people_write_them(monkeypatch):
    for value, expected in (("1", True), ("true", True), ("yes", True), ("0", False), ("false", False)):
        monkeypatch.setenv("PREFLIGHT_KEEP_GOING", value)
        assert settings.load({}).keep_going is expected


def test_config_values_are_taken_strictly(tmp_path):
    with pytest.raises(UsageError, match=r"line 1: keep_going: Input should be a valid boolean"):
        settings.load({}, config=write(tmp_path, 'keep_going = "yes"\n'))
    with pytest.raises(UsageError, match=r"line 1: lock_timeout: Input should be a valid number"):
        settings.load({}, config=write(tmp_path, 'lock_timeout = "inf"\n'))



@pytest.mark.parametrize("line", ["slurm_drain_cap = true", "history_days = true", "lemon_fails = true", "nnodes = \"2\"",
                                  "rdzv_timeout = \"30\"", "nproc_per_node = true", "history_runs = \"5\""])
def test_config_numbers_are_taken_strictly(tmp_path, line):
    # Before: `slurm_drain_cap = true` read as 1.0, no cap at all; `history_days = true` kept a day of history.
    key = line.split()[0]
    with pytest.raises(UsageError, match=rf"line 1: {key}: Value error, must be a number, written without quotes"):
        settings.load({}, config=write(tmp_path, line + "\n"))


def test_config_numbers_written_as_numbers_still_load(tmp_path):
    s = settings.load({}, config=write(tmp_path, "slurm_drain_cap = 0.2\nhistory_days = 30\nlemon_fails = 5\nrdzv_timeout = 60\n"))
    assert (s.slurm_drain_cap, s.history_days, s.lemon_fails, s.rdzv_timeout) == (0.2, 30.0, 5, 60.0)

def test_non_regular_or_huge_config_files_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # opening it would block forever
    with pytest.raises(UsageError, match=r"is not a regular file"):
        settings.load({}, config=fifo)
    with pytest.raises(UsageError, match=r"/dev/zero is not a regular file"):
        settings.load({}, config=Path("/dev/zero"))
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 << 20))
    with pytest.raises(UsageError, match=r"is 2097154 bytes; a config file is at most 1024 KiB"):
        settings.load({}, config=big)


def test_profiles_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "notadir").write_text("")
    with pytest.raises(UsageError, match=r"profiles_dir .*notadir: not a directory"):
        settings.load({}, config=write(tmp_path, f'profiles_dir = "{tmp_path / "notadir"}"\n'))


def test_worker_python_and_driver_pin_come_from_any_layer(tmp_path, monkeypatch):
    cfg = write(tmp_path, 'python = "/opt/venv/bin/python"\ndriver_version = "550.54.15"\n')
    s = settings.load({}, config=cfg)
    assert (s.python, s.driver_version) == (Path("/opt/venv/bin/python"), "550.54.15")
    monkeypatch.setenv("PREFLIGHT_PYTHON", "/usr/bin/python3")
    assert settings.load({}, config=cfg).python == Path("/usr/bin/python3")


def test_a_driver_pin_must_look_like_a_version(monkeypatch):
    monkeypatch.setenv("PREFLIGHT_DRIVER_VERSION", "latest")
    with pytest.raises(UsageError, match="PREFLIGHT_DRIVER_VERSION='latest': String should match pattern"):
        settings.load({})


def test_fake_nvml_never_comes_from_the_config_file(tmp_path, monkeypatch):
    # A site config must not be able to make a real node read invented facts.
    with pytest.raises(UsageError, match="nvml_fake"):
        settings.load({}, config=write(tmp_path, 'nvml_fake = "/tmp/healthy.json"\n'))
    monkeypatch.setenv("PREFLIGHT_NVML_FAKE", "/tmp/healthy.json")
    assert settings.load({}).nvml_fake == Path("/tmp/healthy.json")


def test_a_relative_python_means_the_one_beside_the_caller(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert settings.load({"python": Path("venv/bin/python")}).python == tmp_path / "venv" / "bin" / "python"


def test_the_level_comes_from_any_layer_and_the_budget_never_from_the_config_file(tmp_path, monkeypatch):
    cfg = write(tmp_path, 'level = "quick"\n')
    assert settings.load({}, config=cfg).level == "quick"
    monkeypatch.setenv("PREFLIGHT_LEVEL", "full")
    monkeypatch.setenv("PREFLIGHT_BUDGET", "12.5")
    s = settings.load({}, config=cfg)
    assert (s.level, s.budget) == ("full", 12.5)
    s = settings.load({"level": "standard", "budget": "3"}, config=cfg)
    assert (s.level, s.budget) == ("standard", 3.0)
    # A site-wide budget would bound the boot gate too: the config file cannot set one.
    with pytest.raises(UsageError, match=r"line 1: budget: unknown key"):
        settings.load({}, config=write(tmp_path, "budget = 30\n"))


@pytest.mark.parametrize(
    "flags, env, message",
    [
        ({"level": "deep"}, {}, "--level: Value error, 'deep' is not a level; choose one of: quick, standard, full"),
        ({}, {"PREFLIGHT_LEVEL": "Quick"}, "PREFLIGHT_LEVEL='Quick': Value error, 'Quick' is not a level"),
        ({"budget": "soon"}, {}, "--budget: Value error, 'soon' is not a number of seconds from above 0 to 86400"),
        ({"budget": "0"}, {}, "--budget: Value error, '0' is not a number of seconds"),
        ({}, {"PREFLIGHT_BUDGET": "-5"}, "PREFLIGHT_BUDGET='-5': Value error, '-5' is not a number of seconds"),
    ],
)
def test_a_bad_level_or_budget_names_where_it_came_from(monkeypatch, flags, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UsageError) as e:
        settings.load(flags)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_bad_level_in_the_config_names_its_line(tmp_path):
    with pytest.raises(UsageError, match=r"config .* line 2: level: Value error, 'deep' is not a level"):
        settings.load({}, config=write(tmp_path, 'profile = "cpu"\nlevel = "deep"\n'))
