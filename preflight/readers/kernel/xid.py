"""Xid events in a kernel log's text: the event (``XidEvent``), ``parse`` for the Xid, SXid,
fallen-off-the-bus and failed-initialisation lines under any log prefix, and whether a text
or a saved file (`xid --from`, `explain`) is a kernel log at all.

What each event means is readers/kernel/xid_meaning.py; reading the node's own kernel log
(/dev/kmsg, journalctl, dmesg) is readers/kernel/log_sources.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from preflight.readers import capture
from preflight.readers.kernel.xid_meaning import XidInfo, explain
from preflight.base import tooltext
from preflight.base.errors import UsageError

Kind = Literal["xid", "sxid", "fell_off_bus", "init_failed"]
MAX_FILE_BYTES = 64 * 2**20


class XidEvent(BaseModel):
    """One event as the kernel printed it; ``line`` counts from 1."""

    model_config = ConfigDict(frozen=True)
    kind: Kind
    code: int | None  # None for fell_off_bus (treated as Xid 79) and init_failed
    pci: str | None  # "0000:10:1c": lowercase domain:bus:device, no function
    pci_raw: str | None  # as printed: "PCI:0000:01:00 GPU-I:05", "0000:0a:00.0"
    pid: int | None = None
    name: str | None = None  # the process; for an SXid the switch ("nvidia-nvswitch3")
    message: str = ""
    time: str | None = None  # wall clock as printed, in whatever locale printed it
    uptime: float | None = None  # seconds since boot, from "[ 219.470994]" or /dev/kmsg
    line: int
    raw: str
    count: int = 1  # init_failed: failed attempts on this GPU, folded into one event

    @property
    def info(self) -> XidInfo:
        return explain(self.kind, self.code, self.message)


# --- parsing ---------------------------------------------------------------------

# Each event is found by its driver text wherever it sits in the line, so any
# prefix (dmesg, dmesg -T, syslog, journalctl in any locale, /dev/kmsg) works;
# the prefix is only read for the time stamps.
_PCI = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
DRIVER_MARK = re.compile(r"NVRM: |nvidia-nvswitch\d+: SXid")
_XID = re.compile(r"NVRM: Xid \((?P<raw>(?:PCI:)?(?P<pci>" + _PCI + r")[^)]*)\): "
                  r"(?P<code>\d{1,6})\b,?\s*(?P<rest>.*)")
_PID = re.compile(r"pid=(?:'?<unknown>'?|(?P<pid>\d{1,10})\b),?\s*")
_NAME = re.compile(r"name=(?P<name>[^,]*),?\s*")
_SXID = re.compile(r"(?P<dev>nvidia-nvswitch\d+): SXid \((?P<raw>(?:PCI:)?(?P<pci>" + _PCI + r")[^)]*)\): "
                   r"(?P<code>\d{1,6})\b,?\s*(?P<rest>.*)")
_SXID_MORE = re.compile(r"(?:Severity \d|Data \{)")
_FELL = re.compile(r"NVRM: GPU (?:at )?(?P<raw>(?:PCI:)?(?P<pci>" + _PCI + r")):? (?:GPU )?has fallen off the bus")
# The driver logs each failed attempt twice: RM's "RmInitAdapter failed! (codes)"
# and the kernel interface's "rm_init_adapter failed, device minor number N".
_RM_INIT = re.compile(r"NVRM: (?:GPU (?P<raw>(?P<pci>" + _PCI + r")):? )?(?P<msg>RmInitAdapter failed!.*)")
_NV_INIT = re.compile(r"NVRM: (?:GPU (?P<raw>(?P<pci>" + _PCI + r")):? )?(?P<msg>rm_init_adapter failed.*)")

_KMSG = re.compile(r"^\d+,\d+,(?P<usec>\d{1,20}),[^;]*;")  # /dev/kmsg: prio,seq,usec,flags;text
_UPTIME = re.compile(r"\[\s*(?P<sec>\d{1,12}\.\d{1,9})\]")
_CALLER = re.compile(r"\[\s*[TC]\d+\]|^<\d+>")  # printk caller tag "[ T1946]", dmesg -r "<4>"
_CLOCK = re.compile(r"\d:\d\d")


_DMESG_T = re.compile(r"\[[^\]\n]{1,64}\]")
_DMESG_X = re.compile(r"^[a-z]+\s*:\s*[a-z]+\s*:(?:\s|$)")  # `dmesg -x`: "kern  :warn  : "
_EPOCH = re.compile(r"\d{9,11}\.\d{1,9}")  # journalctl -o short-unix: seconds since 1970
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[,.]\d+)?(?:[+-]\d\d:?\d\d|Z)?(?:\s|$)")  # dmesg --time-format=iso
# syslog's and journalctl's "<time> <host> kernel: ": a few words (time, host), none quoted and
# none a label of its own ("tmpfs:"), then "kernel:" as a word.
_SYSLOG = re.compile(r"^(?:<\d+>)?(?:[^\s'\"`]*[^\s:'\"`]\s+){1,6}kernel:(?:\s|$)")


def _only_stamps(prefix: str) -> bool:
    """Whether what precedes the driver's text is a log's own prefix and nothing else: the
    driver's line starts the message. Any user can get text of their own into the kernel
    log (a mount option a filesystem refuses is quoted there), so "NVRM: Xid ... 79" inside
    another message is that message's, never the driver's. (A newline in such text still
    starts a line of its own in dmesg's and syslog's output, as in the kernel's records;
    /dev/kmsg, read first, keeps it inside its record.)

    A prefix of whitespace alone is refused: it is how dmesg and journalctl indent the
    continuation of a message that holds a newline ("tmpfs: Unknown parameter 'y\n
    NVRM: Xid ..."). The driver's own line has a time stamp before it, or starts the line
    with "NVRM:" where printk.time=0."""
    if prefix and not prefix.strip():
        return False
    p = prefix
    if m := _KMSG.match(p):
        p = p[m.end():]
    elif m := _SYSLOG.match(p):
        p = p[m.end():]
    p = _CALLER.sub("", _UPTIME.sub("", p, count=1)).strip()
    # dmesg's own fields, in whichever order its flags print them: `-x --time-format=iso` writes
    # "kern  :warn  : 2024-08-30T11:43:09,123456+00:00 ", facility and level before the stamp.
    for field in (_DMESG_X, _ISO, _DMESG_X):
        if m := field.match(p):
            p = p[m.end():].strip()
    if p.startswith("[") and (m := _DMESG_T.match(p)):
        p = p[m.end():]
    return not p.strip()


def _norm_pci(text: str) -> str:
    *domain, bus, dev = text.split(".")[0].split(":")
    return f"{int(domain[0], 16) if domain else 0:04x}:{bus.lower()}:{dev.lower()}"


def _stamps(prefix: str) -> tuple[str | None, float | None]:
    """(wall time as printed, seconds since boot) from what precedes the driver text."""
    if m := _KMSG.match(prefix):
        return None, int(m["usec"]) / 1e6
    uptime = None
    if m := _UPTIME.search(prefix):
        uptime = float(m["sec"])
        prefix = prefix[: m.start()] + prefix[m.end():]
    prefix = _CALLER.sub("", prefix).strip()
    if m := _DMESG_X.match(prefix):  # dmesg -x: "kern  :warn  : " before the time
        prefix = prefix[m.end():].strip()
    if m := re.match(r"\[(.+?)\]", prefix):  # dmesg -T: "[Fri Aug 30 11:43:09 2024]"
        return m.group(1), uptime
    if "kernel:" in prefix:  # "<time> <host> kernel:"; month names may be in any language
        prefix = prefix[: prefix.rindex("kernel:")].strip()
        parts = prefix.rsplit(None, 1)
        if len(parts) == 2 and not _CLOCK.search(parts[1]):
            prefix = parts[0]  # drop the host name
    return (prefix if _CLOCK.search(prefix) or _EPOCH.fullmatch(prefix) else None), uptime


def parse(text: str) -> list[XidEvent]:
    """Every Xid, SXid, fallen-off-the-bus and failed-initialisation event in ``text``."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    events: list[XidEvent] = []
    init: dict[str | None, dict] = {}  # per GPU: the first line, and attempts counted both ways
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        mark = DRIVER_MARK.search(line)
        if not mark or not _only_stamps(line[: mark.start()]):
            continue
        body = line[mark.start():]
        time_, uptime = _stamps(line[: mark.start()])
        at = {"time": time_, "uptime": uptime, "line": number, "raw": line}
        if m := _XID.match(body):
            rest, pid, name = m["rest"], None, None
            if p := _PID.match(rest):
                pid, rest = (int(p["pid"]) if p["pid"] else None), rest[p.end():]
            if n := _NAME.match(rest):
                name, rest = n["name"].strip(), rest[n.end():]
            name = None if name in (None, "", "<unknown>", "'<unknown>'") else name
            events.append(XidEvent(kind="xid", code=int(m["code"]), pci=_norm_pci(m["pci"]), pci_raw=m["raw"],
                                   pid=pid, name=name, message=rest.strip(), **at))
        elif m := _SXID.match(body):
            if _SXID_MORE.match(m["rest"]):
                continue  # the "Severity ..." and "Data {...}" lines that follow an SXid belong to it
            events.append(XidEvent(kind="sxid", code=int(m["code"]), pci=_norm_pci(m["pci"]), pci_raw=m["raw"],
                                   name=m["dev"], message=m["rest"].strip(), **at))
        elif m := _FELL.match(body):
            events.append(XidEvent(kind="fell_off_bus", code=None, pci=_norm_pci(m["pci"]), pci_raw=m["raw"],
                                   message="GPU has fallen off the bus", **at))
        elif m := (_RM_INIT.match(body) or _NV_INIT.match(body)):
            pci = _norm_pci(m["pci"]) if m["pci"] else None
            gpu = init.setdefault(pci, {**at, "pci_raw": m["raw"], "rm": 0, "nv": 0, "message": m["msg"].strip()})
            if m.re is _RM_INIT:
                if not gpu["rm"]:
                    gpu["message"] = m["msg"].strip()  # RM's line carries the error codes
                gpu["rm"] += 1
            else:
                gpu["nv"] += 1
    for pci, gpu in init.items():
        attempts = max(gpu.pop("rm"), gpu.pop("nv"))
        events.append(XidEvent(kind="init_failed", code=None, pci=pci, count=attempts, **gpu))
    return sorted(events, key=lambda e: e.line)


# A kernel log line, in each form parse() reads: the driver's own text with any
# prefix or none (a pasted excerpt), a /dev/kmsg record, dmesg's uptime stamp
# (also `dmesg -r`'s "<4>", `dmesg -x`'s "kern  :warn  : ", journalctl -o
# short-monotonic), dmesg -T's bracketed clock, and syslog or journalctl's
# "<time> <host> kernel: ". Other daemons' syslog lines are not the kernel's, and
# an NCCL or application log's "[2026-03-18 11:13:09]" is not dmesg -T's stamp.
# dmesg -x's "facility:level:" as util-linux names them (lib/... facility_names, level_names).
_FACILITY_LEVEL = (r"(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|res\d*|local[0-7])\s*:"
                   r"\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:\s")
_KERNEL_LINE = re.compile(
    r"^(?:<\d+>|[a-z]+\s*:\s*[a-z]+\s*:\s)?\[\s*\d+\.\d+\]"  # dmesg
    r"|^\[[^\]\n]{0,40}\d:\d\d:\d\d \d{4}\]"  # dmesg -T: "[Fri Aug 30 11:43:09 2024]", the year last
    # dmesg --time-format=iso, with -x or not: microseconds after a comma and the zone as +hh:mm, as
    # util-linux prints them; an application's ISO stamp ("...09.123Z INFO") is no kernel line.
    r"|^(?:" + _FACILITY_LEVEL + r")?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d "
    r"|^" + _FACILITY_LEVEL + r"\S"  # dmesg -x -t: no time at all
    r"|^[^\n]{0,80}?\d:\d\d(?::\d\d)?\S*\s+(?:\S+\s+)?kernel: "  # syslog, journalctl
    r"|^\d{9,11}\.\d{1,9}\s+\S+\s+kernel: "  # journalctl -o short-unix
)


def kernel_lines(text: str) -> int:
    """How many lines of ``text`` a kernel log holds: none means it is not one."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    return sum(1 for line in text.split("\n") if DRIVER_MARK.search(line) or _KMSG.match(line) or _KERNEL_LINE.match(line))


def has_driver_lines(text: str) -> bool:
    """A kernel log with an NVIDIA driver line anywhere in it (`preflight explain`): NVRM or
    SXid. The whole text: a long journal's Xid may come hours after its boot lines."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    if "NVRM" not in text and "SXid" not in text:
        return False
    return any(DRIVER_MARK.search(line) for line in text.split("\n") if "NVRM" in line or "SXid" in line)


def looks_like(text: str) -> bool:
    """A kernel log at all (dmesg, journalctl, syslog, /dev/kmsg), GPU events or none: a
    log with none is an answer too, not a file of no known kind. Its first 200 lines tell."""
    return kernel_lines("\n".join(text.split("\n")[:200])) > 0


def read_file(path: Path | str) -> str:
    """A saved kernel log for --from; every problem is a one-line UsageError.

    A file with no kernel log line is refused: read as a log with no GPU
    event, the wrong file (or an empty one) would pass for a healthy node."""
    text = capture.read_text(path, MAX_FILE_BYTES, "pass an excerpt (grep -e NVRM -e SXid)")
    why = not_a_kernel_log(text)
    if why:
        raise UsageError(f"--from {path}: {why}")
    return text


def not_a_kernel_log(text: str) -> str | None:
    """Why ``text`` is refused as a kernel log (`xid --from` and `explain` say the same), or None."""
    if kernel_lines(text):
        return None
    what = "is empty: it holds no kernel log lines" if not text.strip() else "holds no kernel log lines (dmesg, journalctl, syslog or /dev/kmsg)"
    return f"{what}; save the node's `dmesg -T` or `journalctl -k -b` to a file and pass that"
