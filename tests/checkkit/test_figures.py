"""The shared figure helpers (preflight/checkkit/figures.py): the words of a fix line."""

from __future__ import annotations

from preflight.base.findings import Status
from preflight.checkkit import figures
from preflight.checkkit import train_figures
from preflight.checkkit.figures import Figure
from preflight.pipeline.profiles import ResolvedFloor


def test_the_first_cause_is_cut_at_a_comma_outside_parentheses_and_backquotes_only():
    assert figures.first_cause(train_figures.REASONS["gemm_throughput"]) == (
        "clocks held down (power brake, thermal or HW slowdown: `nvidia-smi -q -d PERFORMANCE,CLOCK`)")
    assert figures.first_cause("other work on the host, CPU frequency scaling") == "other work on the host"
    assert figures.first_cause("`a, b`, c") == "`a, b`"
    assert figures.first_cause("one cause (unclosed, still whole") == "one cause (unclosed, still whole"


def test_a_marginal_figure_s_fix_line_names_its_first_cause_whole():
    floor = ResolvedFloor(value=10e9, unit="flops_per_second", source="test", origin="test")
    fig = Figure(name="gemm_throughput", unit="flops_per_second", value=10.2e9, where="rank 1")
    (warn,) = figures.judge_floors([fig], {"gemm_throughput": floor}, 0.05, train_figures.WORDS, train_figures.REASONS, "preflight run --only train")
    assert warn.status == Status.WARN
    assert warn.remedy.endswith("check clocks held down (power brake, thermal or HW slowdown: `nvidia-smi -q -d PERFORMANCE,CLOCK`)")
