"""report_view reads a report without pydantic for `status`: it must never accept
what the Report model refuses, and must read what it accepts as the model does.
Every fixture, a report with every part filled in, and many damaged variants
of them go through both readers; the models' fields are pinned in
test_report_schema.py."""

from __future__ import annotations

import copy
import json
from datetime import timedelta

import pytest
from conftest import REPORTS
from pydantic import ValidationError

from preflight.base import actions
from preflight.pipeline import report_view
from preflight.pipeline.check import Result
from preflight.base.findings import Measurement, Status
from preflight.outputs.record.last_report import State, load, load_view, standing
from preflight.pipeline.report import Report
from preflight.pipeline.shape import NodeShape

FIXTURES = sorted(REPORTS.glob("*.json"))


def model_reads(data: bytes) -> Report | None:
    try:
        return Report.model_validate_json(data)
    except ValidationError:
        return None


def judged(r) -> tuple:  # noqa: ANN001
    """Everything a judge reads of a report (last_report.standing, status --json)."""
    return (str(r.verdict), r.profile, r.boot_id, r.started_at, r.finished_at, r.interrupted_by_signal,
            [(c.check, str(c.status), c.summary, tuple(map(str, c.next))) for c in r.checks],
            # slurm-healthcheck's: the run's action and the check that decided it, and the node's GPUs
            (str(r.action), str(r.domain), r.action_source, r.action_check, r.shape.gpus if r.shape else None))


def assert_agree(data: bytes) -> bool:
    """The view accepts only what the model accepts, and reads it alike. Returns whether it accepted."""
    seen = report_view.view(data)
    if seen is None:
        return False
    model = model_reads(data)
    assert model is not None, f"the view accepted what the model refuses: {data[:300]!r}"
    assert judged(seen) == judged(model)
    return True


def full_report() -> dict:
    """A report with every part the model has: group, shape, measurements with bounds and labels."""
    r = Report.model_validate_json((REPORTS / "group-pass-node0.json").read_bytes())
    shape = NodeShape(gpus=8, gpus_from="PCI bus and /dev/nvidia0-7", slots=[f"0000:{i:02x}:00.0" for i in range(8)],
                      pci_gpus=[f"0000:{i:02x}:00.0" for i in range(8)], device_nodes=list(range(8)), nvml_gpus=8,
                      fabric="nvswitch", fabric_from="NVML: active NVLinks end at an NVSwitch", nvswitches=4,
                      nics=["mlx5_0", "mlx5_1"], pinned=8, notes=["a note"])
    check = r.checks[0].model_copy(update={"action": actions.Action.RESET_GPU, "domain": actions.Domain.NODE, "action_source": "Xid 48", "measurements": [
        Measurement(name="allreduce_bus_bandwidth", unit="bytes_per_second", value=1.5e11, labels={"gpu": "3", "UUID": "GPU-1"}, floor=1e11),
        Measurement(name="step_time", unit="seconds", value=0.25, ceiling=0.5),
    ], "cause": "a cause", "remedy": "a fix", "lines": ["a line"]})
    r = r.model_copy(update={"shape": shape, "checks": [check, *r.checks[1:]], "interrupted_by_signal": None,
                             "last_success_at": r.finished_at,
                             # a lemon: the history asks for service, above every check's action (judged alike by both readers)
                             "history": Result(check="history", status=Status.WARN, summary="failed 3 times in 7 days: shm, shm, shm",
                                               action=actions.Action.SERVICE, domain=actions.Domain.NODE, action_source="3 FAILs in 7 days"),
                             "versions": {"driver": "550.54.15", "torch": "2.13.0"}})
    return json.loads(r.model_dump_json(indent=2))


# ---- what the view reads ------------------------------------------------------------


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_every_fixture_is_read_without_pydantic_and_as_the_model_reads_it(fixture):
    assert assert_agree(fixture.read_bytes())


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_what_preflight_writes_is_read_without_pydantic(fixture):
    written = Report.model_validate_json(fixture.read_bytes()).model_dump_json(indent=2)  # as `run` writes it
    assert assert_agree(written.encode())


def test_a_report_with_every_part_is_read_without_pydantic():
    data = full_report()
    assert data["shape"] and data["group"] and data["checks"][0]["measurements"]
    assert assert_agree(json.dumps(data).encode())


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_both_readers_judge_alike(tmp_path, fixture):
    path = tmp_path / "r.json"
    path.write_bytes(fixture.read_bytes())
    viewed, modelled = load_view(path), load(path)
    assert isinstance(viewed.report, report_view.ReportView) and isinstance(modelled.report, Report)
    end = modelled.report.finished_at
    for boot in (modelled.report.boot_id, "another-boot", None):
        for after, max_age in ((60, None), (7200, 3600), (-3600, None)):
            for booted in (None, end - timedelta(hours=1), end + timedelta(hours=1)):
                args = (boot, end + timedelta(seconds=after), max_age, booted)
                assert standing(viewed, *args) == standing(modelled, *args)


def test_an_unusual_but_valid_report_is_left_to_the_model(tmp_path):
    data = json.loads((REPORTS / "shm-64m-fail.json").read_text())
    data["finished_at"] = "2026-11-22 05:25:01Z"  # no "T": the model's parser takes it
    data["exit_code"] = "1"  # a numeric string: the model's lax mode takes it
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert report_view.view(path.read_bytes()) is None
    loaded = load_view(path)
    assert loaded.state == State.OK and isinstance(loaded.report, Report) and loaded.report.exit_code == 1


@pytest.mark.parametrize("depth", [150, 198, 250])
def test_deep_nesting_the_model_may_refuse_is_left_to_it(depth):
    # json.loads takes ~1000 levels, pydantic's parser ~200: a status that said
    # "vouched" where serve says "invalid" would split the fleet's answers.
    data = json.loads((REPORTS / "cpu-pass.json").read_text())
    nested: list = []
    for _ in range(depth):
        nested = [nested]
    data["checks"][0]["details"]["deep"] = nested
    assert report_view.view(json.dumps(data).encode()) is None


def test_a_damaged_report_gets_the_models_error(tmp_path):
    data = json.loads((REPORTS / "cpu-pass.json").read_text())
    data["checks"][1]["status"] = "GREAT"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    assert load_view(path) == load(path)
    assert load_view(path).state == State.INVALID and "checks.1.status" in load_view(path).error


# ---- it never accepts what the model refuses ----------------------------------------------

ODD = [None, "", "x", "PASS", "pass", "nvswitch", "snake_case", "__x", "1", 0, -1, 1, 7, 4097, 2.5, -0.5, 1e300, True, False,
       [], [1], ["x"], {}, {"a": 1}, {"__bad": "x"}, {"1a": "x"}, "2026-11-22T05:25:01Z", "2026-11-22T05:25:01", "2026-11-22T05:25:01+05:30",
       "2026-02-30T00:00:00Z", "2026-11-22T24:00:00Z", "2026-11-22T05:25:01.1234567Z", "2026-11-22T05:25:01+24:00", "2026-11-22"]


def paths(doc: dict) -> list[tuple]:
    """Every field of the report and of the first of each nested object."""
    out = [(k,) for k in doc]
    for k, v in doc.items():
        if isinstance(v, dict) and k not in ("details", "versions"):
            out += [(k, *p) for p in paths(v)]
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            out += [(k, 0, *p) for p in paths(v[0])]
    return out


def mutated(doc: dict, path: tuple, value: object) -> dict:
    out = copy.deepcopy(doc)
    *parents, last = path
    target = out
    for p in parents:
        target = target[p]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return out


DELETE = object()


@pytest.mark.parametrize("base", ["shm-64m-fail", "full"])
def test_no_damaged_field_is_accepted_that_the_model_refuses(base):
    doc = full_report() if base == "full" else json.loads((REPORTS / f"{base}.json").read_text())
    accepted = refused = 0
    for path in paths(doc):
        for value in [*ODD, DELETE]:
            if assert_agree(json.dumps(mutated(doc, path, value)).encode()):
                accepted += 1
            else:
                refused += 1
    assert accepted > 100 and refused > 500  # both ways taken: the test has teeth


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"[]",
        b"null",
        b'{"verdict": "pa',
        "\ufeff{}".encode(),
        "{}".encode("utf-16"),
        b"\xff\xfe",
    ],
)
def test_what_is_not_a_report_is_left_to_the_model(text):
    assert report_view.view(text) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace('"duration_seconds": 0.1', '"duration_seconds": NaN, "x": 0.1', 1),
        lambda t: t.replace('"duration_seconds": 0.1', '"duration_seconds": 1e999, "x": 0.1', 1),
        lambda t: t.replace('"exit_code": 1', '"exit_code": 123456789012345678901234567890', 1),
        lambda t: t.replace('"verdict": "fail"', '"verdict": "pass", "verdict": "fail"', 1),
        lambda t: t.replace('"hostname": "', '"hostname": "\\ud800', 1),
        lambda t: t + "x",
        lambda t: t.replace('"exit_code": 1', '"exit_code": 1.0', 1),
    ],
    ids=["nan", "overflow", "huge-int", "duplicate-key", "lone-surrogate", "trailing", "float-for-int"],
)
def test_json_the_two_parsers_may_read_apart_is_left_to_the_model(change):
    text = (REPORTS / "shm-64m-fail.json").read_text()
    changed = change(text)
    assert changed != text
    assert report_view.view(changed.encode()) is None


def test_the_run_s_action_is_derived_as_the_model_derives_it():
    """Every ladder rung and domain against another: the highest, the node's domain on a tie, the first between equals."""
    base = json.loads((REPORTS / "cpu-pass.json").read_bytes())
    first = base["checks"][0]
    pairs = [(a, d) for a in actions.LADDER for d in actions.Domain]
    for (a1, d1), (a2, d2) in zip(pairs, reversed(pairs)):
        checks = [{**first, "check": "one", "status": "FAIL", "action": a1.value, "domain": d1.value, "action_source": "s1"},
                  {**first, "check": "two", "status": "WARN", "action": a2.value, "domain": d2.value},
                  {**first, "check": "three", "status": "ERROR"}]
        assert assert_agree(json.dumps({**base, "checks": checks, "verdict": "fail"}).encode())
