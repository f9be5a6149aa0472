"""The text and JSON of `preflight nccl-log`, and the command as a real
process on the recorded logs of tests/fixtures/nccl and on wrong files."""

import json
import re

import pytest
from conftest import FIXTURES, run_preflight
from conftest import nccl_fixture_text as fixture

from preflight.outputs.explain.nccl_log_text import render, to_json
from preflight.readers.nccl import nccl_log
from preflight.readers.nccl.nccl_log import NcclLog, parse

NCCL = FIXTURES / "nccl"


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


def test_cli_collnet_fallback_is_a_warning_and_exits_0():
    (path,) = (NCCL / "handmade").glob("H04_*.log")
    r = run_preflight(["nccl-log", str(path)])
    assert r.returncode == 0, r.stderr
    assert "WARNING collnet_fallback: CollNet (SHARP in-network reduction) could not be used" in r.stdout and "PROBLEM" not in r.stdout
    assert "fix: check that the SHARP plugin loads" in r.stdout
    r = run_preflight(["nccl-log", str(path), "--json"])
    assert r.returncode == 0 and [(p["category"], p["severity"]) for p in json.loads(r.stdout)["problems"]] == [("collnet_fallback", "warn")]


def test_cli_a_failure_beside_a_warning_still_exits_1():
    (path,) = (NCCL / "handmade").glob("H03_*.log")
    r = run_preflight(["nccl-log", str(path)])
    assert r.returncode == 1 and "PROBLEM shm_no_space: /dev/shm is too small" in r.stdout


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
