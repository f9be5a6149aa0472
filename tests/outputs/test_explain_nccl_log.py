"""`preflight explain` of an NCCL log: the known problems `preflight nccl-log`
reports as failures with their cause and fix, the settings that take a fast
transport away as warnings, the facts, and the same refusal of a non-NCCL file."""

import json

import pytest
from conftest import FIXTURES
from typer.testing import CliRunner

from preflight.base.errors import UsageError
from preflight.cli.app import app
from preflight.outputs.explain import explain_nccl_log

NCCL = FIXTURES / "nccl"


def explained(name: str):
    (path,) = NCCL.glob(name + "*")
    return explain_nccl_log.explain(path.read_text(), str(path), None)


@pytest.mark.parametrize("name", sorted(p.name for p in NCCL.glob("*.log")))
def test_each_problem_the_nccl_log_command_reports_fails_with_its_cause_and_fix(name):
    path = NCCL / name
    e = explain_nccl_log.explain(path.read_text(), str(path), None)
    r = CliRunner().invoke(app, ["nccl-log", str(path), "--json"])
    said = json.loads(r.stdout)
    fails = [i for i in e.findings if i.severity == "fail"]
    assert [(i.summary, i.fix) for i in fails] == [(p["title"], p["fix"]) for p in said["problems"]]
    assert all(p["cause"] in i.cause and f"line {p['line']}" in i.cause for i, p in zip(fails, said["problems"]))
    assert e.failed == (r.exit_code == 1)
    assert e.facts["transports"] == said["peers"] and e.facts["version"] == said["version"]
    assert (e.kind, e.title) == ("nccl-log", "NCCL log")


def test_a_clean_init_log_gives_version_network_and_transports_per_rank_pair():
    e = explained("09_")
    assert e.findings == []
    assert e.facts["version"] == "2.28.9+cuda12.9"
    assert [(t["src"], t["dst"], t["transports"]) for t in e.facts["transports"]] == [
        (0, 1, ["P2P/CUMEM/read"]), (1, 2, ["SHM/direct/direct"]), (2, 3, ["P2P/CUMEM/read"]), (3, 0, ["SHM/direct/direct"])]
    ib = explained("01a_")
    assert ib.facts["networks"] == ["IB"] and ib.facts["nranks"] == 8 and len(ib.facts["ib_devices"]) == 8


def test_shm_too_small_fails_with_the_shm_fix():
    (f,) = explained("E03_").findings
    assert f.severity == "fail" and f.summary == "/dev/shm is too small for NCCL's shared-memory segments"
    assert "line 9, and 1 more line(s): " in f.cause and "failed to extend /dev/shm/nccl-fjwOOB" in f.cause
    assert "--shm-size" in f.fix


def test_p2p_and_shm_switched_off_warn_beside_the_failures():
    e = explained("E14_")
    assert [(i.severity, i.summary) for i in e.findings if i.severity == "warn"] == [
        ("warn", "NCCL_P2P_DISABLE=1: GPU peer-to-peer over NVLink/PCIe off"),
        ("warn", "NCCL_SHM_DISABLE=1: shared-memory transport off"),
    ]
    p2p = next(i for i in e.findings if i.summary.startswith("NCCL_P2P_DISABLE"))
    assert "set by environment to 1" in p2p.cause and "unset NCCL_P2P_DISABLE" in p2p.fix
    assert [i.summary for i in e.findings if i.severity == "fail"] == ["a socket connection between ranks failed", "NCCL's internal check failed"]
    assert e.facts["transports"][0]["transports"] == ["NET/Socket/0/Shared"]


def test_two_nccl_versions_in_one_job_warn():
    log = "host:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\nhost:2:2 [1] NCCL INFO NCCL version 2.19.3+cuda12.3\n"
    (w,) = explain_nccl_log.explain(log, "job.log", None).findings
    assert w.severity == "warn" and w.summary == "more than one NCCL in one job: 2.21.5+cuda12.4, 2.19.3+cuda12.3"


@pytest.mark.parametrize("content", ["", "Epoch 1: loss 0.31\n", (FIXTURES / "xid" / "01_xid63_row-remapper-new-row-marked_a100.txt").read_text()])
def test_a_file_with_no_nccl_output_is_refused_in_the_nccl_log_commands_words(tmp_path, content):
    path = tmp_path / "train.log"
    path.write_text(content)
    with pytest.raises(UsageError) as e:
        explain_nccl_log.explain(content, str(path), None)
    r = CliRunner().invoke(app, ["nccl-log", str(path)])
    assert r.exit_code == 2 and r.stderr == f"preflight: error: {e.value}\n"
