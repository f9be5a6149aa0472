import json
import random
import re
from pathlib import Path

import pytest

from conftest import GPU_KEYS, assert_index_facts
from topology_cases import ALL_TOPO, H200_TOPO, driver_580

from preflight.readers.nvidia.topo import TopoParseError, looks_like, parse

TOPO = Path(__file__).parents[1] / "fixtures" / "topo"
EXPECTED = json.loads((TOPO / "expected.json").read_text())
CAPTURES = sorted(EXPECTED)
(M1,) = (TOPO / "malformed").glob("M1_*.txt")


def capture(prefix: str) -> str:
    (path,) = TOPO.glob(f"{prefix}_*.txt")
    return path.read_text()


def lines(prefix: str) -> list[str]:
    return capture(prefix).splitlines()


def join(rows: list[str]) -> str:
    return "\n".join(rows) + "\n"


def edit_cells(text: str, row: str, edit) -> str:
    """``text`` with the tab-separated cells of the row labelled ``row`` passed through ``edit``."""
    out = text.splitlines()
    (i,) = [i for i, line in enumerate(out) if line.split("\t")[0] == row]
    cells = out[i].split("\t")
    edit(cells)
    out[i] = "\t".join(cells)
    return join(out)


def set_cell(text: str, row: str, column: int, value: str) -> str:
    """Cell ``column`` (0 = the row label) of row ``row`` set to ``value``."""
    return edit_cells(text, row, lambda cells: cells.__setitem__(column, value))


# ---- the captures ------------------------------------------------------------


def test_expected_json_covers_every_capture():
    assert sorted(p.name for p in TOPO.glob("*.txt")) == CAPTURES


@pytest.mark.parametrize("name", CAPTURES)
def test_capture_parses_to_its_index_facts(name):
    assert_index_facts(parse((TOPO / name).read_text()).model_dump(mode="json"), name)


def test_unordered_nic_columns_keep_their_own_links():
    topo = parse(capture("11"))
    assert topo.gpus[2].nics == {"mlx5_0": "PHB", "mlx5_2": "SYS", "mlx5_1": "PIX", "mlx5_3": "SYS"}
    assert topo.gpus[5].nics == {"mlx5_0": "SYS", "mlx5_2": "PIX", "mlx5_1": "SYS", "mlx5_3": "PHB"}


@pytest.mark.parametrize("prefix, spans", [("11", True), ("14", False)])
def test_old_header_without_numa_column_judges_spans_from_cpu_sets(prefix, spans):
    topo = parse(capture(prefix))
    assert topo.columns == ["CPU Affinity"]
    assert topo.numa_nodes is None
    assert all(g.numa_nodes is None and g.numa_affinity is None for g in topo.gpus)
    assert topo.spans_numa is spans


def test_numa_affinity_na_gives_none():
    topo = parse(capture("28"))
    assert topo.columns == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    (gpu,) = topo.gpus
    assert (gpu.cpu_affinity, gpu.cpus) == ("0-7", list(range(8)))
    assert (gpu.numa_affinity, gpu.numa_nodes, gpu.gpu_numa_id) == (None, None, None)
    assert topo.numa_nodes is None


@pytest.mark.parametrize("tabsize", [8, 4])
@pytest.mark.parametrize("name", CAPTURES)
def test_tabs_expanded_to_spaces_parse_the_same(name, tabsize):
    text = (TOPO / name).read_text()
    spaced = text.expandtabs(tabsize)
    assert "\t" not in spaced
    assert parse(spaced).model_dump(mode="json") == parse(text).model_dump(mode="json")


# ---- M1: a capture damaged in pasting ----------------------------------------


def test_m1_is_rejected_at_the_fused_pixnode_cell():
    with pytest.raises(TopoParseError) as e:
        parse(M1.read_text())
    assert e.value.line == 7
    message = str(e.value)
    assert message.startswith("line 7:") and "NIC7" in message and "PIXNODE" in message


def test_m1_with_gpu5_repaired_is_rejected_at_the_nic7_row():
    text = M1.read_text().replace("PIXNODE", "PIX\tNODE")
    assert [i for i, line in enumerate(text.splitlines(), 1) if line.startswith("NIC7\t")] == [17]
    with pytest.raises(TopoParseError) as e:
        parse(text)
    assert e.value.line == 17
    assert str(e.value).startswith("line 17:") and "'X NODE'" in str(e.value)


# ---- damage that must be rejected ---------------------------------------------
# 02's layout: header line 1, GPUn on line n+2, NICn on line n+10.

C02 = capture("02")
L02 = C02.splitlines()
README = """\
# preflight

Checks a GPU node before a job lands on it: the driver answers, the GPUs
and NICs sit where the profile says, and /dev/shm is large enough. Run
`nvidia-smi topo -m` and pass its output with --from to explain a layout.
"""

REJECTED = {
    # id: (text, line the error names, a fragment of the message)
    "empty": ("", None, "empty"),
    "whitespace-only": (" \n\t\n   \n\n", None, "empty"),
    "readme-paragraph": (README, None, "no header"),
    "binary-garbage": (random.Random(0).randbytes(4096).decode("latin-1"), None, "NUL bytes"),
    "control-characters": ("".join(map(chr, range(1, 32))) * 20, None, "no header"),
    "header-gpu1gpu2-fused": (C02.replace("GPU1\tGPU2", "GPU1GPU2", 1), 1, "'GPU1GPU2'"),
    "header-affinities-fused": (C02.replace("CPU Affinity\tNUMA Affinity", "CPU AffinityNUMA Affinity", 1), 1,
                                "'CPU AffinityNUMA Affinity'"),
    "header-no-leading-tab-fused": (capture("03").replace("GPU6\tGPU7", "GPU6GPU7", 1), 1, "'GPU6GPU7'"),
    "header-affinities-fused-spaces": (re.sub(r"CPU Affinity +NUMA Affinity", "CPU AffinityNUMA Affinity", C02.expandtabs(), count=1),
                                       2, "3 affinity values for 2 affinity columns"),
    "gpu-row-cell-too-many": (edit_cells(C02, "GPU2", lambda c: c.insert(5, "NV18")), 4, "row GPU2"),
    "gpu-row-cell-too-few": (edit_cells(C02, "GPU2", lambda c: c.pop(12)), 4, "row GPU2"),
    "nic-row-cell-too-many": (edit_cells(C02, "NIC3", lambda c: c.insert(5, "NODE")), 13, "row NIC3"),
    "nic-row-cell-too-few": (edit_cells(C02, "NIC3", lambda c: c.pop(5)), 13, "row NIC3"),
    "old-header-row-cell-too-few": (edit_cells(capture("11"), "GPU4", lambda c: c.pop(2)), 6, "row GPU4"),
    "asymmetric-gpu-pair": (set_cell(C02, "GPU5", 3, "NV12"), 7, "GPU2->GPU5 is NV18 but GPU5->GPU2 is NV12"),
    "asymmetric-gpu-nic": (set_cell(C02, "NIC0", 1, "NODE"), 10, "but NIC0->GPU0 is NODE"),
    "x-off-diagonal": (set_cell(C02, "GPU2", 6, " X "), 4, "row GPU2, column GPU5: 'X'"),
    "diagonal-not-x": (set_cell(C02, "GPU2", 3, "NV18"), 4, "row GPU2, column GPU2: 'NV18'"),
    "cut-inside-gpu-rows": (join(L02[:6]), 7, "cut off inside the GPU rows"),
    "gpu-rows-missing-before-legend": (join(L02[:6] + L02[21:]), 7, "cut off inside the GPU rows"),
    "cut-mid-gpu-row": (join(L02[:6]) + L02[6][:40], 7, "cut off inside the GPU rows"),
}


@pytest.mark.parametrize("case", REJECTED)
def test_damage_is_rejected_naming_the_line(case):
    text, line, fragment = REJECTED[case]
    with pytest.raises(TopoParseError) as e:
        parse(text)
    assert e.value.line == line
    if line is not None:
        assert str(e.value).startswith(f"line {line}: ")
    assert fragment in str(e.value)


BROKEN = {case: text for case, (text, _, _) in REJECTED.items()}
BROKEN["M1"] = M1.read_text()
BROKEN["M1-repaired"] = M1.read_text().replace("PIXNODE", "PIX\tNODE")


@pytest.mark.parametrize("case", BROKEN)
def test_every_parse_error_is_one_line(case):
    with pytest.raises(TopoParseError) as e:
        parse(BROKEN[case])
    message = str(e.value)
    assert message.strip() and message.splitlines() == [message]


# ---- damage that is tolerated, with a note --------------------------------------


def gpu_facts_by_nic_position(topo) -> list[tuple]:
    """Per GPU: its affinities and its NIC links in column order, NIC names aside."""
    return [(tuple(getattr(g, k) for k in GPU_KEYS), g.cpus, g.numa_nodes, list(g.nics.values())) for g in topo.gpus]


def test_cut_after_the_gpu_rows_keeps_every_gpu_fact():
    full = parse(C02)
    topo = parse(join(L02[:9]))
    assert gpu_facts_by_nic_position(topo) == gpu_facts_by_nic_position(full)
    assert topo.links == full.links and topo.spans_numa is False
    assert topo.nics == [f"NIC{i}" for i in range(12)]  # the legend went with the cut
    assert topo.nearest_nics["3"] == ["NIC5"]
    assert any("cut off" in n and "NIC0" in n and "NIC11" in n for n in topo.notes)
    assert any("no NIC Legend" in n for n in topo.notes)


def test_cut_after_the_gpu_rows_keeps_nic_names_from_the_header():
    full = parse(capture("08"))
    topo = parse(join(lines("08")[:3]))
    assert topo.nics == ["mlx5_0", "mlx5_1"]
    assert topo.model_dump(exclude={"notes"}) == full.model_dump(exclude={"notes"})
    assert len(topo.notes) == 1 and "cut off" in topo.notes[0] and "mlx5_0, mlx5_1" in topo.notes[0]


def test_cut_in_the_middle_of_the_last_nic_row_parses_with_a_note():
    assert L02[20].startswith("NIC11\t")
    topo = parse(join(L02[:20]) + L02[20][:28])  # ends in "...\tNODE\tNOD"
    full = parse(C02)
    assert gpu_facts_by_nic_position(topo) == gpu_facts_by_nic_position(full)
    assert topo.links == full.links
    assert any("ends inside row NIC11" in n and "line 21" in n for n in topo.notes)


def test_missing_nic_legend_keeps_nic_numbers_with_a_note():
    text = C02[: C02.index("NIC Legend:")]
    topo = parse(text)
    assert topo.nics == [f"NIC{i}" for i in range(12)]
    assert topo.nearest_nics == {"0": ["NIC0"], "1": ["NIC1"], "2": ["NIC2"], "3": ["NIC5"],
                                 "4": ["NIC6"], "5": ["NIC7"], "6": ["NIC8"], "7": ["NIC11"]}
    assert topo.notes == ["no NIC Legend entry for " + ", ".join(f"NIC{i}" for i in range(12)) + ": device names unknown"]


# ---- damage that once gave wrong answers or crashes ---------------------------------


@pytest.mark.parametrize("tail", ["\t", "\t "], ids=["tab", "tab-space"])
def test_cut_inside_the_last_cell_of_the_last_nic_row_parses_with_a_note(tail):
    last = L02[20].split("\t X ")[0]  # NIC11's 19 links before its own cell
    topo = parse(join(L02[:20]) + last + tail)
    assert any("ends inside row NIC11" in n for n in topo.notes)


def test_value_cut_off_at_the_end_of_the_text_is_not_reported_as_fact():
    text = join(lines("18")[:2]) + "GPU1\tNV4\t X \t0-2"
    try:
        topo = parse(text)
    except TopoParseError:
        return
    assert topo.gpus[1].cpu_affinity is None and topo.gpus[1].cpus is None


def test_a_later_captures_nic_legend_does_not_rename_the_first_captures_nics():
    try:
        topo = parse(capture("24") + "\n" + C02)
    except TopoParseError:
        return
    assert topo.nics == EXPECTED[next(n for n in CAPTURES if n.startswith("24_"))]["nics"]


def test_x_in_a_nic_column_is_rejected_when_the_nic_rows_are_cut_off():
    text = set_cell(join(L02[:9]), "GPU0", 9, " X ")
    with pytest.raises(TopoParseError, match=r"^line 2: .*NIC0"):
        parse(text)


def test_nvlink_between_gpu_and_nic_is_rejected_or_dumps():
    text = set_cell(set_cell(C02, "GPU0", 9, "NV18"), "NIC0", 1, "NV18")
    try:
        topo = parse(text)
    except TopoParseError:
        return
    assert topo.model_dump(mode="json")["nearest_nics"]["0"]


def test_nul_bytes_in_a_space_separated_capture_are_a_parse_error():
    text = join(C02.expandtabs().splitlines()[:5]) + "\0" * 64
    with pytest.raises(TopoParseError, match="NUL bytes"):
        parse(text)


# ---- layouts no recorded capture has: tests/fixtures/topo/handmade ---------------------
# H1: CPU Affinity printed empty for GPU2 and GPU3; H2: the header's affinity names joined by spaces;
# H3: every header name joined by spaces. The rows keep nvidia-smi's tabs in all three.

HANDMADE = TOPO / "handmade"


def handmade(prefix: str) -> str:
    (path,) = HANDMADE.glob(f"{prefix}_*.txt")
    return path.read_text()


def affinities(topo) -> list[tuple]:
    return [(g.cpu_affinity, g.cpus and (g.cpus[0], g.cpus[-1]), g.numa_affinity, g.numa_nodes, g.gpu_numa_id) for g in topo.gpus]


def test_an_affinity_printed_empty_is_unknown_for_that_gpu_and_said():
    topo = parse(handmade("H1"))
    assert affinities(topo) == [("0-23", (0, 23), "0", [0], None)] * 2 + [(None, None, "1", [1], None)] * 2
    assert topo.notes == ["CPU Affinity printed empty for GPU 2, 3: unknown for them"]
    assert topo.cpu_groups == ["0-23"] and topo.numa_nodes == [0, 1] and topo.spans_numa is True
    assert topo.nics == ["mlx5_0", "mlx5_1"] and topo.nearest_nics == {"0": ["mlx5_0"], "1": ["mlx5_0"], "2": ["mlx5_1"], "3": ["mlx5_1"]}
    assert topo.links == {"0-1": "NV12", "0-2": "SYS", "0-3": "SYS", "1-2": "SYS", "1-3": "SYS", "2-3": "NV12"}


C28 = capture("28")  # GPU0\t X \t0-7\t\tN/A\t\tN/A: an empty field before every N/A


@pytest.mark.parametrize("text, want, note", [
    (None, None, None),  # 02's layout (~545), CPU and NUMA both empty for GPU3
    (C28.replace("\t0-7\t", "\t\t", 1), (None, None, None, None, None), "CPU Affinity printed empty for GPU 0: unknown for it"),
    (C28.replace("\t0-7\t\tN/A", "\t0-7\t", 1), ("0-7", (0, 7), None, None, None), "NUMA Affinity printed empty for GPU 0: unknown for it"),
    # a GPU that is its own NUMA node, with its padding, beside an empty CPU Affinity
    (capture("18").replace("\t0-23\t0\t\tN/A", "\t\t1\t\t4"), (None, None, "1", [1], 4), "CPU Affinity printed empty for GPU 0, 1: unknown for them"),
], ids=["02-gpu3-cpu-and-numa-empty", "28-cpu-empty", "28-numa-empty", "18-cpu-empty-numeric-gpu-numa-id"])
def test_empty_cells_in_every_driver_layout_are_unknown(text, want, note):
    if text is None:
        text = edit_cells(C02, "GPU3", lambda c: c.__setitem__(slice(21, 23), ["", ""]))
        topo = parse(text)
        assert affinities(topo)[3] == (None, None, None, None, None) and affinities(topo)[2][0] == "0-191"
        assert topo.notes == ["CPU Affinity printed empty for GPU 3: unknown for it", "NUMA Affinity printed empty for GPU 3: unknown for it"]
        assert topo.numa_nodes is None and topo.spans_numa is None
        return
    topo = parse(text)
    assert affinities(topo)[0] == want
    assert topo.notes == [note]


def test_empty_cells_never_make_the_judge_invent_a_finding():
    """GPU2 and GPU3 say nothing about their CPUs and NUMA node: no NUMA finding and no CPU split is drawn from them."""
    from preflight.checks.topology import ANY_SKU, judge
    from preflight.readers.machine.layout import TopologyFacts

    text = handmade("H1").replace("\t\t1\t\tN/A", "\t\t\t\tN/A")
    facts = TopologyFacts(matrix=parse(text), matrix_source="h1")
    assert facts.matrix.spans_numa is None and facts.matrix.cpu_groups == ["0-23"]
    found = [f for part in judge(facts, ANY_SKU, None, None).values() for f in part]
    assert not [f for f in found if "NUMA" in f.summary or "CPU" in f.summary], [f.summary for f in found]


@pytest.mark.parametrize("prefix", ["H2", "H3"])
def test_a_header_whose_names_a_paste_joined_with_spaces_matches_its_tab_rows(prefix):
    text = handmade(prefix)
    tabbed = "\t" + "\t".join(["GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1", "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    want = parse(join([tabbed, *text.splitlines()[1:]]))
    topo = parse(text)
    assert topo.model_dump() == want.model_dump() and topo.notes == []
    assert topo.columns == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    assert affinities(topo) == [("0-23", (0, 23), "0", [0], None)] * 2 + [("24-47", (24, 47), "1", [1], None)] * 2
    assert topo.spans_numa is True and topo.nearest_nics["2"] == ["mlx5_1"]


def test_a_space_joined_header_with_empty_cells_in_its_tab_rows():
    rows = handmade("H1").splitlines()[1:]
    topo = parse(join([handmade("H3").splitlines()[0], *rows]))
    assert affinities(topo)[2] == (None, None, "1", [1], None)
    assert topo.notes == ["CPU Affinity printed empty for GPU 2, 3: unknown for them"]


@pytest.mark.parametrize("header, fragment", [
    ("\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity NUMA Afinity GPU NUMA ID", "'CPU Affinity NUMA Afinity GPU NUMA ID'"),
    ("\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU AffinityNUMA Affinity GPU NUMA ID", "'CPU AffinityNUMA Affinity GPU NUMA ID'"),
    ("\tGPU0 GPU1 GPU3 GPU2\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID", "GPU3 where GPU2 belongs"),
], ids=["misspelt-name", "fused-names", "gpus-out-of-order"])
def test_a_space_joined_header_is_split_only_into_names_it_knows(header, fragment):
    with pytest.raises(TopoParseError) as e:
        parse(join([header, *handmade("H2").splitlines()[1:]]))
    assert e.value.line == 1 and fragment in str(e.value)


@pytest.mark.parametrize("edit, line, fragment", [
    # CPU Affinity and NUMA Affinity fused into one cell: the padding before N/A must not make it fit
    (lambda t: t.replace("GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tPIX\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\t0-191\t0",
                         "GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tPIX\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\t0-1910", 1),
     2, "row GPU0 has 2 affinity values for 3"),
    (lambda t: edit_cells(t, "GPU1", lambda c: c.append("7")), 3, "row GPU1 has 4 affinity values for 3"),
], ids=["fused-cpu-numa", "one-value-too-many"])
def test_damaged_affinity_cells_are_still_rejected(edit, line, fragment):
    with pytest.raises(TopoParseError) as e:
        parse(edit(C02))
    assert e.value.line == line and fragment in str(e.value)


# ---- looks_like ------------------------------------------------------------------------

OTHER_KINDS = ["nccl", "nccltests", "xid", "df", "nvsmi", "dcgmi", "pcie_notice"]


def test_looks_like_says_yes_to_every_matrix_damaged_or_not():
    paths = [*TOPO.glob("*.txt"), *(TOPO / "malformed").glob("*.txt"), *HANDMADE.glob("*.txt")]
    assert len(paths) >= 12
    for path in paths:
        assert looks_like(path.read_text()), path.name
        assert looks_like(path.read_text().expandtabs()), path.name


def test_looks_like_says_no_to_every_other_kind_of_capture():
    from conftest import FIXTURES

    paths = [p for kind in OTHER_KINDS for p in (FIXTURES / kind).rglob("*") if p.is_file() and p.suffix in (".txt", ".log")]
    assert len(paths) >= 20
    for path in paths:
        assert not looks_like(path.read_text(errors="replace")), path.name
    assert not looks_like("") and not looks_like("\tGPU0\tGPU1\n") and not looks_like("GPU0 is hot\nGPU0 fan 80%\n")


# ---- driver 580: the header underlined even into a pipe ------------------------------------------


def _read(text: str) -> object:
    try:
        return parse(text).model_dump(mode="json")
    except TopoParseError as e:
        return f"TopoParseError: {e}"


def test_the_h200_capture_reads_as_one_gpu_on_cpus_0_15_numa_0_without_nic_or_nvlink():
    raw = H200_TOPO.read_text()
    assert "\x1b[4m" in raw  # byte for byte as driver 580 wrote it
    t = parse(raw)
    assert [(g.index, g.cpu_affinity, g.cpus, g.numa_affinity, g.numa_nodes, g.gpu_numa_id, g.nics) for g in t.gpus] == [
        (0, "0-15", list(range(16)), "0", [0], None, {})]
    assert (t.nics, t.links, t.notes, t.numa_nodes, t.spans_numa) == ([], {}, [], [0], False)
    assert looks_like(raw)


@pytest.mark.parametrize("path", ALL_TOPO, ids=lambda p: p.name[:40])
def test_every_capture_with_a_driver_580_header_reads_as_the_original(path):
    text = path.read_text()
    underlined = driver_580(text)
    assert underlined != text and "\x1b[4m" in underlined
    assert _read(underlined) == _read(text)
    assert looks_like(underlined) == looks_like(text)


def test_a_header_underline_whose_esc_bytes_a_web_page_dropped_reads_as_the_underline():
    # sglang issue 26039: driver 590's ESC[4m ... ESC[0m around the header, pasted into GitHub, which
    # dropped each ESC and left "[4mGPU0 ... GPU NUMA ID[0m". Before, the GPU0 row was taken for the header.
    (path,) = (TOPO / "escapes-lost").glob("E1_*.txt")
    text = path.read_text()
    assert "\t[4mGPU0\t" in text and "GPU NUMA ID[0m\n" in text  # as stored
    assert looks_like(text)
    t = parse(text)
    assert len(t.gpus) == 8 and set(t.links.values()) == {"NV18"} and t.notes == []
    assert t.nics == [f"mlx5_{n}" for n in range(10, 18)] + ["mlx5_bond_0"]
    assert [g.cpu_affinity for g in t.gpus] == ["0-63,128-191"] * 4 + ["64-127,192-255"] * 4
    assert t.numa_nodes == [0, 1] and t.spans_numa is True
    assert t.nearest_nics == {str(i): [f"mlx5_1{i}"] for i in range(8)}
    # The same capture with the ESC bytes it had reads the same.
    assert parse(text.replace("[4m", "\x1b[4m").replace("[0m", "\x1b[0m")) == t


@pytest.mark.parametrize("line", [
    "[4mGPU0\tGPU1\tCPU Affinity",  # one end only: not the underline's remains
    "GPU0\t X \t[4m0-7[0m",  # not a header line
])
def test_a_bracket_m_that_is_not_a_lost_header_underline_stays(line):
    from preflight.readers.nvidia.topo import _readable
    assert _readable(line + "\n") == line + "\n"
