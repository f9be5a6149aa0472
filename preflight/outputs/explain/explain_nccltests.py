"""`preflight explain` of nccl-tests output: "is this number normal?"

The large-size busbw is judged by the bandwidth check's own judge
(checks/bandwidth.py judge_floors) against the profile's floor for the run's
shape: the single-node collective floor where the ranks sit on one node, the
inter-node floor where they span nodes, each only for the GPUs per node it was
measured on (pipeline/shape.py floor_fits: floors are never scaled to another
count). The profile is --profile's, else the one `auto` would pick for the GPU
model the header names. The figure is the best busbw (either column) over the
sizes at or above the profile's collective size, the size its floors are for;
a table that stops short of it is judged only where it already meets the floor.

A non-zero #wrong (or out-of-bounds count) fails; a row far below both its
neighbours warns; NCCL settings visible in the output that hold busbw down are
named where they explain a low figure. A run that failed fails: nccl-tests'
"Test ... failure" lines, the launcher's non-zero exit, or a table that stops
before the header's maxBytes beside an NCCL WARN; the known NCCL errors in the
text are nccl-log's findings. A table that stops short with no error shown warns.
"""

from __future__ import annotations

from preflight.base.units import fmt_bytes, fmt_value
from preflight.checkkit.figures import Figure
from preflight.checkkit import bandwidth_figures
from preflight.checkkit.nccl_settings import judge_env
from preflight.checks import bandwidth
from preflight.outputs.explain.explain_nccl_log import problem_items
from preflight.outputs.explain.explained import Explained, Item, items
from preflight.pipeline import profile_detect, profiles, shape
from preflight.pipeline.profiles import ResolvedProfile
from preflight.readers.nccl import nccl_env, nccltests
from preflight.readers.nccl.nccltests import Row, Table

KIND, TITLE = "nccl-tests", "nccl-tests output"
BPS = "bytes_per_second"
# A row is a dip when its busbw is under this fraction of both neighbours'. busbw grows with
# size until it flattens; NCCL switching algorithm or protocol between sizes moves a row at
# most ~5% under its lower neighbour in the real tables here (tests/fixtures/nccltests 16:
# 0.96), so 30% under both is a stall during that size, not NCCL's tuning.
DIP = 0.7
# Under this the figures are latency-bound and printed with two decimals: rounding, not a dip.
DIP_MIN_GBPS = 1.0
# Settings that pin NCCL's choices and can hold busbw down (besides nccl_env.SWITCHES).
PINS = {
    "NCCL_ALGO": "pins NCCL's algorithm, so it no longer picks the fastest for each size (NVLS, CollNet, Tree or Ring)",
    "NCCL_PROTO": "pins NCCL's protocol: LL and LL128 cap large-message bandwidth",
    "NCCL_NVLS_ENABLE": "0 turns off NVLink SHARP, which carries the all_reduce peak on NVSwitch boards that have it",
    "NCCL_MAX_NCHANNELS": "caps the channels NCCL drives: fewer channels move less",
    "NCCL_MAX_CTAS": "caps the CTAs (channels) NCCL drives: fewer move less",
    "NCCL_NET": "names the network NCCL must use: Socket is TCP",
    "NCCL_NET_GDR_LEVEL": "limits GPUDirect RDMA: traffic between nodes is staged through host memory",
}
COLUMNS = (("out-of-place", "out_of_place"), ("in-place", "in_place"))
WRONG_FIX = "drain the node and run `dcgmi diag -r 3` on it: a collective that returns wrong data is a GPU, NVLink or driver fault"


def _gbps(v: float) -> str:
    return fmt_value(v * 1e9, BPS)


NETWORK_ONLY = ("NCCL_IB_DISABLE", "NCCL_NET", "NCCL_NET_GDR_LEVEL")  # they change nothing within one node


def low_settings(t: Table) -> list[str]:
    """The visible settings that can hold this run's busbw down, each with what it does."""
    found = {name: [(value, "the run's environment")] for name, value in t.settings.items()}
    out = [(name, f"{name}={value} ({cost})") for name, value, _, cost in nccl_env.switches_on(found)]
    for name, cost in PINS.items():
        value = t.settings.get(name)
        if value and not (name == "NCCL_NVLS_ENABLE" and value != "0"):
            out.append((name, f"{name}={value} ({cost})"))
    one_node = (t.nodes or 1) == 1 and not {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"} <= set(n for n, _ in out)
    return [text for name, text in out if not (one_node and name in NETWORK_ONLY)]


def pick_profile(t: Table, given: ResolvedProfile | None) -> tuple[ResolvedProfile | None, str]:
    """The profile to judge with and why: --profile's, else the one the header's GPU model picks."""
    if given is not None:
        return given, f"--profile {given.name}"
    if not t.gpus:
        return None, "the output names no GPU model (no `#  Rank ... device` lines); pass --profile NAME"
    if len(t.gpus) > 1:
        return None, f"the output names several GPU models ({', '.join(t.gpus)}); pass --profile NAME"
    known = {name: profiles.load(path) for name, path in profiles.available(None).items()}
    try:
        name, _ = profile_detect.pick([(t.gpus[0], None)], known)
    except profile_detect.DetectionFailed as e:
        return None, f"{e.cause}; pass --profile NAME"
    why = f"the header's GPU model {t.gpus[0]!r}" + (f": {profile_detect.generic_why()}" if name == profile_detect.GENERIC else f" matched profile {name}")
    return profiles.resolve(known[name], profiles.find(name, None), {}, why), why


def judge_floor(t: Table, p: ResolvedProfile | None, why: str) -> tuple[list[Item], dict]:
    """The large-size busbw against the profile's floor for the run's shape."""
    def unjudged(reason: str, head: str = "no cited floor for this shape") -> tuple[list[Item], dict]:
        lows = low_settings(t)
        cause = reason + (f"; settings visible in the output that lower busbw: {'; '.join(lows)}" if lows else "")
        return [Item(severity="info", summary=f"{head}: peak busbw {_gbps(peak.busbw_gbps)} at {fmt_bytes(peak.size)} not judged", cause=cause,
                     fix="pass --profile NAME for the node's GPU; `preflight calibrate` makes a floor for a shape no profile cites")], {"verdict": "not judged", "reason": reason}

    peak = t.peak()
    if p is None:
        return unjudged(why, "no profile to judge by")
    if not p.has_gpus:
        return unjudged(f"profile {p.name} has no GPU floors")
    if t.collective not in bandwidth_figures.COLLECTIVE:
        return unjudged(f"no profile has a floor for {t.collective or 'an unnamed collective'} (the output does not name it)" if not t.collective
                        else f"no profile has a floor for {t.collective}; floors exist for {', '.join(bandwidth_figures.COLLECTIVE)}")
    if t.ranks is None:
        return unjudged("the rank count is not in the output (no rank lines, and busbw/algbw fits no single count)")
    nodes = t.nodes or 1
    if t.ranks % nodes:
        return unjudged(f"{t.ranks} ranks over {nodes} nodes: not the same GPU count on each node")
    per_node = t.ranks // nodes
    name = bandwidth_figures.COLLECTIVE[t.collective]
    name = bandwidth_figures.INTERNODE[name] if nodes > 1 else name
    floor = p.floors.get(name)
    if floor is None:
        return unjudged(f"profile {p.name} has no {name} floor" + (f" ({why})" if p.name == profile_detect.GENERIC else ""))
    node = shape.NodeShape(gpus=per_node, gpus_from="the output's ranks", fabric="unknown", fabric_from="not in the output")
    # The output does not say how the GPUs are joined: a floor's fabric is taken as the node's, since
    # the profiles cite whole-node floors only for their SXM models' full NVSwitch boards.
    if reason := shape.floor_fits(floor.gpus, None, node, per_node):
        return unjudged(reason)
    at = p.bandwidth.collective_bytes if p.bandwidth else 0
    big = [r for r in t.rows if r.size >= at]
    top = t.peak(big or [r for r in t.rows if r.size == max(x.size for x in t.rows)])
    where = f"{t.ranks} ranks" + (f" on {nodes} nodes" if nodes > 1 else "" if t.nodes else " (taken as one node)")
    fig = Figure(name=name, unit=BPS, value=top.busbw_gbps * 1e9, where=f"{where}, {fmt_bytes(top.size)} {top.column}", bytes=top.size)
    if floor.origin.startswith("profile "):  # "profile /abs/path/h100-sxm.toml": a path on this machine says nothing to the reader
        floor = floor.model_copy(update={"origin": f"profile {p.name}"})
    found = bandwidth.judge_floors([fig], {name: floor}, p.bandwidth.margin if p.bandwidth else 0.05)
    what = bandwidth_figures.WORDS[name]
    judged = {"floor": name, "floor_gbps": floor.value / 1e9, "floor_source": floor.source, "busbw_gbps": top.busbw_gbps, "size": top.size,
              "column": top.column, "profile": p.name, "gpus_per_node": per_node, "nodes": nodes}
    if found and not big:
        return unjudged(f"the table stops at {fmt_bytes(top.size)}, under the {fmt_bytes(at)} profile {p.name}'s floors are for, "
                        f"where busbw is still climbing ({_gbps(top.busbw_gbps)} there, floor {_gbps(floor.value / 1e9)}); rerun with -e {at}")
    lows = low_settings(t)
    hint = f"; settings visible in the output that lower busbw: {'; '.join(lows)}" if lows else ""
    fixes = f"unset {', '.join(s.split('=')[0] for s in lows)} and rerun; " if lows else ""
    if not found:
        summary = f"normal: {what} {_gbps(top.busbw_gbps)} at {fmt_bytes(top.size)} ({top.column}) meets the {_gbps(floor.value / 1e9)} floor for {per_node} GPUs a node"
        return [Item(severity="info", summary=summary, cause=f"floor: {floor.source} ({why})")], {**judged, "verdict": "normal"}
    f = items(found)[0]
    if f.severity == "fail":
        short = 1 - top.busbw_gbps * 1e9 / floor.value
        f.summary = f"{what} below the floor by {short:.0%}: {_gbps(top.busbw_gbps)} at {fmt_bytes(top.size)} ({top.column}), floor {_gbps(floor.value / 1e9)}"
        judged.update(verdict="below the floor", below_by=round(short, 4))
    else:
        judged["verdict"] = "marginal"
    f.cause, f.fix = f"{f.cause}{hint}", f"{fixes}{f.fix}"
    return [f], judged


def judge_wrong(t: Table) -> list[Item]:
    """A non-zero #wrong fails, naming each size and column; a run not validated says so."""
    bad = [(r, label, getattr(r, col).wrong) for r in t.rows for label, col in COLUMNS if getattr(r, col) and getattr(r, col).wrong]
    out = []
    if bad:
        shown = "; ".join(f"{fmt_bytes(r.size)} {r.type} {label}: {n} wrong" for r, label, n in bad[:6]) + (f"; and {len(bad) - 6} more" if len(bad) > 6 else "")
        r, label, n = bad[0]
        out.append(Item(severity="fail", summary=f"wrong results: #wrong {n} at {fmt_bytes(r.size)} ({label})",
                        cause=f"nccl-tests compared the results with the expected values and found wrong elements in {len(bad)} of the table's results: {shown}", fix=WRONG_FIX))
    if t.out_of_bounds and not bad:  # the footer counts the checks that found wrong elements: said above when a row shows them
        out.append(Item(severity="fail", summary=f"Out of bounds values: {t.out_of_bounds}",
                        cause="nccl-tests' footer counts results outside the expected range", fix=WRONG_FIX))
    checked = [getattr(r, col) for r in t.rows for _, col in COLUMNS if getattr(r, col)]
    if t.validation is False or not any(x.wrong is not None or x.error is not None for x in checked):
        out.append(Item(severity="info", summary="results not validated (#wrong N/A: -c 0)",
                        cause="nccl-tests did not check the results, so wrong answers would not show", fix="run once with -c 1 to check them"))
    return out


def stops_short(t: Table) -> bool:
    """The size after the last row still fits under the header's maxBytes: nccl-tests would have run it.
    (A printed size is rounded down to whole elements per rank, a few bytes under the loop's: that
    only makes the next size smaller, so a sweep cut one size short is still seen.)"""
    if t.max_bytes is None or t.last_size is None:
        return False  # rows without the header: an excerpt, whose whole extent is unknown
    nxt = t.last_size + t.step_bytes if t.step_bytes else t.last_size * (t.step_factor or 2)
    return nxt <= t.max_bytes


def judge_end(t: Table) -> list[Item]:
    """A run that failed (nccl-tests' failure line, the launcher's exit, or a WARN where the table stops short)
    fails; a table that stops short with no error shown warns."""
    short = stops_short(t)
    shown = [f for f in t.failed if f.what != "warn"] or (t.failed if short else [])
    end = f"the table ends at {fmt_bytes(t.last_size or 0)} of maxBytes {fmt_bytes(t.max_bytes or 0)}"
    if shown:
        f = shown[0]
        return [Item(severity="fail", summary=f"the run failed: {end if short else f.text}",
                     cause=f"line {f.line}: {f.text}" + (f"; nccl-tests prints a row for each size up to maxBytes, and stopped at line {t.rows[-1].line}" if short else ""),
                     fix="fix the error the output names (the NCCL error findings here say how), then rerun the whole sweep")]
    if short:
        return [Item(severity="warn", summary=f"{end}: the run crashed, hung, or the paste was cut",
                     cause="nccl-tests prints a row for each size from minBytes to maxBytes, and the output shows no error",
                     fix="save the whole output of every rank (stdout and stderr); if the run hung at the next size, rerun it with NCCL_DEBUG=WARN and a timeout")]
    return []


def dips(rows: list[Row]) -> list[tuple[Row, str, float, float, float]]:
    """(row, column, busbw, before, after) for each row under DIP x both neighbours of its run of sizes."""
    out = []
    for label, col in COLUMNS:
        seq: list[Row] = []
        for r in rows + [None]:  # type: ignore[list-item]
            if r is not None and seq and (r.type, r.redop, r.root) == (seq[-1].type, seq[-1].redop, seq[-1].root) and r.size > seq[-1].size:
                seq.append(r)
                continue
            for a, b, c in zip(seq, seq[1:], seq[2:]):
                va, vb, vc = (getattr(x, col).busbw_gbps if getattr(x, col) else None for x in (a, b, c))
                if va is not None and vb is not None and vc is not None and min(va, vc) >= DIP_MIN_GBPS and vb < DIP * min(va, vc):
                    out.append((b, label, vb, va, vc))
            seq = [r] if r is not None else []
    return out


def judge_dips(t: Table) -> list[Item]:
    found = dips(t.rows)
    if not found:
        return []
    r, label, v, a, c = found[0]
    shown = "; ".join(f"{fmt_bytes(r.size)} {lbl}: {_gbps(v)} between {_gbps(a)} and {_gbps(c)}" for r, lbl, v, a, c in found[:6])
    return [Item(severity="warn", summary=f"busbw dips at {fmt_bytes(r.size)} ({label}): {_gbps(v)} between {_gbps(a)} and {_gbps(c)}",
                 cause=f"{len(found)} row column(s) under {DIP:.0%} of both neighbours ({shown}): busbw grows with size until it flattens, "
                       "so one low size is a stall while it ran (another job, a throttled GPU, a network hiccup), not the node's shape",
                 fix=f"run that size alone several times (-b {r.size} -e {r.size} -n 100); if it stays low, look for what shares the GPUs or the network")]


def explain(text: str, source: str, profile: ResolvedProfile | None) -> Explained:
    try:
        t = nccltests.parse(text)
    except nccltests.Unreadable as e:
        raise nccltests.Unreadable(f"{source}: {e}") from None
    p, why = pick_profile(t, profile)
    floor, judged = judge_floor(t, p, why)
    found = judge_end(t) + problem_items(t.problems) + floor + judge_wrong(t) + judge_dips(t)
    switches = {name: [(value, "the run's environment")] for name, value in t.settings.items()}
    found += items(judge_env(switches))
    if t.cut:
        found.append(Item(severity="info", summary=f"{len(t.cut)} row(s) cut or garbled, not read (line {', '.join(map(str, t.cut[:5]))})",
                          cause="a row with fewer or more columns than the table's: the output was cut, or another process's lines ran into it"))
    if t.rows_not_read:
        found.append(Item(severity="info", summary=f"only the first {len(t.rows)} rows were read: {t.rows_not_read} more were not",
                          cause=f"a table has under ~100 sizes per type; past {nccltests.MAX_ROWS} rows the file is many runs, or junk",
                          fix="save each run's output to its own file and explain each"))
    if t.other_runs:
        found.append(Item(severity="info", summary=f"another run begins at line {t.other_runs[0]}: only the first was read",
                          fix="save each run's output to its own file and explain each"))
    facts = t.model_dump(mode="json")
    facts.update(types=t.types, peak_busbw=t.peak().model_dump(), profile=p.name if p else None, profile_from=why, judged=judged)
    return Explained(kind=KIND, title=TITLE, source=source, findings=found, facts=facts)
