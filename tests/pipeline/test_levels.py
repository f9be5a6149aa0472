"""Levels: the profiles' tables, and which level a run goes to, judged from recorded facts."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.base.errors import UsageError
from preflight.pipeline import levels, profiles
from preflight.pipeline.levels import Expected
from preflight.pipeline.report import Report

REPORTS = Path(__file__).parents[1] / "fixtures" / "reports"
# Checks that import torch or start GPU work: none may run at quick.
HEAVY = {"nccl", "bandwidth", "train"}


def builtin(name: str) -> profiles.Profile:
    return profiles.load(profiles.BUILTIN_DIR / f"{name}.toml")


@pytest.mark.parametrize("name", sorted(p.stem for p in profiles.BUILTIN_DIR.glob("*.toml")))
def test_every_builtin_profile_has_three_nested_levels_with_cited_estimates(name):
    p = builtin(name)
    assert p.levels is not None
    quick, standard, full = (p.levels.of(level) for level in levels.LEVELS)
    assert quick.checks and not set(quick.checks) & HEAVY  # no torch, no GPU work
    assert standard.checks == [c for c in p.checks if c not in ("burnin", "memtest")]  # the boot gate runs every check but the long ones
    # full: standard plus the long checks, burn-in and memory test, and only full runs them
    assert full.checks == standard.checks + ["burnin", "memtest"] and full.seconds > standard.seconds
    assert not {"burnin", "memtest"} & (set(quick.checks) | set(standard.checks))
    assert "burnin" in full.source or "burn-in" in full.source
    assert quick.seconds < standard.seconds
    if p.gpu is not None:
        assert quick.checks == ["cuda", "topology", "pcie", "rdma", "fabric", "firmware", "shm"]  # the platform checks need no load
        for level in (quick, standard):  # each says which: an estimate, a measurement, or the time model (tests/test_time_model.py)
            assert level.source.startswith(("estimate, not measured", "measured: ", "the time model (tests/perf/time_model.py")), level.source
    else:
        assert quick.checks == ["shm"] and "CI VM" in quick.source and "CI VM" in standard.source  # measured here


def test_a_check_no_level_runs_nor_a_level_out_of_order_or_nesting_is_accepted():
    good = builtin("cpu").levels
    assert good is not None
    every = ["shm", "nccl", "bandwidth", "train", "burnin", "memtest"]  # the cpu profile's checks since the full level has its own
    levels.check_against(good, every)
    with pytest.raises(ValueError, match=r"\[levels.full\] leaves out scratch: full runs every check in checks"):
        levels.check_against(good, every + ["scratch"])
    with pytest.raises(ValueError, match=r"\[levels.quick\] names shm, not in checks \(nccl\)"):
        levels.check_against(good, ["nccl"])
    swapped = good.model_copy(update={"standard": good.standard.model_copy(update={"checks": ["shm", "bandwidth", "nccl", "train"]})})
    with pytest.raises(ValueError, match=r"\[levels.standard\] lists shm, bandwidth, nccl, train; keep the order of checks"):
        levels.check_against(swapped, ["shm", "nccl", "bandwidth", "train"])


def table(level: str, checks: str, seconds: str = "1", source: str = '"s"') -> str:
    return f"[levels.{level}]\nchecks = [{checks}]\nseconds = {seconds}\nsource = {source}\n"


HEAD = 'name = "x"\ndescription = "d"\nchecks = ["shm", "topology"]\n'


@pytest.mark.parametrize(
    "text, message",
    [
        (HEAD + table("quick", '"topology"') + table("standard", '"shm"') + table("full", '"shm", "topology"'),
         r"\[levels.standard\] leaves out topology, which \[levels.quick\] runs"),
        (HEAD + table("quick", '"shm", "shm"') + table("standard", '"shm"') + table("full", '"shm", "topology"'), r"\[levels.quick\] lists shm more than once"),
        (HEAD + table("quick", '"shm"') + table("standard", '"shm"') + table("full", '"shm"'), r"\[levels.full\] leaves out topology"),
        (HEAD + table("quick", '"shm"') + table("standard", '"shm"') + table("full", '"shm", "topology", "train"'), r"\[levels.full\] names train, not in checks"),
        (HEAD + table("quick", '"shm"') + table("standard", '"shm"'), r"levels.full: required key is missing"),
        (HEAD + table("quick", '"shm"') + table("standard", '"shm"') + table("full", '"shm", "topology"') + table("deep", '"shm"'), r"levels.deep: unknown key"),
        (HEAD + table("quick", "") + table("standard", '"shm"') + table("full", '"shm", "topology"'), r"levels.quick.checks: List should have at least 1 item"),
        (HEAD + table("quick", '"shm"', seconds="0") + table("standard", '"shm"') + table("full", '"shm", "topology"'), r"levels.quick.seconds: Input should be greater than 0"),
        (HEAD + table("quick", '"shm"', source='""') + table("standard", '"shm"') + table("full", '"shm", "topology"'), r"levels.quick.source: String should have at least 1 character"),
    ],
)
def test_a_bad_levels_table_is_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "x.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as e:
        profiles.load(path)
    assert "\n" not in str(e.value)


def test_a_profile_without_levels_runs_everything_at_standard_and_full_and_has_no_quick(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text(HEAD)
    p = profiles.load(path)
    assert p.levels is None
    assert levels.checks_at(None, p.checks, "standard", "x") == levels.checks_at(None, p.checks, "full", "x") == ["shm", "topology"]
    with pytest.raises(UsageError, match=r"profile x has no \[levels\] tables, so no quick level"):
        levels.checks_at(None, p.checks, "quick", "x")


# ---- choosing a level ---------------------------------------------------------------

EXPECT = {"quick": Expected(0.7, "report R"), "standard": Expected(28.0, "report R"), "full": Expected(28.0, "report R")}


def test_without_a_budget_the_level_asked_for_runs_else_standard():
    assert levels.choose(None, None, {}) == ("standard", "the default level")
    assert levels.choose("quick", None, {}) == ("quick", "asked for (--level, PREFLIGHT_LEVEL or config)")


@pytest.mark.parametrize(
    "asked, budget, level",
    [(None, 30, "full"), (None, 28, "full"), (None, 27.9, "quick"), (None, 0.7, "quick"), ("standard", 30, "standard"), ("quick", 300, "quick")],
)
def test_a_budget_runs_the_deepest_level_that_fits_up_to_the_one_asked_for(asked, budget, level):
    chosen, why = levels.choose(asked, budget, EXPECT)
    assert chosen == level
    assert why.startswith(f"budget {budget:g} s (--budget or PREFLIGHT_BUDGET): the deepest level")
    assert f"expected {EXPECT[level].seconds:g} s from report R" in why
    assert (" up to " in why) == (asked is not None)


def test_a_budget_no_level_fits_names_the_quick_levels_time_and_where_it_came_from():
    with pytest.raises(UsageError) as e:
        levels.choose(None, 0.5, EXPECT)
    assert str(e.value) == ("budget 0.5 s (--budget or PREFLIGHT_BUDGET) fits no level: the quick level is expected to take 0.7 s, "
                            "from report R; give a larger budget or name a level with --level")
    with pytest.raises(UsageError, match="no level that runs the selected checks has an expected time"):
        levels.choose(None, 5, {"quick": None, "standard": Expected(28.0, "x"), "full": None})


def test_expected_time_is_this_nodes_own_where_it_has_every_check_else_the_profiles_estimate():
    cpu = builtin("cpu").levels
    assert cpu is not None
    report = Report.model_validate_json((REPORTS / "cpu-pass.json").read_bytes())
    times, where = levels.durations(report, "/r.json", "cpu")
    assert times == {"shm": 0.374769, "nccl": 4.870546, "bandwidth": 6.742044, "train": 4.9034}
    assert where == "this node's report /r.json of 2026-11-22 05:25:37 UTC"
    assert levels.expected(cpu.standard, cpu.standard.checks, times, where) == Expected(16.891, where)
    assert levels.expected(cpu.quick, ["shm"], times, where) == Expected(0.375, where)
    # A check the report lacks (or SKIPped): the profile's estimate for the whole level, with its source.
    assert levels.expected(cpu.standard, cpu.standard.checks, {"shm": 0.4}, where) == Expected(12, f"the profile's estimate ({cpu.standard.source})")
    failed = Report.model_validate_json((REPORTS / "shm-64m-fail.json").read_bytes())
    assert set(levels.durations(failed, "/r.json", "cpu")[0]) == {"shm"}  # the rest were skipped: no real time
    assert levels.durations(report, "/r.json", "h100-sxm") == ({}, "")  # another profile's checks are not this one's


def test_pick_leaves_out_levels_that_lack_a_check_only_names():
    p = profiles.resolve(builtin("cpu"), profiles.BUILTIN_DIR / "cpu.toml", {}, "--profile cpu")
    report = Report.model_validate_json((REPORTS / "cpu-pass.json").read_bytes())
    assert levels.pick(p, None, 5, [], [], report, "/r.json")[0] == "quick"
    assert levels.pick(p, None, 5, ["nccl"], [], report, "/r.json")[0] == "full"  # nccl alone: 4.9 s, but not at quick
    # The report has no burnin or memtest: full takes the profile's estimate (30 s), which 20 s does not fit.
    assert levels.pick(p, None, 20, [], [], report, "/r.json")[0] == "standard"
    assert levels.pick(p, None, 40, [], [], report, "/r.json")[0] == "full"
    assert levels.pick(p, None, 10, [], [], None, "/r.json")[0] == "quick"  # no report: the estimates (1 s, 12 s, 30 s)
    assert levels.pick(p, None, 20, [], [], None, "/r.json")[0] == "standard"
    assert levels.pick(p, None, 40, [], [], None, "/r.json")[0] == "full"


@pytest.mark.parametrize("value", ["quick", "standard", "full", None])
def test_level_names_are_the_three(value):
    assert levels.parse_level(value) == value


@pytest.mark.parametrize("value", ["Quick", "deep", "", 1])
def test_any_other_level_is_refused_naming_the_three(value):
    with pytest.raises(ValueError, match="is not a level; choose one of: quick, standard, full"):
        levels.parse_level(value)


@pytest.mark.parametrize("value, seconds", [("30", 30.0), ("0.5", 0.5), (12, 12.0), (None, None)])
def test_a_budget_is_seconds(value, seconds):
    assert levels.parse_budget(value) == seconds


@pytest.mark.parametrize("value", ["soon", "", "0", "-1", "nan", "inf", "1e9", 0, True])
def test_a_budget_that_is_not_a_positive_number_of_seconds_is_refused(value):
    with pytest.raises(ValueError, match="is not a number of seconds"):
        levels.parse_budget(value)


def test_a_report_without_a_level_ran_standard():
    assert levels.deeper("standard", "quick") and levels.deeper(None, "quick") and levels.deeper("full", None)
    assert not levels.deeper("quick", "quick") and not levels.deeper("quick", None)
