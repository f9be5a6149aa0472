import pytest

from preflight.pipeline import registry
from preflight.base.findings import Status
from preflight.base.errors import UsageError
from preflight.pipeline.runner import run_checks
from conftest import make_ctx


def test_builtin_shm_is_found_through_its_entry_point():
    assert "shm" in registry.names()
    check = registry.load("shm")
    assert type(check).__module__ == "preflight.checks.shm" and check.name == "shm"


def test_a_third_party_plugin_registers_the_same_way(plugin):
    assert {"passing", "failing", "hanging"} <= set(registry.names())
    assert registry.load("passing").name == "passing"


def test_unknown_names_are_refused_with_the_installed_list():
    with pytest.raises(UsageError, match=r"--only nosuch: no such check; installed checks: .*shm"):
        registry.check_names(["nosuch"], "--only")


def test_a_plugin_that_does_not_import_becomes_an_error_result(plugin):
    check = registry.load("broken")
    r = run_checks([check], make_ctx()).results[0]
    assert r.status is Status.ERROR and "ModuleNotFoundError" in r.summary
    assert "fakes_missing_module" in r.details["traceback"]


def installed(where, monkeypatch, module: str, entry: str, source: str) -> None:  # noqa: ANN001
    """A plugin distribution on sys.path: ``module``.py with ``source``, its check under ``entry``."""
    dist = where / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[preflight.checks]\n{entry}\n")
    (where / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(where))


def test_a_plugin_written_for_the_flat_layout_is_told_where_its_import_went(tmp_path, monkeypatch):
    # Until 0.2.0 the interface was preflight.check; such a plugin is an ERROR whose cause names the new place.
    installed(tmp_path, monkeypatch, "old_checks", "oldstyle = old_checks:Old",
              "from preflight.check import Check\n\nclass Old(Check):\n    name = 'oldstyle'\n")
    r = run_checks([registry.load("oldstyle")], make_ctx()).results[0]
    assert r.status is Status.ERROR
    assert "No module named 'preflight.check': preflight moved it to preflight.pipeline.check" in r.summary


def test_a_plugin_reading_nvml_from_the_top_of_readers_is_told_its_package(tmp_path, monkeypatch):
    # readers/ and outputs/ were grouped in packages: preflight.readers.nvml is preflight.readers.nvidia.nvml now.
    installed(tmp_path, monkeypatch, "nvml_checks", "readsnvml = nvml_checks:Reads",
              "from preflight.readers import nvml\nfrom preflight.readers.nvml import Inventory\n")
    r = run_checks([registry.load("readsnvml")], make_ctx()).results[0]
    assert r.status is Status.ERROR
    assert "No module named 'preflight.readers.nvml': preflight moved it to preflight.readers.nvidia.nvml" in r.summary, r.summary
    # A name two modules share (cli/history.py, outputs/record/history.py): the one under the old package.
    moved = registry._moved(ImportError("cannot import name 'history' from 'preflight.outputs'", name="preflight.outputs"))
    assert moved is not None and "preflight moved it to preflight.outputs.record.history;" in str(moved)


def test_a_plugin_importing_a_name_from_the_module_it_was_split_out_of_is_told_its_new_module(tmp_path, monkeypatch):
    # writing-a-check.md once said `ranks.judge_run`: the judge now has a module of its own.
    installed(tmp_path, monkeypatch, "judging_checks", "judges = judging_checks:Judges",
              "from preflight.gpuwork.ranks import judge_run\n")
    r = run_checks([registry.load("judges")], make_ctx()).results[0]
    assert r.status is Status.ERROR
    assert "cannot import name 'judge_run'" in r.summary and "preflight moved it to preflight.gpuwork.ranks_judge;" in r.summary, r.summary
    # A name no module of preflight defines is the plain error, with no guess.
    assert registry._moved(ImportError("cannot import name 'no_such_thing' from 'preflight.gpuwork.ranks'", name="preflight.gpuwork.ranks")) is None


def moved_to(name: str, module: str) -> str | None:
    said = registry._moved(ImportError(f"cannot import name '{name}' from '{module}' (/somewhere/{module}.py)", name=module))
    return str(said).split("preflight moved it to ")[1].split(";")[0] if said else None


def test_a_moved_name_is_sent_to_the_module_split_out_of_its_old_one_or_nowhere():
    # pipeline/levels.py defines a `choose` and a `pick` of its own: the split-out module is the one named.
    assert moved_to("choose", "preflight.pipeline.profiles") == "preflight.pipeline.profile_detect"
    assert moved_to("pick", "preflight.pipeline.profiles") == "preflight.pipeline.profile_detect"
    assert moved_to("Gpu", "preflight.readers.nvidia.nvml") == "preflight.readers.nvidia.nvml_facts"
    assert moved_to("Node", "preflight.outputs.schedulers.kube") == "preflight.outputs.schedulers.kube_decide"
    # Names that never lived there, defined elsewhere, are no move: no guess.
    assert moved_to("explain", "preflight.gpuwork.ranks") is None
    assert moved_to("gather", "preflight.pipeline.shape") is None
    # A circular import says "partially initialized module": nothing moved.
    circular = ImportError("cannot import name 'judge_run' from partially initialized module 'preflight.gpuwork.ranks' "
                           "(most likely due to a circular import) (/x/ranks.py)", name="preflight.gpuwork.ranks")
    assert registry._moved(circular) is None


def test_a_plugin_whose_name_disagrees_with_its_entry_point_is_an_error(plugin):
    r = run_checks([registry.load("misnamed")], make_ctx()).results[0]
    assert r.status is Status.ERROR and "must agree" in r.summary


FLOOR = '\n[floors.plugin_floor]\nvalue = 1\nunit = "count"\nsource = "test"\n'


def test_a_floor_no_installed_check_reads_is_refused_as_a_typo(plugin, monkeypatch):
    import fakes

    from preflight.pipeline import plan as pipeline, settings

    fakes.write_profile(plugin / "profiles", "typo", ["passing"], FLOOR)
    monkeypatch.setattr(registry, "names", lambda: ["passing", "shm"])  # the broken fakes hidden: every check loads
    with pytest.raises(UsageError, match=r"floor 'plugin_floor' is read by no installed check"):
        pipeline.plan(settings.load({"profile": "typo"}, environ={"PREFLIGHT_PROFILES_DIR": str(plugin / "profiles")}))


def test_with_a_broken_plugin_installed_no_floor_is_refused_as_unknown(plugin):
    # The broken plugin might be the one that reads it: its own ERROR says more than exit 2 would.
    import fakes

    from preflight.pipeline import plan as pipeline, settings

    fakes.write_profile(plugin / "profiles", "typo", ["passing"], FLOOR)
    plan = pipeline.plan(settings.load({"profile": "typo"}, environ={"PREFLIGHT_PROFILES_DIR": str(plugin / "profiles")}))
    assert [c.name for c in plan.checks] == ["passing"]


def test_the_installed_distributions_are_read_once_until_the_import_path_changes(tmp_path, monkeypatch):
    # Each read opens every installed distribution's metadata (0.35 s a quick run on a GPU
    # image with 200 packages, asked about 30 times a run); a plugin put on the path is still seen.
    import fakes

    reads = []
    real = registry.entry_points
    monkeypatch.setattr(registry, "entry_points", lambda **kw: reads.append(kw) or real(**kw))
    monkeypatch.setattr(registry, "_scanned", None)
    for _ in range(5):
        registry.check_names(["shm"], "--only")
        assert registry.load("shm").name == "shm" and "passing" not in registry.names()
    assert len(reads) == 1
    monkeypatch.syspath_prepend(str(fakes.install_plugin(tmp_path / "plugin")))
    assert "passing" in registry.names() and len(reads) == 2
