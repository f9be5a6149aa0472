"""The text and JSON of `preflight nccl-log`: what an NCCL log says (the
facts, the transport of every rank pair, NCCL's warnings collapsed, each known
problem with its cause and fix), for a person and for machines.
"""

from __future__ import annotations

import re

from preflight.readers.nccl.nccl_log import NcclLog, Warn

_ENV_NOTES = {  # settings that take a fast path away
    ("NCCL_P2P_DISABLE", "1"): "GPU peer-to-peer over NVLink/PCIe off",
    ("NCCL_SHM_DISABLE", "1"): "shared-memory transport off",
    ("NCCL_IB_DISABLE", "1"): "InfiniBand/RoCE off: inter-node traffic over TCP",
    ("NCCL_NVLS_ENABLE", "0"): "NVLink SHARP off",
}
MAX_ROWS = 64


def _peer_rows(log: NcclLog) -> list[dict]:
    chans: dict[tuple[int, int], set[int]] = {}
    for c in log.channels:
        chans.setdefault((c.src_rank, c.dst_rank), set()).add(c.channel)
    return [{"src": s, "dst": d, "transports": t, "channels": len(chans[(s, d)])}
            for (s, d), t in sorted(log.peers().items())]


def _collapsed(warnings: list[Warn]) -> list[tuple[Warn, int]]:
    """Identical WARNs once, with their count; segment names (nccl-XXXXXX) do not count as a difference."""
    groups: dict[tuple[str | None, str], list] = {}
    for w in warnings:
        key = (w.where, re.sub(r"/dev/shm/nccl-\w+", "/dev/shm/nccl-*", w.message))
        groups.setdefault(key, [w, 0])[1] += 1
    return [(w, n) for w, n in groups.values()]


def render(log: NcclLog, source: str) -> str:
    """The text of `preflight nccl-log`."""
    out = [f"{source}: {log.lines} lines, {log.nccl_lines} from NCCL"]
    if not log.nccl_lines:
        out.append("no NCCL debug output here (the job's NCCL_DEBUG=INFO log gives version, network and transports)")
    else:
        out += _facts(log)
    groups = _collapsed(log.warnings)
    if groups:
        out.append(f"warnings      {len(log.warnings)} NCCL WARN line(s), {len(groups)} distinct")
    elif log.nccl_lines:
        out.append("warnings      no NCCL WARN lines")
    for w, n in groups[:20]:
        where = f"{w.where}: " if w.where else ""
        out.append(f"  line {w.line}: {where}{w.message}" + (f"  (x{n})" if n > 1 else ""))
    if len(groups) > 20:
        out.append(f"  ... {len(groups) - 20} more (--json lists all)")
    if not log.problems:
        out.append("problems      none of the known NCCL errors")
    elif len(log.problems) > 1:
        out.append(f"problems      {len(log.problems)}, in the order they appear: the first is usually the cause")
    for p in log.problems:
        seen = f", {p.count} lines" if p.count > 1 else ""
        out.append(f"{'PROBLEM' if p.severity == 'fail' else 'WARNING'} {p.category}: {p.title} (line {p.line}{seen})")
        out.append(f"  {p.text}")
        out.append(f"  cause: {p.cause}")
        out.append(f"  fix: {p.fix}")
    return "\n".join(out) + "\n"


def _facts(log: NcclLog) -> list[str]:
    out = []
    if len(log.versions) > 1:
        out.append(f"NCCL version  {', '.join(log.versions)}: more than one NCCL in one job; ranks must run the same one")
    else:
        out.append(f"NCCL version  {log.version or 'not in the log'}")
    nets = ", ".join(log.networks) or "not in the log"
    out.append(f"network       {nets} (IB devices: {', '.join(log.ib_devices) or 'none listed'}; "
               f"socket interfaces: {', '.join(log.socket_interfaces) or 'none listed'})")
    if log.nranks:
        out.append(f"ranks         {log.nranks}" + (f" on {log.nnodes} node(s)" if log.nnodes else ""))
    if log.nvls is not None:
        out.append(f"NVLS          {'available' if log.nvls else 'not available'}")
    for i, (k, v) in enumerate(sorted(log.env.items())):
        note = _ENV_NOTES.get((k, v))
        out.append(f"{'environment' if i == 0 else '':<13} {k}={v}" + (f"  ({note})" if note else ""))
    rows = _peer_rows(log)
    if rows:
        out.append("transports    src -> dst  channels  via")
        for r in rows[:MAX_ROWS]:
            out.append(f"              {r['src']:>3} -> {r['dst']:<4} {r['channels']:>8}  {', '.join(r['transports'])}")
        if len(rows) > MAX_ROWS:
            out.append(f"              ... {len(rows) - MAX_ROWS} more pairs (--json lists all)")
    else:
        out.append("transports    no channel lines (NCCL prints them with NCCL_DEBUG=INFO when a communicator connects)")
    if log.skipped:
        out.append(f"              {len(log.skipped)} channel line(s) cut or garbled by the source and ignored "
                   f"(line {', '.join(map(str, log.skipped[:8]))}{' ...' if len(log.skipped) > 8 else ''})")
    return out


def to_json(log: NcclLog, source: str) -> dict:
    """What `preflight nccl-log --json` prints: the facts, the peer table, no per-channel list."""
    data = log.model_dump(mode="json", exclude={"channels"})
    return {"source": source, **data, "channel_lines": len(log.channels), "peers": _peer_rows(log)}
