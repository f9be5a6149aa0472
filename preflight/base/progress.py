"""Progress a person can watch: what the running check is doing, as data.

``Progress`` is the Context's: the runner says which check runs, a check or
the launcher (from its workers' reports, ``stage_of``) says what it does now.
The console reads it from a thread of its own and draws ``line``: a live line
on a terminal, a plain line at most every ``PLAIN_EVERY`` seconds in a log
(``RateLimit``). Standard library only: the launcher and Context import it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from preflight.base.units import fmt_bytes

# In logs and pipes, a stage change is written at most once per this many seconds.
# journald and CI logs keep every line: 5 s keeps a two-minute 8-GPU bandwidth
# run to a couple of dozen lines, and a person reading the log still sees within
# seconds that a check is moving (a hang is called only at the check's deadline,
# minutes away).
PLAIN_EVERY = 5.0
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class Progress:
    """What the running check is doing, for the console's live line.

    The runner says which check runs and since when; a check (``stage``) or the
    launcher while it waits on workers (``follow``: read the ranks' reports only
    when asked) says what it is doing. The console asks from its own thread
    (``now``), so nothing here costs the check anything while nobody watches."""

    def __init__(self, on_end: Callable[[], None] | None = None):
        self._lock = threading.Lock()
        self._check: str | None = None
        self._since = 0.0
        self._stage: str | None = None
        self._source: Callable[[], str | None] | None = None
        self._on_end = on_end  # the console takes its live line down before anything else is printed

    def begin(self, check: str) -> None:
        with self._lock:
            self._check, self._since, self._stage, self._source = check, time.monotonic(), None, None

    def end(self) -> None:
        with self._lock:
            self._check, self._stage, self._source = None, None, None
        if self._on_end:
            self._on_end()

    def stage(self, text: str | None) -> None:
        """What the check does now, in a few words ("reading sysfs")."""
        with self._lock:
            self._stage = text

    def follow(self, source: Callable[[], str | None]) -> None:
        """Take the stage from ``source`` while it is followed (a started worker's ranks)."""
        with self._lock:
            self._source = source

    def unfollow(self, source: Callable[[], str | None]) -> None:
        # Only this source: a check the runner abandoned at its deadline must not
        # clear the stage of the check that runs after it.
        with self._lock:
            if self._source == source:
                self._source = None

    def now(self) -> tuple[str | None, str | None, float]:
        """(check, stage, seconds since it started); check is None between checks."""
        with self._lock:
            check, since, stage, source = self._check, self._since, self._stage, self._source
        if check is not None and source is not None:
            try:
                stage = source() or stage
            except Exception:  # noqa: BLE001 - a report being rewritten, a directory gone: the line keeps its last stage
                pass
        return check, stage, time.monotonic() - since if check is not None else 0.0


# Stages every rank worker shares (checks/workers/_rank.py, train_probe.py), in words; a
# worker's own steps ("all_reduce", "memcpy", "warmup") are shown by their names.
STAGE_WORDS = {"import": "importing torch", "init": "starting the process group", "build": "building the model", "done": "finishing"}
# A plain worker's (cuda_init.py): its init is CUDA's.
PLAIN_WORDS = {**STAGE_WORDS, "init": "initialising CUDA", "devices": "testing each CUDA device", "load": "copying to every GPU"}


def stage_of(reports: Sequence[Any], nproc: int | None) -> str:
    """What a started worker is doing, from what its ranks (None: one plain process)
    wrote so far: "starting 8 ranks", "all_reduce 1 GiB  8 ranks", "memcpy 64 MiB  rank 1/2"
    (the rank measuring alone while the others wait), "latency  rank 3/8 failed".
    A report missing or damaged reads as not written yet."""
    got = [r for r in reports if isinstance(r, dict)]
    if not got:
        return f"starting {nproc} ranks" if nproc else "starting"
    if nproc is None:
        return _doing(got[0], PLAIN_WORDS) + (" failed" if got[0].get("error") else "")
    world = max((r["world_size"] for r in got if isinstance(r.get("world_size"), int)), default=nproc)

    def who(r: dict) -> str:
        return f"rank {r['rank']}/{world}" if isinstance(r.get("rank"), int) else "a rank"

    failed = next((r for r in got if r.get("error")), None)
    if failed is not None:
        return f"{_doing(failed)}  {who(failed)} failed"
    alone = next((r for r in got if isinstance(r.get("doing"), dict) and r["doing"].get("alone")), None)
    if alone is not None:
        text = f"{_doing(alone)}  {who(alone)}"
    else:
        # Ranks step through a collective together; one may be a moment ahead: say what most do.
        words = [_doing(r) for r in got]
        text = f"{max(words, key=words.count)}  {world} ranks"
    if any(isinstance(r.get("reading"), int) and r["reading"] > 1 for r in got):
        text += "  measuring again to confirm"
    return text


def _doing(r: dict, words: dict[str, str] = STAGE_WORDS) -> str:
    """One report's stage in words, with what its worker said about it ("doing": bytes, peer)."""
    stage = str(r.get("stage") or "starting")
    if stage == "devices" and isinstance(r.get("current"), int) and isinstance(r.get("device_count"), int):
        return f"testing CUDA device {r['current']} of {r['device_count']}"
    text = words.get(stage, stage)
    doing = r.get("doing") if isinstance(r.get("doing"), dict) else {}
    if isinstance(doing.get("bytes"), (int, float)) and doing["bytes"] > 0:
        text += " " + fmt_bytes(doing["bytes"])
    if isinstance(doing.get("peer"), int):
        text += (f" cuda:{doing['src']}" if isinstance(doing.get("src"), int) else "") + f" to cuda:{doing['peer']}"
    return text


def line(check: str, stage: str | None, elapsed: float, width: int | None = None) -> str:
    """The running check, what it does now and for how long:
    "bandwidth  all_reduce 1 GiB  8 ranks  12.4 s". Within ``width`` characters,
    the stage cut short first (a line that wraps cannot be redrawn in place)."""
    clock = f"{elapsed:.1f} s"
    stage = _CONTROL.sub(" ", stage) if stage else None  # one line, whatever a plugin or a report said
    text = "  ".join(p for p in (check, stage, clock) if p)
    if width is None or len(text) <= width:
        return text
    room = width - len(check) - len(clock) - 4  # two separators
    if stage and room >= 4:
        return f"{check}  {stage[: room - 3]}...  {clock}"
    return f"{check}  {clock}"[:width]


class RateLimit:
    """Which stage changes a log gets: the first at once; after that the stage
    of the moment, once it differs from the last one written and ``every``
    seconds have passed since. A stage that came and went in between is not
    written: the log shows where the check is, not every step it took."""

    def __init__(self, every: float | None = None):
        self.every = PLAIN_EVERY if every is None else every
        self._last: str | None = None
        self._at: float | None = None

    def take(self, stage: str | None, now: float) -> bool:
        if self._at is not None and (stage == self._last or now - self._at < self.every):
            return False
        self._last, self._at = stage, now
        return True
