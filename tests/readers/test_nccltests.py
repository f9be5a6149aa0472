"""nccl-tests tables (tests/fixtures/nccltests, real runs on 8x A100 and 8x
H100): the parser reads them, and the bandwidth check's arithmetic
(checks/bandwidth.py: algbw, bus_factor) gives back every busbw they print."""

from __future__ import annotations

import pytest
from conftest import FIXTURES
from preflight.checks import bandwidth

from preflight.readers import nccltests

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


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name[:3])
def test_every_printed_busbw_is_algbw_times_the_all_reduce_factor(path):
    """busbw = size / time x 2(n-1)/n, GB = 1e9 bytes: nccl-tests' own
    definition (doc/PERFORMANCE.md), checked on every row and both columns,
    within the rounding of the printed time (4 digits) and busbw (2 decimals)."""
    t = nccltests.parse(path.read_text())
    factor = bandwidth.bus_factor("all_reduce", t.ranks)
    assert factor == pytest.approx(1.75)
    checked = 0
    for row in t.rows:
        for timing in (row.out_of_place, row.in_place):
            ours = bandwidth.algbw(row.size, timing.time_us * 1e-6)
            assert ours / 1e9 == pytest.approx(timing.algbw_gbps, rel=2e-3, abs=0.006), row
            assert ours * factor / 1e9 == pytest.approx(timing.busbw_gbps, rel=2e-3, abs=0.011), row
            checked += 1
    assert checked == 2 * len(t.rows)


def test_all_gather_and_reduce_scatter_factors_are_n_minus_1_over_n():
    # 8 GPUs: 0.875; the size nccl-tests prints for them is the whole buffer.
    assert bandwidth.bus_factor("all_gather", 8) == bandwidth.bus_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert bandwidth.bus_factor("all_reduce", 2) == 1.0


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
