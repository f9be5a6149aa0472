"""`preflight calibrate`'s pure parts: which runs it vouches for, the floors
it derives and the file it writes. A real calibration runs in test_cli.py."""

from __future__ import annotations

import tomllib
from datetime import datetime, timezone

import pytest

from preflight import calibrate
from preflight.check import Result, Status
from preflight.errors import UsageError
from preflight.report import Report

BOUNDS = {"h2d_bandwidth": ("bytes_per_second", "min"), "allreduce_latency": ("seconds", "max"), "allreduce_latency_p99": ("seconds", "max")}
WHEN = datetime(2026, 11, 22, 3, 0, tzinfo=timezone.utc)


def bw(figures: list[dict], status: Status = Status.PASS, **parts: str) -> Result:
    return Result(check="bandwidth", status=status, summary="x", details={"figures": figures, "parts": {"run": "PASS", "floors": "PASS", **parts}})


def report(*results: Result) -> Report:
    return Report(version="0", hostname="node1", boot_id=None, profile="h100-sxm", profile_chosen_because="x", config=None,
                  started_at=WHEN, finished_at=WHEN, duration_seconds=1, verdict="pass", exit_code=0, keep_going=False,
                  interrupted_by_signal=None, checks=list(results))  # fmt: skip


H2D = [{"name": "h2d_bandwidth", "value": 55e9, "where": "GPU 0"}, {"name": "h2d_bandwidth", "value": 50e9, "where": "GPU 5"}]
LAT = [{"name": "allreduce_latency", "floor": "allreduce_latency", "value": 30e-6, "where": "rank 2"},
       {"name": "allreduce_latency", "floor": "allreduce_latency_p99", "value": 90e-6, "where": "rank 3"}]  # fmt: skip


def test_a_floor_is_the_fraction_of_the_weakest_gpu():
    got = calibrate.floors([bw(H2D)], 0.9, BOUNDS)["h2d_bandwidth"]
    assert got["value"] == pytest.approx(45e9) and got["where"] == "GPU 5" and got["measured"] == 50e9 and got["count"] == 2


def test_a_ceiling_is_the_slowest_figure_over_the_fraction_and_p99_keeps_its_own():
    got = calibrate.floors([bw(LAT)], 0.9, BOUNDS)
    assert got["allreduce_latency"]["value"] == pytest.approx(30e-6 / 0.9) and got["allreduce_latency"]["bound"] == "max"
    assert got["allreduce_latency_p99"]["value"] == pytest.approx(100e-6)


def test_figures_no_floor_reads_are_left_out():
    got = calibrate.floors([bw([{"name": "allreduce_graph_latency", "value": 1e-5, "where": "8 ranks"}, *H2D])], 0.9, BOUNDS)
    assert set(got) == {"h2d_bandwidth"}


def test_the_file_is_a_config_the_settings_read_back(tmp_path):
    from preflight import settings

    text = calibrate.render(calibrate.floors([bw(H2D + LAT)], 0.9, BOUNDS), 0.9, "node1", "h100-sxm", WHEN)
    data = tomllib.loads(text)
    assert data["floors"]["h2d_bandwidth"] == {"value": 45e9, "unit": "bytes_per_second", "source": data["floors"]["h2d_bandwidth"]["source"]}
    assert "node1 2026-11-22 03:00 UTC: 50.0 GB/s x 0.9 (GPU 5, weakest of 2)" in data["floors"]["h2d_bandwidth"]["source"]
    assert data["floors"]["allreduce_latency"]["bound"] == "max"
    path = tmp_path / "floors.toml"
    path.write_text(text)
    s = settings.load({}, config=path, environ={})
    assert s.floor_overrides["h2d_bandwidth"].value == 45e9 and s.floor_overrides["h2d_bandwidth"].unit == "bytes_per_second"


def test_a_run_with_a_failed_earlier_check_is_not_vouched_for():
    shm = Result(check="shm", status=Status.FAIL, summary="/dev/shm is 64 MiB")
    with pytest.raises(calibrate.Refused, match="check shm FAIL: /dev/shm is 64 MiB"):
        calibrate.vouch(report(shm, bw(H2D)))


def test_figures_below_the_current_floors_still_calibrate():
    # A site whose healthy nodes are slower than the published floor is what calibrate is for.
    assert [r.check for r in calibrate.vouch(report(bw(H2D, Status.FAIL, floors="FAIL")))] == ["bandwidth"]


@pytest.mark.parametrize("part", ["run", "peer_access", "setup"])
def test_a_dead_rank_missing_peer_access_or_clamped_sizes_refuse(part):
    with pytest.raises(calibrate.Refused, match=f"{part} part is"):
        calibrate.vouch(report(bw(H2D, Status.FAIL, **{part: "FAIL" if part != "setup" else "WARN"})))


def test_a_skipped_bandwidth_check_refuses():
    with pytest.raises(calibrate.Refused, match="bandwidth check SKIP"):
        calibrate.vouch(report(Result(check="bandwidth", status=Status.SKIP, summary="skipped: nccl failed")))


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_a_fraction_outside_0_1_is_a_usage_error(fraction):
    with pytest.raises(UsageError, match="give a number in \\(0, 1\\]"):
        calibrate.check_fraction(fraction)


def test_an_existing_output_needs_force(tmp_path):
    out = tmp_path / "floors.toml"
    out.write_text("x")
    with pytest.raises(UsageError, match="already exists; pass --force"):
        calibrate.check_output(out, force=False)
    assert calibrate.check_output(out, force=True) == out


def test_an_output_in_a_missing_directory_is_refused(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        calibrate.check_output(tmp_path / "nope" / "floors.toml", force=False)


def test_a_profile_without_the_bandwidth_check_has_nothing_to_calibrate():
    with pytest.raises(UsageError, match="nothing to calibrate"):
        calibrate.checks_up_to(["cuda", "topology", "shm", "nccl"], "gb10")
    assert calibrate.checks_up_to(["cuda", "shm", "bandwidth", "train"], "x") == ["cuda", "shm", "bandwidth", "train"]
    assert calibrate.checks_up_to(["cuda", "shm", "bandwidth", "other"], "x") == ["cuda", "shm", "bandwidth"]


def test_train_figures_calibrate_too_and_a_wrong_answer_refuses():
    train = Result(check="train", status=Status.PASS, summary="x", details={"parts": {"run": "PASS", "loss": "PASS", "agreement": "PASS", "speed": "PASS", "setup": "PASS"},
                   "figures": [{"name": "train_step_duration", "value": 0.04, "where": "slowest of 2 ranks: rank 1"}, {"name": "gemm_throughput", "value": 9e10, "where": "rank 0"}]})
    got = calibrate.floors(calibrate.vouch(report(bw(H2D), train)), 0.9, {**BOUNDS, "train_step_duration": ("seconds", "max"), "gemm_throughput": ("flops_per_second", "min")})
    assert got["train_step_duration"]["value"] == pytest.approx(0.04 / 0.9) and got["gemm_throughput"]["value"] == pytest.approx(8.1e10)
    train.details["parts"]["agreement"] = "FAIL"
    with pytest.raises(calibrate.Refused, match="train check's agreement part is FAIL"):
        calibrate.vouch(report(bw(H2D), train))


def test_a_run_over_fewer_ranks_than_the_node_refuses():
    result = bw(H2D)
    result.details["full_node"] = False
    with pytest.raises(calibrate.Refused, match="fewer ranks than the node has"):
        calibrate.vouch(report(result))


def test_a_node_with_a_straggler_is_not_calibrated():
    # Its slow GPU's figures would become the floor every throttled node then passes.
    train = Result(check="train", status=Status.FAIL, summary="straggler", details={"parts": {"run": "PASS", "loss": "PASS", "agreement": "PASS", "speed": "PASS", "straggler": "FAIL", "setup": "PASS"},
                   "figures": [{"name": "gemm_throughput", "value": 9e10, "where": "rank 0"}]})
    with pytest.raises(calibrate.Refused, match="train check's straggler part is FAIL"):
        calibrate.vouch(report(bw(H2D), train))
