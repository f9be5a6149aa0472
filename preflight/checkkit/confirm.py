"""Confirm before FAIL: what every measuring check (bandwidth, train) shares.

A figure beyond its floor (or ceiling) on one reading may be the node, or a
passing load: another process, a clock or power change, a busy neighbour.
Draining a healthy node for it is the false alarm that gets a gate switched
off, so such a figure is measured again, once, in the same run (the worker
launched again with ``--reading 2``), and judged against the same floor:

- beyond it on both readings: FAIL, "confirmed", with both figures; for a figure
  of each GPU, pair or rank, the same one beyond it both times (``_twice``);
- beyond it on one reading only, or by different GPUs on each: WARN, "transient",
  with both figures;
- not measured again (a hard fault in the run, a run across nodes, no time
  left before the check's deadline): the FAIL stays, "not confirmed", with why.

A reading whose figure did not converge (its repeats stopped at a cap with the
95% interval wider than the tolerance) says so wherever it is quoted.

A hard fault (a rank that died or hung, a wrong answer, NaN, no device, a
worker error) is never measured again: the check judges those parts itself
and passes them here as ``hard``. Pure functions, tested on recorded figures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from preflight.base.findings import Finding, Status
from preflight.checkkit.figures import Figure, beyond, unsure_text
from preflight.pipeline.profiles import ResolvedFloor
from preflight.base.units import fmt_value

FAIL, WARN = Status.FAIL, Status.WARN
CONFIRMED, TRANSIENT, UNCONFIRMED = "confirmed", "transient", "not confirmed"
SLACK = 1.25  # the second launch may take this much longer than the first took for the same work


def missed(figs: list[Figure], floors: dict[str, ResolvedFloor]) -> list[str]:
    """The figure names (floor keys) with a figure beyond its floor or ceiling, in order."""
    return list(dict.fromkeys(g.key for g in figs if g.key in floors and beyond(g.value, floors[g.key], 0.0)))


def why_not(hard: Iterable[Finding], group: bool, need: float, left: float) -> str | None:
    """Why a figure beyond its floor is not measured again; None: measure it again."""
    fault = next((f for f in hard if f.status == FAIL), None)
    if fault is not None:
        return f"not measured again: the run had a hard fault ({fault.summary}), which is never retried"
    if group:
        return "not measured again: a run across nodes is measured once (every node would have to launch again together)"
    if need > left:
        return f"no time left to measure again ({left:.0f} s left before the check's deadline, about {need:.0f} s needed)"
    return None


def need_seconds(first_launch: float | None, skipped: float = 0.0) -> float:
    """What a second launch needs: the first one's time, less the work it will not redo."""
    return SLACK * max(0.0, (first_launch or 0.0) - skipped)


@dataclass
class Settled:
    findings: dict[str, list[Finding]] = field(default_factory=dict)  # by figure name (floor key)
    # The figures the verdict rests on: the second reading's for every name measured twice.
    figures: list[Figure] = field(default_factory=list)
    readings: list[dict] = field(default_factory=list)  # per name beyond its floor on a reading: both readings, the verdict
    lines: list[str] = field(default_factory=list)


def settle(first: list[Figure], second: list[Figure] | None, floors: dict[str, ResolvedFloor], judge: Callable[[list[Figure]], list[Finding]],
           words: dict[str, str], rerun: str, why: str | None = None) -> Settled:
    """Judge each figure name on the reading(s) it has. ``judge`` is the check's own
    judge of figures against floors (FAIL beyond, WARN within the margin); ``second``
    is None where nothing was measured again, and ``why`` then says why."""
    out = Settled()
    again = {g.key for g in second or []}
    bad1, bad2 = set(missed(first, floors)), set(missed(second or [], floors))
    for key in dict.fromkeys([g.key for g in first] + [g.key for g in second or []]):
        one, two = _of(first, key), _of(second or [], key)
        out.figures += two if key in again else one
        what, floor = words.get(key, key), floors.get(key)
        if not two or not one:
            found = judge(one or two)
            if key in bad1 | bad2:
                reason = why or f"the {'second' if one else 'first'} reading has no figure for it (see the run's findings)"
                found = [_mark(f, " (not confirmed)", f"; not confirmed: {reason}") for f in found]
                out.readings.append(_reading(key, UNCONFIRMED, one, two or None, reason))
                out.lines.append(f"{what}: {UNCONFIRMED} ({reason}): {_worst_text(one or two, floor)}")
        elif key in bad1 and key in bad2 and _twice(one, two, floor):
            both = f"first reading: {_missed_text(one, floor)}; second reading: {_missed_text(two, floor)}"
            found = [_mark(f, f" (confirmed: {_worst_text(one, floor)}, then {_worst_text(two, floor)})", f"; confirmed by measuring again in the same run: {both}")
                     for f in judge(two)]
            out.readings.append(_reading(key, CONFIRMED, one, two))
            out.lines.append(f"{what}: {CONFIRMED}: first reading {_worst_text(one, floor)}, second {_worst_text(two, floor)}{_bound_text(floor)}")
        elif key in bad1 or key in bad2:
            assert floor is not None  # only names with a floor are missed
            # Missed on one reading only, or on both but never by the same GPU, pair or rank.
            found = [_transient(what, floor, one, two, key in bad1, rerun, elsewhere=key in bad1 and key in bad2)]
            out.readings.append(_reading(key, TRANSIENT, one, two))
            out.lines.append(f"{what}: {TRANSIENT}: first reading {_worst_text(one, floor)}, second {_worst_text(two, floor)}{_bound_text(floor)}")
        else:
            found = judge(two)
        out.findings[key] = found
    return out


def combine(first: dict[str, list[Finding]], second: dict[str, list[Finding]] | None, settled: Settled, soft: Iterable[str],
            part_of: Callable[[str], str]) -> dict[str, list[Finding]]:
    """The check's parts after both readings: the ``soft`` parts (figures against floors)
    from ``settled``; every other part from the first run, plus what the second run
    found that the first did not (a rank that died while measuring again is a fault too)."""
    soft = set(soft)
    out = {name: [] if name in soft else list(found) for name, found in first.items()}
    for name, found in (second or {}).items():
        if name not in soft:
            out.setdefault(name, []).extend(_again(f) for f in found if f not in out.get(name, []))
    for key, found in settled.findings.items():
        out.setdefault(part_of(key), []).extend(found)
    return out


def details(settled: Settled, launches: int, remeasured: list[str], why: str | None) -> dict:
    """What the report keeps of the confirmation: how many launches, what ran again, both readings."""
    return {"launches": launches, "remeasured": remeasured, "why_not": why, "readings": settled.readings}


# ---- words ----------------------------------------------------------------------


def _of(figs: list[Figure], key: str) -> list[Figure]:
    return [g for g in figs if g.key == key]


def _worst(figs: list[Figure], floor: ResolvedFloor | None) -> Figure:
    high = floor.bound == "max" if floor is not None else figs[0].unit == "seconds"
    return (max if high else min)(figs, key=lambda g: g.value)


def _worst_text(figs: list[Figure], floor: ResolvedFloor | None) -> str:
    g = _worst(figs, floor)
    return f"{fmt_value(g.value, g.unit)} on {g.where}{unsure_text(g, short=True)}"


def _missed_text(figs: list[Figure], floor: ResolvedFloor | None) -> str:
    """The figures beyond the floor (at most 4), or the worst one where none is."""
    bad = [g for g in figs if floor is not None and beyond(g.value, floor, 0.0)]
    if not bad:
        return f"every figure within it (the weakest {_worst_text(figs, floor)})"
    bad.sort(key=lambda g: g.value, reverse=floor is not None and floor.bound == "max")
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    return ", ".join(f"{fmt_value(g.value, g.unit)} on {g.where}{unsure_text(g)}" for g in bad[:4]) + more


def _bound_text(floor: ResolvedFloor | None) -> str:
    if floor is None:
        return ""
    return f"; {'ceiling' if floor.bound == 'max' else 'floor'} {fmt_value(floor.value, floor.unit)}"


def _member(g: Figure) -> tuple:
    """Which GPU, pair or rank a figure is of, by its labels; () for a figure of the whole node
    (a collective, a latency, the training step: no gpu or rank label), which is one member
    whichever rank its words name as the slowest."""
    return tuple(sorted(g.labels.items())) if {"gpu", "rank", "UUID"} & g.labels.keys() else ()


def _twice(one: list[Figure], two: list[Figure], floor: ResolvedFloor | None) -> bool:
    """Whether one member missed the floor on both readings. As the node's median judges its
    outliers (checkkit/outliers.py), a FAIL is confirmed by the same GPU, pair or rank: with 8
    host copies or 56 pairs, a passing load that pulls GPU 2 under the floor on the first
    reading and GPU 6 on the second confirms no fault of either. A GPU missing it with two peers
    or more in each reading, whichever they are (a degraded NVLink of GPU 3: 3->1 and 3->2, then
    3->5 and 3->6), is that member; one missed pair, in either direction or both, names neither of
    its GPUs (a load on GPU 2, then on GPU 6, misses 2<->0 and 6<->0: GPU 0 is no fault of its own)."""
    def missing(figs: list[Figure]) -> set[tuple]:
        missed = [g for g in figs if floor is not None and beyond(g.value, floor, 0.0)]
        peers: dict[str, set[str]] = {}
        for g in missed:
            if "gpu" in g.labels and "peer_gpu" in g.labels:
                peers.setdefault(g.labels["gpu"], set()).add(g.labels["peer_gpu"])
                peers.setdefault(g.labels["peer_gpu"], set()).add(g.labels["gpu"])
        return {_member(g) for g in missed} | {(("gpu", gpu),) for gpu, seen in peers.items() if len(seen) >= 2}

    return bool(missing(one) & missing(two))


def _transient(what: str, floor: ResolvedFloor, one: list[Figure], two: list[Figure], first_missed: bool, rerun: str, elsewhere: bool = False) -> Finding:
    bound = "ceiling" if floor.bound == "max" else "floor"
    limit = fmt_value(floor.value, floor.unit)
    bad = _worst(one if first_missed else two, floor)
    # The same GPU, pair or rank on the other reading, where it has a figure there.
    other = next((g for g in (two if first_missed else one) if g.where == bad.where and g.labels == bad.labels), None) or _worst(two if first_missed else one, floor)
    v1, v2 = (bad, other) if first_missed else (other, bad)
    head = f"{what} transient on {bad.where}: {fmt_value(v1.value, v1.unit)}, then {fmt_value(v2.value, v2.unit)} ({bound} {limit})"
    when = ("on both readings in this run, but by no GPU, pair or rank on both" if elsewhere
            else f"on the {'first' if first_missed else 'second'} of two readings in this run only")
    cause = (f"{what} was {'over' if floor.bound == 'max' else 'under'} the {limit} {bound} ({floor.source}; {floor.origin}) {when}: "
             f"first reading: {_missed_text(one, floor)}; second reading: {_missed_text(two, floor)}")
    remedy = (f"a figure that misses its {bound} once and clears it when measured again points to a passing load (another process, "
              f"a clock or power change) more than to the node: watch it, and drain the node if it recurs (`{rerun}`)")
    return Finding(WARN, head, cause, remedy)


def _mark(f: Finding, summary: str, cause: str) -> Finding:
    """A FAIL of a figure against its floor, saying whether a second reading confirmed it."""
    return replace(f, summary=f.summary + summary, cause=f.cause + cause) if f.status == FAIL else f


def _again(f: Finding) -> Finding:
    return replace(f, summary=f"measuring again: {f.summary}", cause=f"on the second reading: {f.cause}")


def _reading(key: str, verdict: str, one: list[Figure], two: list[Figure] | None, why: str | None = None) -> dict:
    return {"name": key, "verdict": verdict, "first": [g.model_dump(mode="json") for g in one],
            "second": [g.model_dump(mode="json") for g in two] if two is not None else None, "why": why}
