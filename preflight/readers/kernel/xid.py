"""NVIDIA Xid / SXid events in the kernel log since boot, and what each one means.

Meanings, severities and actions follow NVIDIA's Xid catalog, its "Description"
and "Resolution Bucket (Immediate Action)" columns:
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
(retrieved 2026-11-22). Each event carries its code's catalog buckets and the action
they ask on preflight's ladder (``XidInfo.act``, readers/kernel/xid_catalog.py). The bucket decides the severity: RESET_GPU,
RESTART_BM, RESTART_VM, CHECK_MECHANICALS, CONTACT_SUPPORT and the WORKFLOW_XID_48 /
NVLINK workflows are "fatal" (the node must not take a job); RESTART_APP, IGNORE
and WORKFLOW_XID_45 are "app" (a warning). Two deliberate departures: Xid 63
(catalog: IGNORE) is fatal because the driver's own line says "reset gpu to
activate" and a gate should not hand out a GPU with a pending remap; Xid 154
and 144-150 are judged from the text they print. SXid lines print "Fatal" or
"Non-fatal" themselves (NVIDIA Fabric Manager user guide, SXid tables).
"""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, field_serializer

from preflight.base.actions import Action, Domain, Next
from preflight.readers import capture
from preflight.readers.kernel import journal, xid_catalog
from preflight.base import tooltext
from preflight.base.errors import UsageError

if TYPE_CHECKING:
    from preflight.base.host import Host

Kind = Literal["xid", "sxid", "fell_off_bus", "init_failed"]
Severity = Literal["fatal", "app", "info"]
CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
MAX_FILE_BYTES = 64 * 2**20


class XidInfo(BaseModel):
    model_config = ConfigDict(frozen=True)
    meaning: str
    severity: Severity
    action: str  # what to do, for a person
    # The catalog's "Resolution Bucket (Immediate Action)" and "(Investigatory Action)": "unknown"
    # where it names none, None for an event that is no Xid (an SXid, a failed initialisation).
    bucket: str | None = None
    investigate: str | None = None
    act: Next  # what automation does, whose fault it is, and where that comes from

    @field_serializer("act")
    def _act(self, n: Next) -> dict[str, str]:
        """By name, as the report says an action (a NamedTuple would dump as a bare list)."""
        return {"action": n.action.value, "domain": n.domain.value, "source": n.source}


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


# --- what each code means ------------------------------------------------------

RESET = ("reset the GPU (nvidia-smi -r) before the next job; reboot the node if the reset fails, "
         "and drain it for hardware inspection (RMA) if the error comes back")
REBOOT = "reboot the node (power cycle it); drain it for hardware inspection (RMA) if the error comes back"
RMA = "drain the node for hardware inspection (RMA)"
APP = "restart the application; if a known-good application hits it again, treat the GPU as suspect"
FOLLOW = "a consequence of another error: act on the Xid logged just before it"

_TABLE: dict[int, tuple[str, Severity, str]] = {
    8: ("GPU stopped processing", "app", APP),
    11: ("invalid or corrupted push buffer stream", "app", APP),
    13: ("graphics engine exception", "app", APP),
    31: ("GPU memory page fault (MMU fault)", "app", APP),
    32: ("invalid or corrupted push buffer stream", "app", APP),
    43: ("GPU stopped processing (reset channel verification error)", "app", FOLLOW),
    45: ("preemptive cleanup, due to previous errors", "app", FOLLOW),
    46: ("GPU stopped processing (timeout)", "fatal", RESET),
    48: ("double-bit ECC error (DBE)", "fatal", RESET + "; check the SRAM DBE threshold (nvidia-smi -q -d ECC)"),
    54: ("auxiliary power is not connected to the GPU board", "fatal", RMA + ": check its power connectors"),
    62: ("internal micro-controller halt", "fatal", RESET),
    63: ("GPU memory row remapping / page retirement pending: active only after a GPU reset", "fatal", RESET),
    64: ("GPU memory remapping or page retirement failed", "fatal", RMA + ": failing memory could not be retired"),
    69: ("graphics engine class error", "app", APP),
    74: ("NVLink error", "fatal", RESET + "; nvidia-smi nvlink -e shows the link errors"),
    79: ("GPU has fallen off the bus", "fatal", REBOOT),
    92: ("high single-bit ECC error rate (a precursor of double-bit errors)", "app",
         "keep running; drain for hardware inspection (RMA) if double-bit errors follow"),
    94: ("contained memory error: only the application that hit it was stopped", "app", APP),
    95: ("uncontained memory error", "fatal", RESET),
    109: ("context switch timeout", "fatal", RESET),
    110: ("security fault", "fatal", RESET),
    119: ("GSP RPC timeout", "fatal", RESET + "; if many nodes see it after a driver change, suspect the driver"),
    120: ("GSP error", "fatal", RESET + "; if many nodes see it after a driver change, suspect the driver"),
    121: ("C2C (chip-to-chip) link error", "app", "watch for repeats; drain for hardware inspection if they continue"),
    136: ("NVLink link training failed", "fatal", RESET),
    137: ("NVLink privilege error (an illegal peer-to-peer access by an application)", "app", APP),
    140: ("unrecovered ECC error", "fatal", RESET),
    143: ("GPU initialization error", "fatal", RESET),
    151: ("key rotation error (confidential computing)", "fatal", REBOOT),
    155: ("NVLink software-defined error", "fatal", RESET),
    156: ("resource retirement event", "fatal", RESET),
    157: ("resource retirement failure: no spare resources left", "app", RMA + " when convenient"),
    158: ("GPU fatal timeout", "fatal", RESET),
}
for _code, _unit in zip(range(144, 151), ("SAW", "RLW", "TLW", "TREX", "NVLPW_CTRL", "NETIR", "MSE")):
    _TABLE[_code] = (f"NVLink 5 {_unit} error", "fatal", RESET)

_RECOVERY = re.compile(r"to 0x[0-9a-f]+ \(([^)]*)\)", re.IGNORECASE)  # Xid 154's target action
_NONFATAL = re.compile(r"\bnon-?fatal\b", re.IGNORECASE)


def explain(kind: str, code: int | None, message: str = "") -> XidInfo:
    """Meaning, severity, action and catalog buckets of one event; never raises."""
    if kind == "fell_off_bus":
        kind, code = "xid", 79
    if kind == "init_failed":
        return XidInfo(meaning="the GPU failed to initialise (RmInitAdapter failed)", severity="fatal", action=REBOOT,
                       act=Next(Action.REBOOT, Domain.NODE, "the driver could not initialise the GPU (RmInitAdapter "
                                "failed), which no reset of a GPU it never attached can clear: reboot"))
    if kind == "sxid":
        return _sxid(code, message)
    bucket, investigate = xid_catalog.buckets(code)
    if code == 154:  # "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
        target = (m.group(1) if (m := _RECOVERY.search(message)) else "").lower()
        meaning = f"the driver asks for a recovery action: {target or 'not printed'}"
        if target == "none":
            severity, action = "info", "nothing: the recovery is complete"
        elif target == "drain p2p":
            severity, action = "app", "let peer-to-peer work drain, then reset the GPU"
        else:
            severity, action = "fatal", REBOOT if "reboot" in target else RESET
        return XidInfo(meaning=meaning, severity=severity, action=action, bucket=bucket, investigate=investigate,
                       act=xid_catalog.act(code, bucket, severity, message, target))
    if code is None or code not in _TABLE:
        # A gate warns on what it cannot explain, rather than letting it pass unseen.
        return XidInfo(meaning=f"unknown Xid {code}: look it up in NVIDIA's Xid catalog ({CATALOG})",
                       severity="app", action="look the code up before the next job", bucket=bucket,
                       investigate=investigate, act=xid_catalog.act(code, bucket, "app", message))
    meaning, severity, action = _TABLE[code]
    if 144 <= code <= 150 and _NONFATAL.search(message):  # "145, RLW_REMAP Nonfatal XC0 i0 Link 02"
        severity, action = "app", "watch for repeats on the same link (nvidia-smi nvlink -e)"
    return XidInfo(meaning=meaning, severity=severity, action=action, bucket=bucket, investigate=investigate,
                   act=xid_catalog.act(code, bucket, severity, message))


_FM_GUIDE = "NVIDIA Fabric Manager user guide, SXid tables"


def _sxid(code: int | None, message: str) -> XidInfo:
    """An NVSwitch SXid: not in the Xid catalog; the line says itself whether it is fatal."""
    if _NONFATAL.search(message):
        return XidInfo(meaning=f"NVSwitch SXid {code}, non-fatal: the switch recovered", severity="app",
                       action="watch for repeats on the same link (nvidia-smi nvlink -e)",
                       act=Next(Action.WATCH, Domain.NODE, f"{_FM_GUIDE}: SXid {code} printed Non-fatal, the switch recovered"))
    if re.match(r"\s*Fatal\b", message):
        return XidInfo(meaning=f"NVSwitch SXid {code}, fatal", severity="fatal",
                       action="reboot the node (it resets the NVSwitches and GPUs); " + RMA + " if it comes back",
                       act=Next(Action.REBOOT, Domain.NODE, f"{_FM_GUIDE}: SXid {code} printed Fatal; a reboot resets the NVSwitches and GPUs"))
    return XidInfo(meaning=f"NVSwitch SXid {code} (fatal or not is not printed): look it up in the "
                   "SXid tables of NVIDIA's Fabric Manager user guide", severity="app",
                   action="look up the SXid before the next job",
                   act=Next(Action.WATCH, Domain.NODE, f"{_FM_GUIDE}: SXid {code} printed neither Fatal nor Non-fatal: watched until looked up"))


# --- parsing ---------------------------------------------------------------------

# Each event is found by its driver text wherever it sits in the line, so any
# prefix (dmesg, dmesg -T, syslog, journalctl in any locale, /dev/kmsg) works;
# the prefix is only read for the time stamps.
_PCI = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_MARK = re.compile(r"NVRM: |nvidia-nvswitch\d+: SXid")
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
    if m := _ISO.match(p):
        p = p[m.end():].strip()
    if m := _DMESG_X.match(p):
        p = p[m.end():]
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
    if m := re.match(r"\[(.+?)\]", prefix):  # dmesg -T: "[Fri Aug 30 11:43:09 2024]"
        return m.group(1), uptime
    if "kernel:" in prefix:  # "<time> <host> kernel:"; month names may be in any language
        prefix = prefix[: prefix.rindex("kernel:")].strip()
        parts = prefix.rsplit(None, 1)
        if len(parts) == 2 and not _CLOCK.search(parts[1]):
            prefix = parts[0]  # drop the host name
    return (prefix if _CLOCK.search(prefix) else None), uptime


def parse(text: str) -> list[XidEvent]:
    """Every Xid, SXid, fallen-off-the-bus and failed-initialisation event in ``text``."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    events: list[XidEvent] = []
    init: dict[str | None, dict] = {}  # per GPU: the first line, and attempts counted both ways
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        mark = _MARK.search(line)
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


# --- reading -----------------------------------------------------------------------

class KernelLogUnavailable(Exception):
    """No source of the kernel log could be read; ``cause`` says why, per source."""

    def __init__(self, cause: str, unread: dict[str, str] | None = None):
        super().__init__(cause)
        self.cause = cause
        self.unread = unread or {}  # each source, and why it gave nothing a reader could use


JOURNALCTL = journal.JOURNALCTL
DMESG = ("dmesg",)
SYSLOG_NOTE = ("dmesg read the kernel log through syslog(2) (this process cannot read /dev/kmsg), which loses where a "
               "message ends: the text after a newline inside a message reads as a line of its own")


def _read_kmsg(path: Path, deadline: float) -> str:
    # Non-blocking, so the end of the buffer is EAGAIN rather than a wait for
    # the next record. Each read() returns one whole record; EPIPE says the
    # kernel overwrote records we had not read yet, and the next read goes on
    # from the oldest one left.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 16384)  # larger than any record (8 KiB at most)
            except BlockingIOError:
                return b"".join(chunks).decode("utf-8", errors="replace")
            except BrokenPipeError:
                continue
            if not chunk:  # a regular file under a test root ends this way
                return b"".join(chunks).decode("utf-8", errors="replace")
            chunks.append(chunk)
    finally:
        os.close(fd)
    raise TimeoutError(errno.ETIMEDOUT, "the deadline passed before the end of the log")


def _has_lines(out: str) -> bool:
    return any(line.strip() and not line.startswith("-- ") for line in out.split("\n"))  # "-- No entries --"


def _text(out: str) -> bool:
    """Not a binary: no NUL. The kernel logs C strings, so no message holds one; other control
    characters a user put in a message (dmesg prints some raw) must not make the log unreadable."""
    return "\x00" not in out


class KernelLog(BaseModel):
    text: str
    source: str  # where it was read: /dev/kmsg, the command that printed it, or both joined by " + "
    unread: dict[str, str] = {}  # each source tried before, and why it gave nothing a reader could use
    note: str | None = None  # what this reading could not see, or how it was pieced together


def read_kernel_log(host: Host, timeout: float) -> tuple[str, str]:
    """(the kernel log since boot, where it came from), within ``timeout`` seconds."""
    log = read_log(host, timeout)
    return log.text, log.source


def _run(host: Host, argv: tuple[str, ...], timeout: float):
    # Looked up on the host's PATH only: a command the host does not have is not there, and
    # the agent's own PATH (a recorded node's replay, a test) must not answer for it.
    exe = shutil.which(argv[0], path=host.environ.get("PATH", os.defpath))
    if exe is None:
        raise FileNotFoundError(errno.ENOENT, f"{argv[0]} is not on PATH")
    return host.run([exe, *argv[1:]], timeout=timeout)


def _journal(host: Host, timeout: float, extra: tuple[str, ...] = (), mark: re.Pattern | None = None) -> tuple[str | None, str]:
    """The journal's kernel messages as dmesg lines (journal.lines), or None and why not;
    ``extra`` arguments for journalctl, ``mark`` as journal.lines takes it."""
    if timeout <= 0:
        return None, "no time left"
    deadline = time.monotonic() + timeout
    try:
        done = _run(host, (*JOURNALCTL, *extra), timeout)
    except OSError as e:
        return None, str(e.strerror or e)
    # journalctl without read access to the journal exits 0 and prints nothing of the
    # kernel's: an empty log is a failure to read, never a clean node. Nor is a text with no
    # message in it (garbage, a binary, another program's words).
    if done.timed_out:
        return None, "timed out"
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    if not _has_lines(done.stdout):
        return None, (done.stderr.strip().splitlines() or ["printed nothing"])[-1]
    try:
        # Decoding gets a moment past the command's own deadline: journalctl may have used all of it.
        text = journal.lines(done.stdout, mark, deadline + DECODE_GRACE)
    except journal.CutShort as e:
        return None, str(e)
    if mark is not None and not text:
        return "", ""  # read, and no driver line in it
    return (text, "") if text else (None, "printed no kernel log line (garbage, or not a kernel log)")


DECODE_GRACE = 2.0  # seconds


def _booted(host: Host) -> float | None:
    """When this machine booted, seconds since the epoch (btime in /proc/stat)."""
    try:
        for line in host.read_text("/proc/stat").splitlines():
            if line.startswith("btime "):
                value = float(line.split()[1])
                return value if math.isfinite(value) and value > 0 else None
    except (OSError, ValueError, IndexError):
        pass
    return None


def _wrapped(host: Host, kmsg: str, source: str, deadline: float) -> KernelLog:
    """/dev/kmsg's text, with the journal's driver events older than the ring's first record
    where the ring has wrapped since boot (see readers/kernel/journal.py)."""
    first = journal.first_record(kmsg)
    if first is None or first[0] == 0:
        return KernelLog(text=kmsg, source=source)
    seq, usec = first
    lost = f"the kernel ring had wrapped since boot (its oldest record is #{seq}, {usec / 1e6:.0f} s after boot)"
    # Only what the ring lost, and only rows that name the driver: a node up for months keeps a
    # big journal, and this runs at every level.
    booted = _booted(host)
    older, why = _journal(host, deadline - time.monotonic(), journal.until(booted, usec) if booted else (), _MARK)
    if older is None:
        # A note, not an unread source: most nodes keep no journal of the kernel (or no journalctl
        # in a container), and a ring that wrapped on a long-running node is no one's fault.
        return KernelLog(text=kmsg, source=source, note=(
            f"{lost} and the journal could not be read ({' '.join(JOURNALCTL)}: {why}): "
            "driver events older than that cannot be seen here"))
    events = journal.before(older, usec, lambda line: bool(_MARK.search(line) and parse(line)))
    said = f"{lost}: the journal gave the {len(events)} driver line(s) older than it"
    if booted is not None:
        early, why = _journal(host, deadline - time.monotonic(), journal.until(booted, JOURNAL_FROM_BOOT * 1e6))
        if early is None and why in ("printed nothing", "-- No entries --"):
            # A journal vacuumed since boot (or one that never kept the kernel's first messages)
            # says nothing of what the ring lost before its own first entry.
            said += "; the journal itself holds no kernel message from around boot: driver events older than both cannot be seen here"
        elif early is None:
            said += f"; whether the journal reaches back to boot is unknown ({why})"
    return KernelLog(text="\n".join(events + [kmsg]), source=f"{source} + {' '.join(JOURNALCTL)}", note=said)


JOURNAL_FROM_BOOT = 0.0  # seconds after boot: journal.until's margin makes it the hours around boot


def read_log(host: Host, timeout: float) -> KernelLog:
    """The kernel log since boot from the first source that gives one, within ``timeout``
    seconds, with what each source tried before it could not give; KernelLogUnavailable
    naming every source where none can."""
    deadline = time.monotonic() + timeout
    kmsg = host.path("/dev/kmsg")
    kmsg_denied = True
    try:
        text = _read_kmsg(kmsg, deadline)
        if _has_lines(text):
            return _wrapped(host, text, str(kmsg), deadline)
        unread = {str(kmsg): "empty"}  # a sandbox's stand-in; a booted kernel has logged something
        kmsg_denied = False
    except OSError as e:
        unread = {str(kmsg): str(e.strerror or e)}
    # A command that hangs may take only half of what is left: the next source still has its turn.
    text, unread["journalctl"] = _journal(host, (deadline - time.monotonic()) / 2)
    if text is not None:
        del unread["journalctl"]
        return KernelLog(text=text, source=" ".join(JOURNALCTL), unread=unread)
    left = deadline - time.monotonic()
    name = DMESG[0]
    if left <= 0:
        unread[name] = "no time left"
        raise KernelLogUnavailable("; ".join(f"{where}: {why}" for where, why in unread.items()), unread)
    try:
        done = _run(host, DMESG, left)
    except OSError as e:
        unread[name] = str(e.strerror or e)
    else:
        # dmesg's own output is a kernel log whatever its lines look like: under printk.time=0
        # a line has no time stamp, and a log without a driver line has no mark either. Only
        # what no kernel prints (a binary) is refused.
        if done.returncode == 0 and not done.timed_out and _has_lines(done.stdout) and _text(done.stdout):
            return KernelLog(text=done.stdout, source=" ".join(DMESG), unread=unread,
                             note=SYSLOG_NOTE if kmsg_denied else None)
        if done.timed_out:
            unread[name] = "timed out"
        elif done.returncode != 0:
            unread[name] = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        elif not _has_lines(done.stdout):
            unread[name] = (done.stderr.strip().splitlines() or ["printed nothing"])[-1]
        else:
            unread[name] = "printed no kernel log line (garbage, or not a kernel log)"
    raise KernelLogUnavailable("; ".join(f"{where}: {why}" for where, why in unread.items()), unread)


# A kernel log line, in each form parse() reads: the driver's own text with any
# prefix or none (a pasted excerpt), a /dev/kmsg record, dmesg's uptime stamp
# (also `dmesg -r`'s "<4>", `dmesg -x`'s "kern  :warn  : ", journalctl -o
# short-monotonic), dmesg -T's bracketed clock, and syslog or journalctl's
# "<time> <host> kernel: ". Other daemons' syslog lines are not the kernel's, and
# an NCCL or application log's "[2026-03-18 11:13:09]" is not dmesg -T's stamp.
_KERNEL_LINE = re.compile(
    r"^(?:<\d+>|[a-z]+\s*:\s*[a-z]+\s*:\s)?\[\s*\d+\.\d+\]"  # dmesg
    r"|^\[[^\]\n]{0,40}\d:\d\d:\d\d \d{4}\]"  # dmesg -T: "[Fri Aug 30 11:43:09 2024]", the year last
    r"|^[^\n]{0,80}?\d:\d\d(?::\d\d)?\S*\s+(?:\S+\s+)?kernel: "  # syslog, journalctl
)


def kernel_lines(text: str) -> int:
    """How many lines of ``text`` a kernel log holds: none means it is not one."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    return sum(1 for line in text.split("\n") if _MARK.search(line) or _KMSG.match(line) or _KERNEL_LINE.match(line))


def has_driver_lines(text: str) -> bool:
    """A kernel log with an NVIDIA driver line anywhere in it (`preflight explain`): NVRM or
    SXid. The whole text: a long journal's Xid may come hours after its boot lines."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    if "NVRM" not in text and "SXid" not in text:
        return False
    return any(_MARK.search(line) for line in text.split("\n") if "NVRM" in line or "SXid" in line)


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
