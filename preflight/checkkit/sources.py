"""Which source answered each fact a check needed, and which tool's output
could not be read.

A tool whose output preflight cannot read (nvidia-smi printing a new layout,
lspci missing, journalctl refusing) says nothing about the node: the check
takes the same fact from another source (NVML, sysfs, the kernel) and says so
here, in its details and in one metric per unreadable tool, so a fleet sees a
reader's trouble without a node being failed for it. Only where no source
answers a fact a judge needs does the check WARN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from preflight.base.findings import Measurement


@dataclass
class Sources:
    """Filled while gathering, written into a Result at the end."""

    answered: dict[str, str] = field(default_factory=dict)  # fact -> the source that answered it
    unread: dict[str, str] = field(default_factory=dict)  # tool -> why its output could not be used
    fallback: dict[str, str] = field(default_factory=dict)  # tool -> what answered in its place

    def took(self, fact: str, source: str) -> None:
        self.answered[fact] = source

    def failed(self, tool: str, why: str, instead: str | None = None) -> None:
        """``tool`` (as a person would type it: "nvidia-smi topo -m") could not be
        read, for ``why``; ``instead`` names the sources that answered in its place."""
        self.unread[tool] = why
        if instead:
            self.fallback[tool] = instead

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.answered:
            out["sources"] = dict(self.answered)
        if self.unread:
            out["unread"] = dict(self.unread)
        return out

    def measurements(self) -> list[Measurement]:
        """``preflight_tool_unreadable_count{check=..., tool=..., fallback=...} 1`` per tool."""
        return [Measurement(name="tool_unreadable", unit="count", value=1,
                            labels={"tool": tool, "fallback": self.fallback.get(tool, "none")})
                for tool in sorted(self.unread)]

    def line(self) -> str | None:
        """One line for a person, under the check's summary."""
        if not self.unread:
            return None
        parts = [f"{tool}: {why}" + (f" (read from {self.fallback[tool]} instead)" if tool in self.fallback else "")
                 for tool, why in sorted(self.unread.items())]
        return "unreadable output, not the node's fault: " + "; ".join(parts)


def one_fact(fact: str, answered: str | None, unread: dict[str, str]) -> Sources:
    """A fact read from the first of several sources that could: ``answered`` gave it (None:
    none did), each of ``unread`` (source -> why) could not, and ``answered`` stood in for them."""
    sources = Sources()
    if answered:
        sources.took(fact, answered)
    for tool, why in unread.items():
        sources.failed(tool, why, answered)
    return sources
