"""The NCCL log parser on recorded logs (every fact tests/fixtures/nccl/expected.json
lists), on hand-written lines for each prefix and channel form, on broken and
huge text; and `preflight nccl-log` as a real process."""

import json
import random
import re

import pytest
from conftest import FIXTURES, run_preflight

from preflight.readers import nccl_log
from preflight.readers.nccl_log import Channel, NcclLog, parse, render, to_json

NCCL = FIXTURES / "nccl"
EXPECTED = json.loads((NCCL / "expected.json").read_text())
LOGS = sorted(EXPECTED)


def fixture(prefix: str) -> str:
    (path,) = NCCL.glob(prefix + "*.log")
    return path.read_text()


def peer_table(log: NcclLog) -> dict:
    return {f"{r['src']}->{r['dst']}": {"transports": r["transports"], "channels": r["channels"]} for r in to_json(log, "x")["peers"]}


# --- the recorded logs -------------------------------------------------------------

def test_every_log_in_the_folder_has_its_expected_facts():
    assert sorted(p.name for p in NCCL.glob("*.log")) == LOGS


@pytest.mark.parametrize("name", LOGS, ids=lambda n: n[:3])
def test_recorded_log_gives_the_facts_its_index_lists(name):
    want = EXPECTED[name]
    log = parse((NCCL / name).read_text())
    for key in ("version", "versions", "networks", "ib_devices", "socket_interfaces", "env", "nranks", "nnodes", "nvls"):
        assert getattr(log, key) == want[key], key
    assert len(log.channels) == want["channel_lines"] and not log.skipped
    assert peer_table(log) == want["peers"]
    assert {"->".join(map(str, k)): v for k, v in log.peers().items()} == {k: v["transports"] for k, v in want["peers"].items()}
    assert {c.transport: [c.kind, c.net, c.gdr] for c in log.channels} == want["kinds"]
    first = {k: getattr(log.channels[0], k) for k in want["first_channel"]} if log.channels else None
    assert first == want["first_channel"]
    assert len(log.warnings) == want["warnings"]
    first = log.warnings[0].model_dump(include=set(want["first_warning"])) if log.warnings else None
    assert first == want["first_warning"]
    assert [{"category": p.category, "line": p.line, "count": p.count} for p in log.problems] == want["problems"]
    assert all(p.title and p.cause and p.fix and p.text for p in log.problems)


def test_watchdog_timeout_names_the_op_its_seqnum_the_timeout_and_the_ranks_that_waited():
    want = EXPECTED[next(n for n in LOGS if n.startswith("W01"))]["watchdog"]
    (p,) = parse(fixture("W01")).problems
    assert want["op"] in p.title and f"SeqNum {want['seq']}" in p.title and f"{want['timeout_s']} s" in p.title
    assert p.title.endswith("on ranks " + ", ".join(map(str, want["ranks"])))
    assert "py-spy" in p.fix and "NCCL_DEBUG=INFO" in p.fix and "TORCH_NCCL_TRACE_BUFFER_SIZE" in p.fix


def test_watchdog_names_the_ranks_that_did_not_report_when_the_world_size_is_known():
    text = "x [0] NCCL INFO comm 0x1 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0\n" + fixture("W01")
    (p,) = parse(text).problems
    assert "rank(s) 3 did not report it" in p.cause


def test_a_create_error_after_failed_to_extend_is_the_same_problem_and_alone_its_own():
    assert [p.category for p in parse(fixture("E03")).problems] == ["shm_no_space"]
    (p,) = parse(fixture("E03").splitlines()[0]).problems  # "Error while creating shared memory segment" only
    assert p.category == "shm_create" and "/dev/shm" in p.fix


def test_problem_causes_and_fixes_say_what_an_operator_does():
    fixes = {p.category: p.fix for name in LOGS for p in parse((NCCL / name).read_text()).problems}
    assert "--shm-size" in fixes["shm_no_space"] and "--ipc=host" in fixes["shm_no_space"] and "medium: Memory" in fixes["shm_no_space"]
    for words in ("ibv_devinfo", "ulimit -l", "memlock", "RDMA device plugin", "NCCL_IB_HCA"):
        assert words in fixes["ib_verbs"]
    assert "NCCL_SOCKET_IFNAME" in fixes["socket"] and "failed first" in fixes["socket"]


# --- hand-written lines: prefixes ---------------------------------------------------

BODY = "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read"
PREFIXES = [
    "",
    "host-1:5969:5969 [0] ",
    "[2026-03-18 11:13:09] host-1:5969:5969 [0] ",
    "(RayWorkerWrapper pid=626, ip=10.244.1.107) host-1:5969:5969 [0] ",
    "[rank1]:host-1:5969:5969 [0] ",
    "[56] host-1:5969:5969 [0] ",
    "2025-11-12 20:42:20,261 - INFO - host-1:5969:5969 [0] ",
    "> > > (WorkerDict pid=3569860) host-1:5969:5969 [0] ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_prefix_form_gives_the_same_facts(prefix):
    text = "\n".join(prefix + body for body in (
        "NCCL INFO NCCL version 2.21.5+cuda12.4",
        "NCCL INFO Using network IB",
        "NCCL INFO NCCL_IB_HCA set by environment to mlx5_0,mlx5_1.",
        "misc/shmutils.cc:71 NCCL WARN Error: failed to extend /dev/shm/nccl-fjwOOB to 5967876 bytes",
        BODY,
    ))
    log = parse(text)
    assert (log.version, log.networks, log.env) == ("2.21.5+cuda12.4", ["IB"], {"NCCL_IB_HCA": "mlx5_0,mlx5_1"})
    (c,) = log.channels
    assert (c.line, c.channel, c.src_rank, c.src_dev, c.dst_rank, c.dst_dev, c.transport) == (5, 0, 0, 0, 1, 1, "P2P/IPC/read")
    (w,) = log.warnings
    assert (w.line, w.where, w.message) == (4, "misc/shmutils.cc:71", "Error: failed to extend /dev/shm/nccl-fjwOOB to 5967876 bytes")
    assert (w.host, w.pid, w.dev) == ((None, None, None) if not prefix else ("host-1", 5969, 0))
    assert [p.category for p in log.problems] == ["shm_no_space"] and log.nccl_lines == 5


def test_the_version_line_nccl_prints_without_a_prefix_and_torchs_version_are_one_version():
    log = parse("NCCL version 2.19.3+cuda12.3\nRuntimeError: NCCL error in: x.cpp:1, unhandled system error, NCCL version 2.19.3\n")
    assert log.versions == ["2.19.3+cuda12.3"] and [p.category for p in log.problems] == ["unhandled_system_error"]
    assert parse("NCCL version 2.19.3\nNCCL version 2.19.3+cuda12.3\n").versions == ["2.19.3+cuda12.3"]


def test_two_nccl_versions_in_one_job_are_both_listed_and_said():
    log = parse("a:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\nb:2:2 [0] NCCL INFO NCCL version 2.18.3+cuda12.2\n")
    assert (log.version, log.versions) == ("2.21.5+cuda12.4", ["2.21.5+cuda12.4", "2.18.3+cuda12.2"])
    assert "more than one NCCL in one job" in render(log, "x")


# --- hand-written lines: channel forms ------------------------------------------------

CHANNELS = [
    # line, (channel, src, src_dev, dst, dst_dev, direction, kind, net, gdr), buses
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", (0, 0, 0, 1, 1, None, "P2P", None, False), None),
    ("Channel 07/0 : 7[7] -> 6[6] via P2P/direct pointer/read", (7, 7, 7, 6, 6, None, "P2P", None, False), None),
    ("Channel 02 : 1[1] -> 2[2] via SHM/direct/direct", (2, 1, 1, 2, 2, None, "SHM", None, False), None),
    ("Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3", (3, 15, 7, 6, 6, "send", "NET", "Socket", False), None),
    ("Channel 01/0 : 13[5] -> 4[4] [receive] via NET/IB/3", (1, 13, 5, 4, 4, "receive", "NET", "IB", False), None),
    ("Channel 00/0 : 1[1] -> 9[1] [send] via NET/IB/0(8)/GDRDMA", (0, 1, 1, 9, 1, "send", "NET", "IB", True), None),  # PXN
    ("Channel 04/0 : 2[2] -> 10[2] [send] via NET/IBext_v8/5(2)/GDRDMA", (4, 2, 2, 10, 2, "send", "NET", "IBext_v8", True), None),
    ("Channel 01/1 : 0[0] -> 8[0] [receive] via NET/IB/9/GDRDMA/Shared", (1, 0, 0, 8, 0, "receive", "NET", "IB", True), None),
    ("Channel 02/0 : 3[3] -> 11[3] [send] via NET/IB/3/GDRDMA(PCI)", (2, 3, 3, 11, 3, "send", "NET", "IB", True), None),
    ("Ring 00 : 0[0] -> 1[1] via direct shared memory", (0, 0, 0, 1, 1, None, "SHM", None, False), None),
    ("Ring 00 : 6 -> 2 [receive] via NET/IB/0", (0, 6, None, 2, None, "receive", "NET", "IB", False), None),
    ("Ring 01 : 1[23000] -> 8[1e000] [send] via NET/IB/1/GDRDMA", (1, 1, None, 8, None, "send", "NET", "IB", True), ("23000", "1e000")),
    ("Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA", (1, 2, None, 0, None, "receive", "NET", "IB", True), ("c7000", "87000")),
    ("Channel 00/0 : 0[0] -> 4[4] via P2P/indirect/2[2]", (0, 0, 0, 4, 4, None, "P2P", None, False), None),
    ("Channel 00/0 : 0[0] -> 1[1] via NVLS/IPC", (0, 0, 0, 1, 1, None, "NVLS", None, False), None),
]


@pytest.mark.parametrize("line, facts, buses", CHANNELS, ids=[c[0].split(" via ")[1] for c in CHANNELS])
def test_each_channel_line_form(line, facts, buses):
    (c,) = parse(f"host:1:2 [0] NCCL INFO {line}\n").channels
    assert (c.channel, c.src_rank, c.src_dev, c.dst_rank, c.dst_dev, c.direction, c.kind, c.net, c.gdr) == facts
    assert c.transport == line.split(" via ")[1] and (c.src_bus, c.dst_bus) == (buses or (None, None))


def test_a_bus_id_anywhere_means_every_bracket_of_that_log_is_one():
    log = parse("Channel 00 : 0[50] -> 1[1b000] via P2P/IPC\nChannel 00 : 1[1b000] -> 0[50] via P2P/IPC\n")
    assert [(c.src_dev, c.src_bus, c.dst_dev, c.dst_bus) for c in log.channels] == [(None, "50", None, "1b000"), (None, "1b000", None, "50")]


def test_ring_order_and_tree_lines_are_not_connections():
    log = parse("h:1:1 [0] NCCL INFO Channel 00/24 :    0   1   2   3\nh:1:1 [0] NCCL INFO Ring 00 : 0 1 2 3\n"
                "h:1:1 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1\n"
                "h:1:1 [0] NCCL INFO Ring 00 : 0[0] <- 1[1] via P2P/CUMEM\n")  # TRACE's reverse arrow
    assert log.channels == [] and log.skipped == [] and log.nccl_lines == 4


def test_peers_keep_the_order_of_first_use_and_count_channels_once_per_side():
    log = parse("Channel 00/0 : 3[3] -> 0[0] [send] via NET/IB/0/GDRDMA\n"
                "Channel 00/0 : 3[3] -> 0[0] [receive] via NET/IB/4/GDRDMA\n"
                "Channel 01/0 : 3[3] -> 0[0] [send] via NET/IB/0/GDRDMA\n")
    assert log.peers() == {(3, 0): ["NET/IB/0/GDRDMA", "NET/IB/4/GDRDMA"]}
    assert to_json(log, "x")["peers"] == [{"src": 3, "dst": 0, "transports": ["NET/IB/0/GDRDMA", "NET/IB/4/GDRDMA"], "channels": 2}]


# --- broken, empty, odd and huge text -------------------------------------------------

@pytest.mark.parametrize("line", [
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/rea",  # cut inside the transport
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/IB/0/GDR",
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPh:1:3 [1] NCCL INFO Channel 01/0 : 1[1] -> 2[2] via P2P/IPC",
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via ",
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/dir",
])
def test_a_channel_line_cut_or_interleaved_is_skipped_not_guessed(line):
    log = parse(line + "\n")
    assert log.channels == [] and log.skipped == [1]
    assert "1 channel line(s) cut or garbled" in render(log, "x")


@pytest.mark.parametrize("text", [
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[\n1] via P2P/IPC\n",  # split across lines
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via\n P2P/IPC\n",
    "(WorkerDict pid=3569860) degamts15:3569860:3571297 [0] N\n(WorkerDict pid=3569861) degamts15:3569861:3571306\n",
    "NCCL version 2.\nNCCL version 2.21\nNCCL_IB_HCA set by environment to \nUsing network \n",
    "h:1:2 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [\n\n  13] 1/-1/-1->0->-1 [14] 1/-1/-1->0->-1\n",
])
def test_broken_lines_give_no_facts(text):
    log = parse(text)
    assert (log.channels, log.versions, log.env, log.networks, log.warnings, log.problems) == ([], [], {}, [], [], [])


def test_a_version_cut_inside_its_cuda_suffix_keeps_only_the_part_that_is_whole():
    assert parse("NCCL version 2.21.5+cuda12\n").versions == ["2.21.5"]
    assert parse("NCCL version 2.21.5+cu").versions == ["2.21.5"]


def test_lines_broken_anywhere_never_invent_a_channel_or_a_version():
    rng = random.Random(7)
    for name in LOGS:
        text = (NCCL / name).read_text()
        whole = parse(text)
        real = {(c.channel, c.src_rank, c.dst_rank): c.transport for c in whole.channels}
        lines = text.splitlines()
        for _ in range(30):
            cut = [line[: (at := rng.randrange(len(line) + 1))] + "\n" + line[at:] if line and rng.random() < 0.5 else line for line in lines]
            log = parse("\n".join(cut))
            for c in log.channels:  # a line cut right after "P2P/IPC" of "P2P/IPC/read" cannot be told from a whole one
                assert real[(c.channel, c.src_rank, c.dst_rank)].startswith(c.transport)
            assert all(any(v == w or w.startswith(v) for w in whole.versions) for v in log.versions)


def test_empty_text_and_text_without_nccl():
    for text in ("", "\n\n", "hello\nworld\n"):
        log = parse(text)
        assert log.nccl_lines == 0 and log.channels == [] and log.problems == [] and log.version is None
        assert "no NCCL debug output here" in render(log, "x")
    assert parse("").lines == 0 and parse("a\nb").lines == 2 and parse("a\nb\n").lines == 2


def test_odd_characters_and_crlf_never_crash():
    text = "h:1:2 [0] NCCL INFO Using network Socket\r\n\x00\ufffd\u2028Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\r\n" + "".join(map(chr, range(1, 300)))
    log = parse(text)
    assert log.networks == ["Socket"] and [c.transport for c in log.channels] == ["P2P/IPC"]


def test_200k_lines_parse_whole():
    """Every fact at scale (the timing figure is in tests/perf/bench_nccl_log.py)."""
    unit = fixture("E14") + fixture("05")
    n = 200_000 // unit.count("\n") + 1
    log = parse(unit * n)
    assert log.lines == unit.count("\n") * n and len(log.channels) == 54 * n and len(log.warnings) == n
    assert [(p.category, p.count) for p in log.problems] == [("socket", 2 * n), ("internal_error", n)]
    assert log.peers()[(1, 2)] == ["P2P/direct pointer"] and log.env["NCCL_P2P_DISABLE"] == "1"


def test_a_pathological_line_stays_linear():
    """Quadratic patterns would take minutes here; the parser takes milliseconds."""
    junk = "Channel 00/0 : 0[0] -> 1[1] via /dev/shm/x NCCL_X set by environment to  WorkNCCL( NCCL WARN ocket " * 4000
    log = parse(junk + "\n" + junk)
    assert log.lines == 2 and log.channels == []


# --- the text and JSON ------------------------------------------------------------------

def test_render_of_a_clean_log():
    text = render(parse(fixture("01a")), "rank0.log")
    assert text.startswith("rank0.log: 79 lines, ")
    for words in ("NCCL version  2.21.5+cuda12.4", "network       IB (IB devices: mlx5_0:1/IB", "ranks         8 on 1 node(s)",
                  "NVLS          not available", "NCCL_CUMEM_ENABLE=0", "0 -> 1          24  P2P/IPC/read",
                  "warnings      no NCCL WARN lines", "problems      none of the known NCCL errors"):
        assert words in text


def test_render_collapses_repeated_warnings_and_explains_each_problem():
    text = render(parse(fixture("E09")), "x")
    assert "3 NCCL WARN line(s), 1 distinct" in text and "line 4: ibvwrap.c:130: Call to ibv_create_qp failed  (x3)" in text
    text = render(parse(fixture("E03")), "x")
    assert "5 NCCL WARN line(s), 2 distinct" in text and "(x3)" in text and "(x2)" in text  # segment names differ
    text = render(parse(fixture("E14")), "x")
    assert "NCCL_P2P_DISABLE=1  (GPU peer-to-peer over NVLink/PCIe off)" in text
    assert "problems      2, in the order they appear" in text
    assert text.index("PROBLEM socket") < text.index("PROBLEM internal_error")
    assert text.count("  cause: ") == 2 and text.count("  fix: ") == 2


def test_render_caps_a_huge_peer_table():
    log = parse("".join(f"Channel 00/0 : {i}[0] -> {i + 1}[0] via P2P/IPC\n" for i in range(100)))
    text = render(log, "x")
    assert "... 36 more pairs (--json lists all)" in text and len(to_json(log, "x")["peers"]) == 100


def test_json_holds_the_facts_and_the_peer_table_not_every_channel():
    data = to_json(parse(fixture("E14")), "e14.log")
    assert data["source"] == "e14.log" and data["channel_lines"] == 1 and "channels" not in data
    assert data["peers"] == [{"src": 0, "dst": 1, "transports": ["NET/Socket/0/Shared"], "channels": 1}]
    assert [p["category"] for p in data["problems"]] == ["socket", "internal_error"]
    assert json.loads(json.dumps(data)) == data
    NcclLog.model_validate({k: v for k, v in data.items() if k in NcclLog.model_fields} | {"channels": []})


def test_the_interface_other_code_imports():
    assert nccl_log.MAX_BYTES == 64 << 20
    assert set(Channel.model_fields) >= {"line", "channel", "src_rank", "src_dev", "dst_rank", "dst_dev", "direction", "transport", "kind", "net", "gdr"}
    assert callable(nccl_log.parse) and callable(nccl_log.render) and callable(nccl_log.to_json)


# --- the command, as a person runs it ---------------------------------------------------

def test_cli_success_log_prints_the_table_and_exits_0():
    path = next(NCCL.glob("02_*.log"))
    r = run_preflight(["nccl-log", str(path)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{path}: 60 lines") and "0 -> 1           2  SHM/direct/direct" in r.stdout and r.stderr == ""
    r = run_preflight(["nccl-log", str(path), "--json"])
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["version"] == "2.27.5+cuda12.9" and data["problems"] == [] and len(data["socket_interfaces"]) == 16


def test_cli_error_log_prints_cause_and_fix_and_exits_1():
    path = next(NCCL.glob("E04_*.log"))
    r = run_preflight(["nccl-log", str(path)])
    assert r.returncode == 1 and "PROBLEM shm_no_space: /dev/shm is too small" in r.stdout and "fix: give /dev/shm more space" in r.stdout
    r = run_preflight(["nccl-log", str(path), "--json"])
    data = json.loads(r.stdout)
    assert r.returncode == 1 and [p["category"] for p in data["problems"]] == ["shm_no_space", "socket"]
    assert data["warnings"][0]["where"] == "misc/shmutils.cc:88"


def test_cli_torch_log_without_nccl_debug_lines_still_explains_the_timeout():
    r = run_preflight(["nccl-log", str(next(NCCL.glob("W01_*.log")))])
    assert r.returncode == 1 and "no NCCL debug output here" in r.stdout and "ALLREDUCE (SeqNum 808) timed out" in r.stdout


def _write(name: str, data: bytes):
    def make(tmp):
        (tmp / name).write_bytes(data)
        return tmp / name
    return make


@pytest.mark.parametrize("make, words", [
    (lambda tmp: tmp / "missing.log", "no such file"),
    (lambda tmp: tmp, "is a directory"),
    (_write("core.gz", b"\x1f\x8b\x08\x00\x00\x00\x00\x00"), "is not text"),
    (_write("empty.log", b""), "holds no NCCL output; run the job with NCCL_DEBUG=INFO"),
    (_write("app.log", b"epoch 1 loss 0.3\n"), "holds no NCCL output"),
], ids=["missing", "directory", "binary", "empty", "no-nccl"])
def test_cli_wrong_file_is_one_line_on_stderr_and_exit_2(tmp_path, make, words):
    path = make(tmp_path)
    r = run_preflight(["nccl-log", str(path)])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"preflight: error: {path}") and words in r.stderr


def test_cli_refuses_a_device_and_a_huge_file(tmp_path):
    r = run_preflight(["nccl-log", "/dev/zero"])
    assert r.returncode == 2 and "not a regular file" in r.stderr and r.stderr.count("\n") == 1
    big = tmp_path / "huge.log"
    with big.open("wb") as f:
        f.truncate(nccl_log.MAX_BYTES + 1)  # sparse
    r = run_preflight(["nccl-log", str(big)])
    assert r.returncode == 2 and "larger than 64 MiB" in r.stderr and r.stderr.count("\n") == 1


def test_cli_help_lists_the_command():
    r = run_preflight(["--help"])
    assert re.search(r"nccl-log\s+Explain an NCCL log", r.stdout)
