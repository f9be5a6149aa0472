"""nccl-tests tables (tests/fixtures/nccltests: real runs on A100, H100 and A40,
and hand-written variants of the layouts no capture has): the parser reads
them, and the bandwidth check's arithmetic (checkkit/bandwidth_figures.py: algbw,
bus_factor) gives back every busbw they print."""

from __future__ import annotations

import pytest
from conftest import FIXTURES
from preflight.checkkit import bandwidth_figures

from preflight.base.errors import UsageError
from preflight.readers.nccl import nccltests

TABLES = sorted((FIXTURES / "nccltests").glob("*.txt"))


def table(prefix: str) -> nccltests.Table:
    (path,) = [p for p in TABLES if p.name.startswith(prefix)]
    return nccltests.parse(path.read_text())


def test_the_a100_table_reads_whole():
    t = table("02_")
    assert t.ranks == 8 and len(t.rows) == 30 and t.avg_busbw_gbps == 66.2058
    first, last = t.rows[0], t.rows[-1]
    assert (first.size, first.count, first.type, first.redop, first.root) == (8, 2, "float", "sum", -1)
    assert last.size == 4294967296 and last.out_of_place.busbw_gbps == 232.44 and last.in_place.busbw_gbps == 231.59


def test_the_h100_table_reads_whole():
    t = table("15_")
    assert t.ranks == 8 and [r.size for r in t.rows] == [2**k for k in range(27, 33)]
    assert max(r.in_place.busbw_gbps for r in t.rows) == 476.53


RANKS = {"16_": 16, "19_": 4}  # INDEX.md; every other table ran on 8 GPUs


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name[:3])
def test_every_printed_busbw_is_algbw_times_the_all_reduce_factor(path):
    """busbw = size / time x 2(n-1)/n, GB = 1e9 bytes: nccl-tests' own
    definition (doc/PERFORMANCE.md), checked on every row and both columns,
    within the rounding of the printed time (4 digits) and busbw (2 decimals)."""
    t = nccltests.parse(path.read_text())
    factor = bandwidth_figures.bus_factor("all_reduce", t.ranks)
    assert t.ranks == RANKS.get(path.name[:3], 8)
    checked = 0
    for row in t.rows:
        for timing in (row.out_of_place, row.in_place):
            ours = bandwidth_figures.algbw(row.size, timing.time_us * 1e-6)
            assert ours / 1e9 == pytest.approx(timing.algbw_gbps, rel=2e-3, abs=0.006), row
            assert ours * factor / 1e9 == pytest.approx(timing.busbw_gbps, rel=2e-3, abs=0.011), row
            checked += 1
    assert checked == 2 * len(t.rows)


def test_all_gather_and_reduce_scatter_factors_are_n_minus_1_over_n():
    # 8 GPUs: 0.875; the size nccl-tests prints for them is the whole buffer.
    assert bandwidth_figures.bus_factor("all_gather", 8) == bandwidth_figures.bus_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert bandwidth_figures.bus_factor("all_reduce", 2) == 1.0


def test_the_small_message_row_is_latency_bound():
    # 4 KiB on 8x A100: 39.12 us, the figure the A100 profile's latency ceiling cites.
    row = next(r for r in table("02_").rows if r.size == 4096)
    assert row.out_of_place.time_us == 39.12


def test_text_without_a_table_is_refused():
    with pytest.raises(ValueError, match="no nccl-tests table rows"):
        nccltests.parse("# nThread 1 nGpus 8\n# Out of bounds values : 0 OK\n")


def test_validation_off_reads_as_unknown_wrong_count():
    t = nccltests.parse("      1048576        262144     float     sum      -1    52.61   19.93   34.88    N/A    53.03   19.77   34.60    N/A\n")
    assert t.rows[0].out_of_place.wrong is None and t.rows[0].in_place.busbw_gbps == 34.60


# ---- every layout (tests/fixtures/nccltests/INDEX.md and SOURCE.md) ---------------------

# prefix -> (rows, ranks, nodes, GPU models, peak busbw, its size, its column, Avg bus bandwidth): INDEX.md's facts
INDEX = {
    "02_": (30, 8, 1, ["NVIDIA A100-SXM4-80GB"], 232.44, 4294967296, "out-of-place", 66.2058),
    "11_": (1, 8, None, [], 468.62, 2147483648, "in-place", 114.556),
    "15_": (6, 8, 1, ["NVIDIA H100 80GB HBM3"], 476.53, 4294967296, "in-place", 439.369),
    "16_": (11, 16, 2, ["NVIDIA H100 80GB HBM3"], 167.87, 268435456, "in-place", 142.735),
    "19_": (4, 4, None, [], 1.44, 1073741824, "both", 1.40216),
}


@pytest.mark.parametrize("prefix", INDEX)
def test_each_real_capture_yields_its_index_facts(prefix):
    rows, ranks, nodes, gpus, peak, size, column, avg = INDEX[prefix]
    t = table(prefix)
    p = t.peak()
    assert (len(t.rows), t.ranks, t.nodes, t.gpus, t.avg_busbw_gbps) == (rows, ranks, nodes, gpus, avg)
    assert (p.busbw_gbps, p.size, p.column) == (peak, size, column)
    assert t.collective == "all_reduce" and t.types == ["float"]


def test_srun_labels_and_validation_off_are_read():
    t = table("16_")
    assert t.hosts == ["node005", "node007"] and t.validation is False
    assert all(r.out_of_place.wrong is None and r.in_place.wrong is None for r in t.rows)


def test_a_table_without_rank_lines_takes_its_rank_count_from_busbw_over_algbw():
    # 11: one 2 GiB row under mpirun's "[1,0]<stdout>:" (468.60 / 267.77 = 1.75 = 2x7/8); 19: 1.44 / 0.96 = 1.5 = 2x3/4.
    assert (table("11_").ranks, table("19_").ranks) == (8, 4)
    assert "inferred" in table("19_").ranks_from and "inferred" in table("19_").collective_from


def test_multi_datatype_table_with_the_2025_header():
    t = table("h01_")
    assert t.types == ["float", "half", "bfloat16"] and len(t.rows) == 9
    assert (t.collective, t.version, t.rank_lines[0].bus_id) == ("all_reduce", "2.17.1", "0000:07:00")
    assert t.peak().busbw_gbps == 232.44 and t.peak(t.rows[3:6]).type == "half"


def test_rows_pasted_without_any_header():
    t = table("h02_")
    assert len(t.rows) == 7 and t.ranks == 8 and t.collective == "all_reduce" and t.gpus == []
    assert t.rows[0].redop == "sum" and t.rows[0].root == -1


def test_the_2019_layout_has_no_root_and_an_error_column():
    t = table("h04_")
    r = t.rows[1]
    assert (r.redop, r.root, r.out_of_place.wrong, r.out_of_place.error) == ("sum", None, None, 5e-07)
    assert t.ranks == 8 and t.gpus == ["A100-SXM4-80GB"] and t.rank_lines[0].pid == 41234


def test_nccl_info_lines_among_the_rows_and_settings_echoed():
    t = table("h05_")
    assert [r.size for r in t.rows] == [1 << 30, 2 << 30, 4 << 30]
    assert t.settings["NCCL_P2P_DISABLE"] == "1" and t.collective_from == "the command or header (all_reduce_perf)"


def test_the_2017_layout_prints_milliseconds_and_a_res_column():
    text = (
        "nThread 1 nGpus 2 minBytes 33554432 maxBytes 33554432 step: 2(factor) warmup iters: 5 iters: 20 validation: 1 \n"
        "#   Rank  0 on     dgx1-7 device  0 [0x06] Tesla V100-SXM2-16GB\n"
        "#   Rank  1 on     dgx1-7 device  1 [0x07] Tesla V100-SXM2-16GB\n"
        "#                                 out-of-place                    in-place\n"
        "#      bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res\n"
        "    33554432       8388608   float     sum    0.732  45.84  45.84    0e+00    0.731  45.90  45.90    0e+00\n"
        " Out of bounds values : 0 OK\n"
        " Avg bus bandwidth    : 45.87 \n"
    )
    t = nccltests.parse(text)
    r = t.rows[0]
    assert r.out_of_place.time_us == pytest.approx(732) and r.out_of_place.error == 0.0 and r.root is None
    assert (t.ranks, t.avg_busbw_gbps, t.out_of_bounds, t.gpus) == (2, 45.87, 0, ["Tesla V100-SXM2-16GB"])


def test_per_iteration_columns_and_timestamps_are_set_apart():
    head = ("#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%"
            "     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%  timestamp\n")
    row = ("  1073741824     268435456     float     sum      -1  8247.50  130.19  227.83       0  8101.22  8400.10  8390.00     0.91"
           "  8240.54  130.30  228.03       0  8100.00  8399.00  8380.00     0.90  2025-06-02 10:11:12\n")
    r = nccltests.parse(head + row).rows[0]
    assert r.in_place.busbw_gbps == 228.03 and r.in_place.wrong == 0 and r.out_of_place.time_us == 8247.5


def test_broadcast_2019_layout_without_a_header_reads_its_root():
    r = nccltests.parse("    33554432       8388608   float      0    380.1   88.28   88.28  0e+00    379.8   88.35   88.35  0e+00\n").rows[0]
    assert (r.redop, r.root, r.in_place.algbw_gbps) == (None, 0, 88.35)


def test_a_second_process_table_under_srun_is_set_apart():
    row = "      1048576        262144     float     sum      -1    52.61   19.93   34.88      0    53.03   19.77   34.60      0\n"
    t = nccltests.parse(" 0: " + row + " 1: " + row + " 0: " + row.replace("1048576 ", "2097152 ", 1))
    assert [r.line for r in t.rows] == [1] and t.other_runs == [2]


@pytest.mark.parametrize("text, says", [
    ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n", "table header with no rows"),
    ("     8388608       2097152     float     sum      -1    215.3\n", "too few columns"),
])
def test_damaged_tables_are_refused_in_one_line(text, says):
    with pytest.raises(UsageError, match=says) as e:
        nccltests.parse(text)
    assert "\n" not in str(e.value)


def test_looks_like_every_layout_and_no_other_kind():
    assert all(nccltests.looks_like(p.read_text()) for p in TABLES)
    others = [p for p in FIXTURES.rglob("*") if p.is_file() and "nccltests" not in p.relative_to(FIXTURES).parts and p.stat().st_size < 4 << 20 and p.suffix in (".txt", ".log", "")]
    assert len(others) > 20
    assert [p.name for p in others if nccltests.looks_like(p.read_text(errors="replace"))] == []


def test_an_nccl_log_of_an_nccl_tests_run_without_its_table_is_not_nccl_tests():
    # nccl/05: nccl-tests' rank header, then NCCL INFO lines, no table: the NCCL log's transports are its answer.
    (path,) = (FIXTURES / "nccl").glob("05_*.log")
    assert "# Using devices" in path.read_text() and not nccltests.looks_like(path.read_text())


def test_a_header_not_on_the_last_line_is_found_without_rows():
    # The column header, then nccl-tests' failure line: looks_like must find the header on any line.
    (path,) = (FIXTURES / "nccltests" / "malformed").glob("h07_*.txt")
    assert nccltests.looks_like(path.read_text())
    with pytest.raises(UsageError, match="no rows under it"):
        nccltests.parse(path.read_text())


def test_the_header_s_size_range_and_the_run_s_failure_lines_are_kept():
    t = table("h06_")
    assert (t.max_bytes, t.step_factor, t.last_size, len(t.rows)) == (8589934592, 2, 32, 3)
    assert [(f.what, f.line) for f in t.failed] == [("warn", 19), ("test", 21), ("exit", 25)]
    assert [p.category for p in t.problems] == ["unhandled_cuda_error"] and t.problems[0].count == 2
    assert (table("15_").max_bytes, table("15_").last_size, table("15_").failed, table("11_").max_bytes) == (4294967296, 4294967296, [], None)


def test_rows_past_the_cap_are_counted_not_kept():
    row = "  1073741824  268435456  float  sum  -1  8247.6  130.19  227.83  0  8240.7  130.30  228.02  0\n"
    t = nccltests.parse(row * (nccltests.MAX_ROWS + 5) + "# Avg bus bandwidth    : 227.8\n")
    assert (len(t.rows), t.rows_not_read, t.last_size, t.avg_busbw_gbps) == (nccltests.MAX_ROWS, 5, 1073741824, 227.8)
