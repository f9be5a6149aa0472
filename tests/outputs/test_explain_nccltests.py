"""`preflight explain` of nccl-tests output: every capture in tests/fixtures/nccltests
explained, INDEX.md's facts as expectations, the busbw judged against the profile's
floor for the run's shape (single node, or across nodes), #wrong, dips and NCCL
settings named where they explain a low figure."""

from __future__ import annotations

import pytest
from conftest import FIXTURES

from preflight.base.errors import UsageError
from preflight.outputs.explain import explain_nccltests
from preflight.readers.nccl import nccltests
from preflight.pipeline import profiles


def explain(prefix: str, profile: str | None = None):
    (path,) = (FIXTURES / "nccltests").glob(prefix + "*.txt")
    return explain_nccltests.explain(path.read_text(), path.name, resolved(profile) if profile else None)


def resolved(name: str) -> profiles.ResolvedProfile:
    path = profiles.find(name, None)
    return profiles.resolve(profiles.load(path), path, {}, f"--profile {name}")


def severities(e) -> list[str]:
    return [i.severity for i in e.findings]


@pytest.mark.parametrize("prefix, ranks, gpus, peak, size, column, avg", [
    ("02_", 8, ["NVIDIA A100-SXM4-80GB"], 232.44, 4294967296, "out-of-place", 66.2058),
    ("11_", 8, [], 468.62, 2147483648, "in-place", 114.556),
    ("15_", 8, ["NVIDIA H100 80GB HBM3"], 476.53, 4294967296, "in-place", 439.369),
    ("16_", 16, ["NVIDIA H100 80GB HBM3"], 167.87, 268435456, "in-place", 142.735),
    ("19_", 4, [], 1.44, 1073741824, "both", 1.40216),
])
def test_every_capture_gives_its_index_facts(prefix, ranks, gpus, peak, size, column, avg):
    e = explain(prefix)
    f = e.to_json()["facts"]
    assert (e.kind, e.title) == ("nccl-tests", "nccl-tests output")
    assert (f["collective"], f["types"], f["ranks"], f["gpus"], f["avg_busbw_gbps"]) == ("all_reduce", ["float"], ranks, gpus, avg)
    assert (f["peak_busbw"]["busbw_gbps"], f["peak_busbw"]["size"], f["peak_busbw"]["column"]) == (peak, size, column)
    row = f["rows"][-1]
    assert set(row["out_of_place"]) >= {"time_us", "algbw_gbps", "busbw_gbps", "wrong"} and row["in_place"]["busbw_gbps"] > 0


@pytest.mark.parametrize("prefix, profile, floor", [("02_", "a100-sxm4-80gb", 210.0), ("15_", "h100-sxm", 430.0)])
def test_a_healthy_board_is_normal_against_the_profile_its_header_names(prefix, profile, floor):
    e = explain(prefix)
    j = e.facts["judged"]
    assert severities(e) == ["info"] and e.findings[0].summary.startswith("normal: all_reduce bus bandwidth")
    assert (j["verdict"], j["profile"], j["floor"], j["floor_gbps"], j["gpus_per_node"]) == ("normal", profile, "allreduce_bus_bandwidth", floor, 8)
    assert e.facts["profile_from"].startswith("the header's GPU model")


def test_two_nodes_under_the_internode_floor_fail_by_how_much():
    # 16: 2 x 8 H100 over NDR IB, the poster's under-performing case: 155.6 GB/s at 8 GiB
    # (the best figure at or above the profile's 4 GiB) against 0.9 x 8 NICs x 46 GB/s.
    e = explain("16_")
    fail = next(i for i in e.findings if i.severity == "fail")
    assert "inter-node all_reduce bus bandwidth below the floor by 53%" in fail.summary and "8 GiB" in fail.summary
    assert e.facts["judged"]["floor"] == "internode_allreduce_bus_bandwidth" and e.facts["judged"]["nodes"] == 2
    assert e.failed


def test_check_off_is_read_as_not_validated():
    e = explain("16_")
    note = next(i for i in e.findings if "not validated" in i.summary)
    assert note.severity == "info" and "-c 1" in note.fix
    assert not any("not validated" in i.summary for i in explain("02_").findings)


def test_one_row_under_mpirun_is_judged_with_the_profile_given():
    # 11: the only row is 2 GiB, under the 4 GiB the floor is for, and already over it: normal.
    assert explain("11_").facts["judged"]["verdict"] == "not judged"
    e = explain("11_", "h100-sxm")
    assert severities(e) == ["info"] and e.facts["judged"]["verdict"] == "normal" and e.facts["judged"]["size"] == 2147483648


def test_a_table_that_stops_short_and_misses_is_not_called_below_the_floor():
    text = "  134217728  33554432  float  sum  -1  1305.0  102.85  179.99  0  1312.3  102.27  178.98  0\n"
    e = explain_nccltests.explain(text, "short.txt", resolved("a100-sxm4-80gb"))
    assert severities(e) == ["info"] and "no cited floor for this shape" in e.findings[0].summary
    assert "stops at 128 MiB" in e.findings[0].cause


def test_the_degraded_a40_table_is_noted_without_a_floor():
    e = explain("19_")
    assert severities(e) == ["info"] and "1.44 GB/s" in e.findings[0].summary and e.facts["judged"]["verdict"] == "not judged"
    assert "no cited floor" in explain("19_", "a100-pcie").findings[0].summary


def test_four_ranks_of_an_eight_gpu_profile_have_no_cited_floor():
    rows = "".join(f"  {s}  {s // 4}  float  sum  -1  {s / 100e3:.1f}  100.00  150.00  0  {s / 100e3:.1f}  100.00  150.00  0\n" for s in (2 << 30, 4 << 30))
    e = explain_nccltests.explain(rows, "four.txt", resolved("h100-sxm"))
    assert e.facts["ranks"] == 4 and "measured on 8 GPUs" in e.findings[0].cause and not e.failed


def test_p2p_disabled_is_named_as_the_cause_of_a_low_figure():
    e = explain("h05_")
    fail = next(i for i in e.findings if i.severity == "fail")
    assert "below the floor by 91%" in fail.summary and "NCCL_P2P_DISABLE=1" in fail.cause and fail.fix.startswith("unset NCCL_P2P_DISABLE")
    assert any(i.severity == "warn" and i.summary == "NCCL_P2P_DISABLE=1 is set" for i in e.findings)
    assert e.facts["settings"]["NCCL_P2P_DISABLE"] == "1"


def test_a_pinned_algorithm_is_named_only_when_the_figure_is_low():
    healthy = (FIXTURES / "nccltests").glob("15_*.txt").__next__().read_text()
    e = explain_nccltests.explain("NCCL_ALGO=Ring\n" + healthy, "ring.txt", None)
    assert severities(e) == ["info"]
    low = healthy.replace("476.53", "176.53").replace("473.60", "173.60")
    e = explain_nccltests.explain("NCCL_ALGO=Ring\n" + low, "ring.txt", None)
    assert "NCCL_ALGO=Ring (pins NCCL's algorithm" in next(i for i in e.findings if i.severity == "fail").cause


def test_a_non_zero_wrong_count_fails_naming_size_and_column():
    e = explain("h03_")
    fails = [i for i in e.findings if i.severity == "fail"]
    assert len(fails) == 1 and fails[0].summary == "wrong results: #wrong 4096 at 1 GiB (in-place)" and "dcgmi diag" in fails[0].fix


def test_out_of_bounds_alone_fails():
    text = "  1073741824  268435456  float  sum  -1  8247.6  130.19  227.83  0  8240.7  130.30  228.02  0\n# Out of bounds values : 2 FAILED\n"
    e = explain_nccltests.explain(text, "oob.txt", None)
    assert any(i.severity == "fail" and i.summary == "Out of bounds values: 2" for i in e.findings)


def test_a_row_far_below_both_neighbours_is_a_dip():
    (path,) = (FIXTURES / "nccltests").glob("02_*.txt")
    text = path.read_text().replace("  268435456      67108864     float     sum      -1   2392.6  112.19  196.34",
                                    "  268435456      67108864     float     sum      -1   4785.2   56.10   98.17")
    e = explain_nccltests.explain(text, "dip.txt", None)
    dip = next(i for i in e.findings if i.severity == "warn")
    assert dip.summary == "busbw dips at 256 MiB (out-of-place): 98.2 GB/s between 180.0 GB/s and 203.0 GB/s"
    # The healthy tables' steps between sizes (16's 0.96 of a neighbour at most) are not dips.
    assert not any(i.severity == "warn" for p in ("02_", "15_", "16_", "19_", "h01_") for i in explain(p).findings)


def test_multi_datatype_and_old_layouts_are_judged_too():
    for prefix in ("h01_", "h04_"):
        e = explain(prefix)
        assert e.facts["judged"]["verdict"] == "normal" and e.facts["profile"] == "a100-sxm4-80gb"
    assert explain("h01_").facts["types"] == ["float", "half", "bfloat16"]
    assert explain("h02_", "a100-sxm4-80gb").facts["judged"]["verdict"] == "normal"  # rows only: 8 ranks from busbw/algbw


@pytest.mark.parametrize("text, says", [
    ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n", "no rows under it"),
    ("     8388608       2097152     float     sum      -1    215.3\n", "too few columns"),
])
def test_damaged_output_is_one_usage_line_naming_the_file(text, says):
    with pytest.raises(UsageError, match=says) as e:
        explain_nccltests.explain(text, "cut.txt", None)
    assert str(e.value).startswith("cut.txt: ") and "\n" not in str(e.value)


def test_a_network_switch_is_not_blamed_for_a_low_figure_within_one_node():
    low = (FIXTURES / "nccltests").glob("h05_*.txt").__next__().read_text().replace("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE")
    fail = next(i for i in explain_nccltests.explain(low, "ib.txt", None).findings if i.severity == "fail")
    assert "NCCL_IB_DISABLE" not in fail.cause and "settings visible" not in fail.cause


def test_a_crashed_run_fails_with_its_nccl_error_and_where_the_table_stops():
    # h06: rows to 32 B of a -e 8G sweep, then a Cuda failure WARN and nccl-tests' "Test NCCL failure".
    e = explain("h06_")
    fails = [i for i in e.findings if i.severity == "fail"]
    assert e.failed and fails[0].summary == "the run failed: the table ends at 32 B of maxBytes 8 GiB"
    assert "Test NCCL failure common.cu:1005" in fails[0].cause
    assert any(i.summary == "a CUDA call inside NCCL failed" and "line 19" in i.cause for i in fails)
    assert e.facts["max_bytes"] == 8589934592 and e.facts["problems"][0]["category"] == "unhandled_cuda_error"


def test_a_table_cut_before_max_bytes_without_an_error_warns():
    text = (FIXTURES / "nccltests").glob("15_*.txt").__next__().read_text().split("  4294967296  ")[0].rsplit("\n", 1)[0] + "\n"
    e = explain_nccltests.explain(text, "cut.txt", None)
    warn = next(i for i in e.findings if i.severity == "warn")
    assert warn.summary == "the table ends at 2 GiB of maxBytes 4 GiB: the run crashed, hung, or the paste was cut" and not e.failed


def test_a_failure_line_after_a_whole_table_fails():
    text = (FIXTURES / "nccltests").glob("15_*.txt").__next__().read_text() + "node005: Test failure common.cu:891\n"
    e = explain_nccltests.explain(text, "late.txt", None)
    assert e.failed and next(i for i in e.findings if i.severity == "fail").summary == "the run failed: node005: Test failure common.cu:891"


def test_whole_tables_and_a_one_row_excerpt_are_not_called_cut():
    # 11 is an excerpt the author cut on purpose (no header, so no maxBytes); the others end at their maxBytes.
    for prefix in ("02_", "11_", "15_", "16_", "h01_", "h03_", "h04_", "h05_"):
        assert not any("table ends" in i.summary or "run failed" in i.summary for i in explain(prefix).findings), prefix


def test_rows_past_the_cap_are_said_in_the_facts():
    row = "  1073741824  268435456  float  sum  -1  8247.6  130.19  227.83  0  8240.7  130.30  228.02  0\n"
    e = explain_nccltests.explain(row * (nccltests.MAX_ROWS + 3), "many.txt", None)
    assert len(e.facts["rows"]) == nccltests.MAX_ROWS and e.facts["rows_not_read"] == 3
    assert any(i.summary == f"only the first {nccltests.MAX_ROWS} rows were read: 3 more were not" for i in e.findings)


def test_the_floor_names_its_profile_not_a_path_on_this_machine():
    fail = next(i for i in explain("16_").findings if i.severity == "fail")
    assert "profile h100-sxm)" in fail.cause and ".toml" not in fail.cause and "/preflight/" not in fail.cause


def test_a_model_no_profile_names_is_judged_by_generic_which_holds_no_floor_and_says_why():
    head = "".join(f"#  Rank  {r} Group  0 Pid 4{r} on    node001 device  {r} [0x{r + 1:02x}] NVIDIA L40S\n" for r in range(4))
    rows = "".join(f"  {s}  {s // 4}  float  sum  -1  {s / 20e3:.1f}  20.00  30.00  0  {s / 20e3:.1f}  20.00  30.00  0\n" for s in (1 << 30, 2 << 30))
    e = explain_nccltests.explain(head + rows, "l40s.txt", None)
    assert e.facts["judged"]["verdict"] == "not judged" and not e.failed
    assert e.facts["judged"]["reason"] == ("profile generic has no allreduce_bus_bandwidth floor (the header's GPU model 'NVIDIA L40S': "
                                           "no profile names this model, so profile generic: what needs no SKU is judged, no floor of the model "
                                           "is; add a profile for the model (`preflight calibrate` on a healthy node measures its floors))")
