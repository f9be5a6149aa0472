import pytest
from pydantic import ValidationError

import fakes
from preflight.base.findings import Finding, Measurement, Status


def test_measurement_names_must_be_metric_safe():
    Measurement(name="shm_size", unit="bytes", value=1)
    with pytest.raises(ValidationError, match="snake_case"):
        Measurement(name="shm size", unit="bytes", value=1)
    with pytest.raises(ValidationError, match="snake_case"):
        Measurement(name="shm_size", unit="GiB/s", value=1)


def test_conclude_passes_with_no_findings():
    r = fakes.Passing().conclude([], "all good")
    assert (r.status, r.summary, r.cause) == (Status.PASS, "all good", None)


def test_conclude_leads_with_the_worst_finding_and_keeps_every_cause():
    findings = [
        Finding(Status.WARN, "warned", "cause w", "fix w"),
        Finding(Status.FAIL, "failed", "cause f", "fix f"),
        Finding(Status.FAIL, "failed again", "cause g", "fix f"),
    ]
    r = fakes.Passing().conclude(findings, "unused")
    assert r.status is Status.FAIL
    assert r.summary == "failed (+2 more)"
    assert r.cause == "cause f; cause g; cause w"
    assert r.remedy == "fix f; fix w"  # the same remedy once


def test_status_ok_is_what_lets_a_node_take_a_job():
    assert [s for s in Status if s.ok] == [Status.PASS, Status.WARN, Status.SKIP]
