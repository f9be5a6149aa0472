"""What `preflight xid` prints: each NVIDIA Xid/SXid event of a kernel log, what it
means and what to do, as text or one JSON document."""

from __future__ import annotations

import json

from preflight.readers.kernel.xid import XidEvent


def rows(events: list[XidEvent]) -> list[dict]:
    """Each event with its meaning, severity and action, as JSON reads it."""
    return [{**e.model_dump(mode="json"), **e.info.model_dump(mode="json")} for e in events]


def fatal(found: list[dict]) -> bool:
    return any(r["severity"] == "fatal" for r in found)


def to_json(found: list[dict], source: str) -> str:
    return json.dumps({"source": source, "events": found}, indent=2) + "\n"


def describe(found: list[dict], source: str) -> str:
    out = [f"{len(found)} NVIDIA GPU event(s) in {source}"]
    for r in found:
        label = {"xid": f"Xid {r['code']}", "sxid": f"SXid {r['code']}"}.get(r["kind"], r["kind"])
        when = r["time"] or (f"{r['uptime']:.0f} s after boot" if r["uptime"] is not None else "time unknown")
        out.append(f"{r['severity'].upper():5}  {label:9}  {r['pci'] or '?':12}  {when}\n       {r['meaning']}\n       action: {r['action']}"
                   f"\n       next:   {r['act']['action']} [{r['act']['domain']}] ({r['act']['source']})")
    return "\n".join(out) + "\n"
