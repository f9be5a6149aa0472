"""`preflight explain` of `df` output: /dev/shm's size, judged by the shm check's
own judge (checkkit/shm_judges.py judge_space, and judge_mount where `df -T` printed the
filesystem type) against the profile's shm_min_bytes floor.

Without --profile the floor is the least one, profile cpu's: the smallest a
built-in profile sets (NGC's --shm-size=1g). A GPU profile sets more (16 GiB
on the 8-GPU SKUs), and a df capture does not say which GPU the node has, so
the answer says which floor it used and --profile gives the SKU's.
"""

from __future__ import annotations

from preflight.base.errors import UsageError
from preflight.base.units import fmt_bytes
from preflight.checkkit import shm_judges
from preflight.outputs.explain.explained import Explained, Item, items
from preflight.pipeline import profiles
from preflight.pipeline.profiles import ResolvedProfile
from preflight.readers import df
from preflight.readers.df import DfOutput, Row
from preflight.readers.system.shm_mount import Mount

KIND, TITLE = "df", "df output"
FLOOR = "shm_min_bytes"
LEAST = "cpu"  # the profile whose floor holds where no profile is named: the smallest any built-in sets
NO_ROW = "the df output has no /dev/shm row; run `df -h /dev/shm`"
NOT_DF = "holds no df output (no `Filesystem ... Mounted on` header); run `df -h /dev/shm`"


def floor_of(profile: ResolvedProfile | None) -> tuple[float, dict]:
    """The floor in bytes, and facts saying where it came from."""
    if profile is not None and FLOOR in profile.floors:
        f = profile.floors[FLOOR]
        return f.value, {"floor_profile": profile.name, "floor_from": f"profile {profile.name} ({f.origin})", "floor_source": f.source}
    why = "no --profile given" if profile is None else f"profile {profile.name} sets no {FLOOR}"
    least = profiles.load(profiles.find(LEAST, None)).floors[FLOOR]
    return least.value, {
        "floor_profile": LEAST,
        "floor_from": f"{why}: the least floor, profile {LEAST}'s, the smallest a built-in profile sets; "
                      "a GPU profile sets more (pass --profile for the node's GPU)",
        "floor_source": least.source,
    }


def shm_facts(row: Row) -> shm_judges.ShmFacts:
    """The row as the shm check's facts. df prints a tmpfs mounted with size=0 (no limit) as size 0,
    Use% "-", as statvfs reports 0 blocks: no size, as the check reads it."""
    unlimited = row.size_bytes == 0 and row.use_percent is None
    mount = Mount(mount_point=row.mounted_on, fstype=row.type, source=row.filesystem, options=[]) if row.type else None
    return shm_judges.ShmFacts(path=row.mounted_on, exists=True, mount=mount,
                        size_bytes=None if unlimited else row.size_bytes, free_bytes=None if unlimited else row.avail_bytes)


def _step(text: str) -> float:
    """How far `df -h` may have rounded a printed size up: one unit of its last digit ("16G": 1 GiB, "9.5G": 0.1 GiB)."""
    if not text[-1:].isalpha():
        return 0.0
    unit = 1024 ** ("KMGTPEZY".index(text[-1].upper()) + 1)
    return unit / 10 if "." in text or "," in text else unit


def rounding(out: DfOutput, row: Row, floor: float) -> list[Item]:
    """An item where df -h's rounding up could hide a size just under the floor."""
    if not out.human or row.size_bytes is None or out.layout == "human-si":
        return []
    step = _step(row.size_text)
    if not step or not row.size_bytes >= floor > row.size_bytes - step:
        return []
    return [Item(severity="info", summary=f"{row.mounted_on} prints as {row.size_text}: df -h rounds up, so it may be just under the "
                                          f"{fmt_bytes(floor)} floor",
                 cause=f"df -h prints sizes rounded up to the unit shown: {row.size_text} is more than {fmt_bytes(row.size_bytes - step)} "
                       f"and at most {fmt_bytes(row.size_bytes)}",
                 fix=f"run `df -B1 {row.mounted_on}` for the exact size")]


def explain(text: str, source: str, profile: ResolvedProfile | None) -> Explained:
    out = df.parse(text)
    row = out.shm()
    if row is None:
        raise UsageError(f"{source}: {NO_ROW if out.rows or df.looks_like(text) else NOT_DF}")
    floor, said = floor_of(profile)
    facts = shm_facts(row)
    found = shm_judges.judge_mount(facts) if facts.mount else []
    space, _ = shm_judges.judge_space(facts, floor)
    findings = items(found + space) + rounding(out, row, floor)
    size = f"{fmt_bytes(facts.size_bytes)}" if facts.size_bytes is not None else "not limited (size=0)"
    free = f", {fmt_bytes(facts.free_bytes)} free" if facts.free_bytes is not None else ""
    fs = f"{row.type} " if row.type else ""
    findings.append(Item(severity="info", summary=f"{row.mounted_on}: {size}{free} ({fs}{row.filesystem}); the floor is {fmt_bytes(floor)}",
                         cause=f"floor from {said['floor_from']}; source: {said['floor_source']}"))
    return Explained(kind=KIND, title=TITLE, source=source, findings=findings, facts={
        "layout": out.layout,
        "shm": row.model_dump(mode="json"),
        "filesystem_type": row.type or "not printed (`df -hT /dev/shm` prints it)",
        "floor_bytes": floor,
        **said,
        "rows": [r.model_dump(mode="json") for r in out.rows],
    })
