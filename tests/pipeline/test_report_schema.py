"""report_schema holds the fields report_view checks a report against without pydantic:
the models' fields are pinned here, so a field or validator added to them fails here until
report_schema knows it too; the words a report is written in are the models' own."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from preflight.base import actions
from preflight.pipeline import report_schema
from preflight.pipeline.check import Result
from preflight.base.findings import Measurement, Status
from preflight.pipeline.report import HeldBack, GroupNode, GroupRecord, Report, Verdict
from preflight.pipeline.shape import NodeShape


# ---- the view knows every field and rule of the models ------------------------------------


def kind(model: type) -> dict[str, str]:
    def one(f) -> str:  # noqa: ANN001
        a = f.annotation
        text = a.__name__ if isinstance(a, type) else str(a).replace("typing.", "").replace("preflight.", "").replace("datetime.datetime", "datetime")
        return text + (f" {f.metadata}" if f.metadata else "") + ("" if f.is_required() else " = default")

    return {name: one(f) for name, f in model.model_fields.items()}


# When one of these changes, report_schema.py must learn the change first (its field
# tables and rules), then this picture follows.
MODELS = {
    Report: (report_schema.REPORT, {
        "schema_version": "int [Ge(ge=1), Le(le=1)] = default", "tool": "str = default", "version": "str", "hostname": "str",
        "boot_id": "str | None", "profile": "str | None", "profile_chosen_because": "str | None = default",
        "level": "Optional[Literal['quick', 'standard', 'full']] = default", "level_chosen_because": "str | None = default",
        "config": "str | None = default", "started_at": "datetime", "finished_at": "datetime", "duration_seconds": "float",
        "verdict": "Verdict", "exit_code": "int", "keep_going": "bool = default", "interrupted_by_signal": "int | None = default",
        "versions": "dict[str, str] = default", "last_success_at": "datetime | None = default",
        "group": "pipeline.report.GroupRecord | None = default", "shape": "pipeline.shape.NodeShape | None = default", "checks": "list[pipeline.check.Result]",
        "history": "pipeline.check.Result | None = default", "held_back": "pipeline.report.HeldBack | None = default",
    }),
    HeldBack: (report_schema.HELD_BACK, {"by": "str", "said": "str", "at": "datetime"}),
    Result: (report_schema.RESULT, {
        "check": "str", "status": "Status", "summary": "str", "cause": "str | None = default", "remedy": "str | None = default",
        "measurements": "list[base.findings.Measurement] = default", "details": "dict[str, Any] = default",
        "duration_seconds": "float = default", "lines": "list[str] = default",
        "action": "base.actions.Action | None = default", "domain": "base.actions.Domain | None = default",
        "action_source": "str | None = default",
    }),
    Measurement: (report_schema.MEASUREMENT, {
        "name": "str", "unit": "str", "value": "float", "labels": "dict[str, str] = default",
        "floor": "float | None = default", "ceiling": "float | None = default",
        "repeats": "int | None = default", "ci": "float | None = default", "converged": "bool | None = default",
    }),
    NodeShape: (report_schema.NODE_SHAPE, {
        "gpus": "int", "gpus_from": "str", "slots": "list[str] = default", "pci_gpus": "list[str] | None = default",
        "device_nodes": "list[int] | None = default", "nvml_gpus": "int | None = default",
        "fabric": "Literal['single', 'nvswitch', 'nvlink', 'pcie', 'unknown'] = default", "fabric_from": "str = default",
        "nvswitches": "int = default", "nics": "list[str] = default", "nics_from": "str = default",
        "pinned": "int | None = default", "notes": "list[str] = default", "host_gpus": "int | None = default",
    }),
    GroupRecord: (report_schema.GROUP_RECORD, {
        "nnodes": "int [Ge(ge=1), Le(le=4096)]", "node_rank": "int [Ge(ge=0)]", "endpoint": "str", "rdzv_id": "str",
        "local_addr": "str | None = default", "passed": "bool = default", "nodes": "list[pipeline.report.GroupNode] = default",
        "missing": "list[int] = default", "meeting_error": "str | None = default",
    }),
    GroupNode: (report_schema.GROUP_NODE, {"node_rank": "int [Ge(ge=0)]", "ok": "bool = default"}),
}
# Result's fills in its status's action where none is named: it refuses nothing, so the view reads as the model.
VALIDATORS = {Measurement: {"_snake_case", "_label_names"}, GroupRecord: {"_ranks_in_the_group"}, Result: {"_status_action"}}


@pytest.mark.parametrize("model", list(MODELS), ids=[m.__name__ for m in MODELS])
def test_the_view_knows_every_field_of_the_model(model):
    table, picture = MODELS[model]
    assert kind(model) == picture, f"{model.__name__} changed: teach preflight/pipeline/report_schema.py, then update this picture"
    assert list(table) == list(model.model_fields)
    for name, field in model.model_fields.items():
        default = table[name][1]
        if field.is_required():
            assert default is report_schema._REQUIRED, name
        else:
            assert default == field.get_default(call_default_factory=True), name
    d = model.__pydantic_decorators__
    validators = {*d.field_validators, *d.model_validators, *d.validators, *d.root_validators}
    assert validators == VALIDATORS.get(model, set()), f"{model.__name__}'s validators changed: teach preflight/pipeline/report_schema.py"
    assert model.model_config.get("extra", "ignore") in ("ignore", "allow")  # the view ignores unknown keys


def test_the_statuses_verdicts_and_levels_are_the_models():
    from typing import get_args

    assert report_schema.STATUSES == tuple(s.value for s in Status)
    (levels, _none) = get_args(Report.model_fields["level"].annotation)
    assert report_schema.LEVELS == get_args(levels)
    assert set(report_schema.VOUCHING) == {s.value for s in Status if s.ok}
    assert Verdict is report_schema.Verdict
    assert report_schema.ACTIONS == tuple(a.value for a in actions.LADDER)
    assert report_schema.DOMAINS == tuple(d.value for d in actions.Domain)


def test_the_view_reads_times_as_the_model_does():
    for text in ("2026-11-22T05:25:01Z", "2026-11-22T05:25:01.5+05:30", "2026-11-22T05:25:01.123456-08:00", "2026-11-22T05:25:01+00:00"):
        assert report_schema._datetime(text) == Report.model_fields["finished_at"].annotation.fromisoformat(text.replace("Z", "+00:00"))
    assert report_schema._datetime("2026-11-22T05:25:01Z").tzinfo == timezone.utc
    assert report_schema._datetime("2026-11-22T05:25:01.5+05:30") == datetime(2026, 11, 21, 23, 55, 1, 500000, tzinfo=timezone.utc)
