"""What `preflight explain FILE` answers about a saved capture, whatever its kind:
the kind it took the file for, the findings (each with a severity, its cause
and fix, and the GPU or rank it concerns) and the facts it read.

Each kind has an explainer, ``outputs/explain_<kind>.py``, with one function
``explain(text, source, profile) -> Explained``; its reader in
``preflight/readers/`` says whether a text ``looks_like`` that kind. The
explainers judge with the checks' own judges where a check judges the same
facts (one judge, two readers), so a capture and a live run agree.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from preflight.base.actions import Next
from preflight.base.findings import Finding, Status

Severity = Literal["fail", "warn", "info"]
_SEVERITY: dict[Status, Severity] = {Status.FAIL: "fail", Status.ERROR: "fail", Status.WARN: "warn"}


class Item(BaseModel):
    """One finding about the capture."""

    severity: Severity
    summary: str
    cause: str | None = None
    fix: str | None = None
    gpu: str | None = None  # "GPU 3", "00000000:18:00.0": the GPU it concerns, as the capture names it
    rank: str | None = None  # "rank 5", "node-2:3": the rank it concerns
    # What automation does about it (base/actions.py), whose fault it is, and where that comes
    # from; None where the explainer names no action of its own.
    action: str | None = None
    domain: str | None = None
    action_source: str | None = None

    @classmethod
    def acting(cls, act: Next | None, **fields: Any) -> Item:
        """An item that carries ``act`` (a finding's own action, where it names one)."""
        if act is None:
            return cls(**fields)
        return cls(**fields, action=str(act.action), domain=str(act.domain), action_source=act.source)


class Explained(BaseModel):
    """The answer for one capture; ``to_json`` is what `--json` prints."""

    kind: str  # the kind's id: "nvidia-smi-q", "dcgmi-diag", "nccl-tests", "pcie-notice", "df", "topology", "kernel-log", "nccl-log"
    title: str  # as a person names it: "nvidia-smi -q", "nccl-tests output"
    source: str  # the file it came from
    findings: list[Item] = Field(default_factory=list)
    facts: dict[str, Any] = Field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(i.severity == "fail" for i in self.findings)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def items(findings: list[Finding], gpu: str | None = None, rank: str | None = None) -> list[Item]:
    """A judge's findings as items; a PASS or SKIP finding is information."""
    return [Item.acting(f.act, severity=_SEVERITY.get(f.status, "info"), summary=f.summary, cause=f.cause, fix=f.remedy, gpu=gpu, rank=rank)
            for f in findings]


def render(e: Explained) -> str:
    """The text `preflight explain` prints: what the file was taken for, then each finding."""
    out = [f"{e.source}: {e.title}"]
    marks = {"fail": "FAIL", "warn": "WARN", "info": "info"}
    for i in sorted(e.findings, key=lambda i: ("fail", "warn", "info").index(i.severity)):
        who = f" [{i.gpu or i.rank}]" if (i.gpu or i.rank) else ""
        out.append(f"  {marks[i.severity]:4}{who} {i.summary}")
        if i.cause:
            out.append(f"        cause: {i.cause}")
        if i.fix:
            out.append(f"        fix:   {i.fix}")
        if i.action:
            out.append(f"        next:  {i.action} [{i.domain}] ({i.action_source})")
    if not e.findings:
        out.append("  nothing wrong found in what the file holds (--json: the facts read, and what could not be judged)")
    return "\n".join(out) + "\n"
