"""The report page's traces (preflight/outputs/html/page_traces.py) on recorded
reports, and on reports changed as a real run would change them (a diverged
loss, NVML samples NVML did not always answer)."""

from __future__ import annotations

from pathlib import Path

from preflight.base.findings import Status
from preflight.outputs.html import page_traces
from preflight.pipeline.check import Result
from preflight.pipeline.report import Report

REPORTS = Path(__file__).parent.parent / "fixtures" / "reports"


def recorded(name: str) -> Report:
    return Report.model_validate_json((REPORTS / f"{name}.json").read_bytes())


def test_train_traces_are_each_ranks_loss_and_step_time():
    charts = page_traces.train_charts(recorded("cpu-pass"))
    assert [c.title for c in charts] == ["training loss", "training step time"]
    loss = charts[0].series[0]
    assert loss.label == "rank 0" and len(loss.ys) == 8 and loss.ys[0] > loss.ys[-1]


def test_burnin_traces_read_the_sampled_series():
    r = recorded("cpu-pass")
    series = {"GPU 0": {"t": [0.0, 1.0, 2.0], "clock_hz": [1.98e9, None, 1.4e9], "power_w": [650.0, 690.0, 700.0], "temperature_c": [40, 60, 75]}}
    r.checks.append(Result(check="burnin", status=Status.PASS, summary="ok", details={"series": series}))
    charts = {c.title: c for c in page_traces.burnin_charts(r)}
    assert set(charts) == {"SM clock under load", "power draw", "GPU temperature"}
    clock = charts["SM clock under load"].series[0]
    assert clock.xs == [0.0, 2.0] and clock.ys == [1.98e9, 1.4e9]  # the sample NVML did not answer is left out


def test_a_diverged_loss_leaves_its_steps_out_and_the_page_still_draws():
    from preflight.outputs.html import page

    r = recorded("cpu-pass")
    train = next(c for c in r.checks if c.check == "train")
    for rank in train.details["ranks"]:
        rank["report"]["losses"][3:] = ["nan", "inf", "-inf"]
    r.checks[3] = train.model_copy(update={"details": train.details})
    loss = page_traces.train_charts(r)[0]
    assert [s.xs for s in loss.series] == [[0.0, 1.0, 2.0]] * 2
    for rank in train.details["ranks"]:
        rank["report"]["losses"] = ["nan"] * 4
    assert [c.title for c in page_traces.train_charts(r)] == ["training step time"]
    assert "training step time" in page.render(r, "test")
