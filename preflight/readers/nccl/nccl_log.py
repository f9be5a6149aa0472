"""NCCL debug logs (NCCL_DEBUG=INFO) and NCCL / PyTorch error logs: the models
and the line grammar, text in, `NcclLog` out. What each known error means is
nccl_errors; the text and JSON of `preflight nccl-log` are
preflight/outputs/explain/nccl_log_text.py.

Every fact is found by NCCL's own wording wherever it sits in a line, so any
prefix works: bare, "host:pid:tid [dev]", "[date time] ", Ray's "(Worker
pid=..., ip=...) ", torch's "[rank1]:", mpirun's "[56] ". A line the source
cut or interleaved with another is skipped, never completed by guessing: a
channel line counts only when its transport is one NCCL prints, whole.

Line formats follow NCCL's sources: transport/p2p.cc, shm.cc ("via SHM/direct" since 2.30), net.cc
("Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d(%d)/GDRDMA(PCI)/Shared"),
and older releases that printed "Channel %02d :" (2.7-2.8), "Ring %02d :"
(2.6 and before), and the GPU's PCI bus id in the brackets (up to ~2.17).
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from preflight.base import tooltext
from preflight.readers.nccl import nccl_errors
from preflight.readers.nccl.nccl_errors import Problem

MAX_BYTES = 64 << 20  # a saved log larger than this is refused by the CLI


class Channel(BaseModel):
    """One connection NCCL set up: a "Channel NN/M : a[x] -> b[y] via T" line."""

    line: int  # 1-based line number in the text
    channel: int
    src_rank: int
    src_dev: int | None
    dst_rank: int
    dst_dev: int | None
    direction: str | None  # "send" / "receive" where the line says so (NET lines)
    transport: str  # as printed: "P2P/CUMEM/read", "NET/IB/0(8)/GDRDMA", "direct shared memory"
    kind: str  # "P2P", "SHM", "NET", "NVLS", "COLLNET", ...
    net: str | None  # for NET: "IB", "Socket", "IBext_v8", ...
    gdr: bool  # GPUDirect RDMA
    src_bus: str | None = None  # older NCCL print the PCI bus id in the brackets ("1b000")
    dst_bus: str | None = None


class Warn(BaseModel):
    """One "NCCL WARN" line."""

    line: int
    where: str | None  # "misc/shmutils.cc:71"
    message: str
    host: str | None
    pid: int | None
    dev: int | None


class NcclLog(BaseModel):
    version: str | None  # the first NCCL version seen
    versions: list[str]  # every distinct one: two in one job is itself a finding
    networks: list[str]  # "Using network X", distinct, in order
    ib_devices: list[str]  # "mlx5_0:1/IB" as NET/IB lists them
    socket_interfaces: list[str]
    env: dict[str, str]  # what NCCL reported "set by environment"
    nranks: int | None  # the largest communicator in the log
    nnodes: int | None
    nvls: bool | None  # NVLS multicast: False once any device says "not available"
    # NVLS channels a communicator set up ("N coll channels, ... K nvls channels"), the most of any:
    # above 0, NCCL runs NVLS; 0 where it is off (NCCL_NVLS_ENABLE=0) or not possible; None: no such line.
    nvls_channels: int | None = None
    channels: list[Channel]
    warnings: list[Warn]
    problems: list[Problem]
    lines: int
    nccl_lines: int = 0  # lines NCCL itself wrote: none means the wrong file
    skipped: list[int] = []  # channel lines cut or garbled by the source: ignored

    def peers(self) -> dict[tuple[int, int], list[str]]:
        """(src_rank, dst_rank) -> the distinct transports, in order of first use."""
        out: dict[tuple[int, int], list[str]] = {}
        for c in self.channels:
            used = out.setdefault((c.src_rank, c.dst_rank), [])
            if c.transport not in used:
                used.append(c.transport)
        return out


# --- the lines ---------------------------------------------------------------

# Patterns start with literal text, and each runs only on lines that hold that
# text, so a 64 MiB log parses in seconds.
_CHANNEL = re.compile(
    r"(?:Channel|Ring) (?P<ch>\d{1,5})(?:/\d{1,3})? : (?P<src>\d{1,9})(?:\[(?P<sdev>[0-9a-fA-F]{1,16})\])?"
    r" -> (?P<dst>\d{1,9})(?:\[(?P<ddev>[0-9a-fA-F]{1,16})\])?(?: \[(?P<dir>send|receive)\])? via (?P<t>.*)$")
_NET_T = r"NET/(?P<net>[A-Za-z][\w .-]*?)/\d{1,4}(?:\(\d{1,9}\))?(?:/GDRDMA)?(?:\(PCI\))?(?:/Shared)?"
# Transports NCCL prints, whole; a cut or interleaved one does not match.
_KNOWN = {
    # "common device" (two ranks on one GPU) up to 2.7; the intermediate GPU of "indirect" in brackets
    # as the ends are: a device number, or before ~2.18 a PCI bus id in hex ("indirect/2[1b000]").
    "P2P": re.compile(r"P2P/(?:IPC|CUMEM|MNNVL|direct pointer|common device|indirect/\d+\[[0-9a-fA-F]+\])(?:/read)?(?:/CE)?"),
    # "SHM/<send>/<recv>" (each "direct" or "CE") up to 2.29; NCCL 2.30 dropped the CE path and prints
    # "SHM/direct" alone (src/transport/shm.cc, v2.30.7-1).
    "SHM": re.compile(r"SHM/(?:direct|CE)(?:/(?:direct|CE))?"),
    "NET": re.compile(_NET_T),
    "COLLNET": re.compile("COLL" + _NET_T),
}
# SHM as NCCL 2.4-2.11 printed it (transport/shm.cc), and in plain words as some excerpts give it.
_SHM_WORDS = ("direct shared memory", "shared memory")
_OTHER = re.compile(r"[A-Z][A-Za-z0-9_]*(?:/[\w .()\[\]-]+)*")  # a kind this parser does not know yet
_WHERE = re.compile(r"[\w./-]+:\d+")
_FUNC = re.compile(r"\(\S+\)")  # NCCL 2.30's WARN prefix names the function after file:line: "shm.cc:96 (shmSendSetup)"
_DEVTOK = re.compile(r"\[(\d{1,4})\]")
_HOSTTOK = re.compile(r"([^\s\[\]():]+):(\d{1,10}):\d{1,10}$")
# NCCL_VERSION_STRING is "2.21.5+cuda12.4" (the macro names when a build did not expand them); a suffix
# cut short by the source is dropped rather than kept half.
_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+(?!\d)(?:\+cuda(?:\d+\.\d+|CUDA_MAJOR\.CUDA_MINOR)(?!\w))?)")
_NETWORK = re.compile(r"Using network (?P<net>[\w .-]+)$")
_IB_DEVS = re.compile(r"NET/IB\w* ?: ?Using (?P<rest>[^;]*)")
_SOCK_DEVS = re.compile(r"NET/Socket ?: ?Using (?P<rest>.*)")
_DEV = re.compile(r"\[\d+\]([^\s\[\];]+)")
_ENV = re.compile(r"(?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>\S.*)")
_NRANKS = re.compile(r"n[Rr]anks (?P<n>\d{1,9})(?: nNodes (?P<nodes>\d{1,9}))?")
_NVLS = re.compile(r"NVLS multicast support is (?P<not>not )?available")
_NVLS_CHANNELS = re.compile(r"\bcoll channels, .*?\b(?P<n>\d{1,4}) nvls channels")
_NCCL = re.compile(r"NCCL (?:INFO|WARN|TRACE)\b|NCCL version \d")
# What only NCCL or torch's NCCL backend writes: NCCL's own lines after their prefix, its version line,
# and torch's watchdog and error lines (ProcessGroupNCCL.cpp, "NCCL error", NCCL's result names).
_LOOKS = re.compile(r"(?:^|[\s\]>:])NCCL (?:INFO|WARN|TRACE) |(?:^|\s)NCCL version \d+\.\d+\.\d+"
                    r"|Watchdog caught collective operation timeout|ProcessGroupNCCL\.cpp:\d+|\bNCCL error\b"
                    r"|\bnccl(?:SystemError|InternalError|UnhandledCudaError|InvalidUsage|InvalidArgument|RemoteError)\b")
# Past the first lines only a line holding one of these is tried with _LOOKS: one C-speed scan of the text.
_LOOKS_SCAN = re.compile(r"NCCL (?:INFO|WARN|TRACE) |NCCL version \d|Watchdog caught collective|ProcessGroupNCCL\.cpp:"
                         r"|NCCL error|nccl(?:System|Internal|UnhandledCuda|InvalidUsage|InvalidArgument|Remote)")
LOOKS_LINES = 200


def _transport(t: str) -> tuple[str, str | None] | None:
    """(kind, net) of a transport NCCL prints, or None for a cut or garbled one."""
    if t in _SHM_WORDS:
        return "SHM", None
    kind = t.split("/", 1)[0]
    if kind in _KNOWN:
        m = _KNOWN[kind].fullmatch(t)
        return (kind, m.group("net") if "net" in m.groupdict() else None) if m else None
    return (kind, None) if _OTHER.fullmatch(t) and "NCCL" not in t else None


def _dev(text: str | None) -> tuple[int | None, str | None]:
    """(device index, PCI bus id) from a channel line's brackets."""
    if text is None:
        return None, None
    # Older NCCL print the bus id in hex ("1b000", "101c0"): any GPU off bus 0 gives 4+ digits.
    if text.isdigit() and len(text) < 4:
        return int(text), None
    return None, text.lower()


def _channel(line: str, number: int) -> Channel | None | bool:
    """The channel on this line; False when the line holds none; None when it holds one cut or garbled."""
    at = line.find("Channel ")
    m = _CHANNEL.match(line, at if at >= 0 else max(line.find("Ring "), 0))
    if not m:
        return False
    t = m["t"].rstrip()
    kind_net = _transport(t)
    if kind_net is None:
        return None
    (sdev, sbus), (ddev, dbus) = _dev(m["sdev"]), _dev(m["ddev"])
    return Channel(line=number, channel=int(m["ch"]), src_rank=int(m["src"]), src_dev=sdev, dst_rank=int(m["dst"]),
                   dst_dev=ddev, direction=m["dir"], transport=t, kind=kind_net[0], net=kind_net[1],
                   gdr="/GDRDMA" in t, src_bus=sbus, dst_bus=dbus)


def _warn(line: str, number: int) -> Warn:
    """Read from the right, so whatever prefix precedes "host:pid:tid [dev] file:line" is ignored."""
    at = line.find("NCCL WARN")
    head = line[:at].split()
    if head and _FUNC.fullmatch(head[-1]):
        head.pop()
    where = head.pop() if head and _WHERE.fullmatch(head[-1]) else None
    dev = int(m[1]) if head and (m := _DEVTOK.fullmatch(head[-1])) else None
    host = pid = None
    if dev is not None and len(head) > 1 and (m := _HOSTTOK.search(head[-2][-300:])):
        host, pid = m[1], int(m[2])
    return Warn(line=number, where=where, message=line[at + 9:].strip(), host=host, pid=pid, dev=dev)


class _Facts:
    """What the lines say, gathered in one pass."""

    def __init__(self) -> None:
        self.versions: list[str] = []
        self.networks: list[str] = []
        self.ib: list[str] = []
        self.sock: list[str] = []
        self.env: dict[str, str] = {}
        self.nranks: int | None = None
        self.nnodes: int | None = None
        self.nvls: bool | None = None
        self.nvls_channels: int | None = None
        self.found: dict[str, dict] = {}  # category -> first line, its text, count, ranks

    def info(self, line: str) -> None:
        if "NCCL version" in line and (m := _VERSION.search(line)):
            _add_version(self.versions, m["v"])
        if "Using network" in line and (m := _NETWORK.search(line.rstrip())):
            _add(self.networks, m["net"].strip())
        if "NET/" in line and "Using" in line:
            if m := _IB_DEVS.search(line):
                for dev in _DEV.findall(m["rest"]):
                    _add(self.ib, dev)
            elif m := _SOCK_DEVS.search(line):
                for dev in _DEV.findall(m["rest"]):
                    _add(self.sock, dev.split(":", 1)[0])
        if "set by environment" in line and (m := _ENV.search(line)):
            self.env.setdefault(m["name"], m["value"].rstrip().removesuffix("."))  # NCCL ends most with "."
        if "anks " in line and (m := _NRANKS.search(line)):
            self.nranks = max(self.nranks or 0, int(m["n"]))
            if m["nodes"]:
                self.nnodes = max(self.nnodes or 0, int(m["nodes"]))
        if "NVLS multicast" in line and (m := _NVLS.search(line)):
            self.nvls = not m["not"] and self.nvls is not False
        if "nvls channels" in line and (m := _NVLS_CHANNELS.search(line)):
            self.nvls_channels = max(self.nvls_channels or 0, int(m["n"]))


def looks_like(text: str) -> bool:
    """Whether ``text`` holds lines NCCL or torch's NCCL backend wrote: an NCCL_DEBUG log, or a job's
    log with NCCL's errors in it. The first lines are read whole; past them, where a long training log
    may end in the one error line that matters, only lines holding NCCL's words are looked at. An
    nccl-tests output run with NCCL_DEBUG=INFO says True as well: the caller tries that kind first."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    head = text.split("\n", LOOKS_LINES)
    if any(_LOOKS.search(line[:4096]) for line in head[:LOOKS_LINES]):
        return True
    rest = head[LOOKS_LINES] if len(head) > LOOKS_LINES else ""
    for m in _LOOKS_SCAN.finditer(rest):
        start = rest.rfind("\n", 0, m.start()) + 1
        end = rest.find("\n", m.end())
        if _LOOKS.search(rest[start:min(len(rest) if end < 0 else end, start + 4096)]):
            return True
    return False


def parse(text: str) -> NcclLog:
    """Every fact in ``text``; never raises, never guesses."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    flagged = nccl_errors.flagged(text, lines)
    facts = _Facts()
    channels: list[Channel] = []
    warnings: list[Warn] = []
    skipped: list[int] = []
    nccl_lines = 0
    for i, line in enumerate(lines):
        number = i + 1
        nccl = "NCCL" in line and _NCCL.search(line) is not None
        if " via " in line:
            channel = _channel(line, number)
            if channel is None:
                skipped.append(number)
            elif channel:
                channels.append(channel)
                nccl = True
        if nccl:
            nccl_lines += 1
            if "NCCL WARN" in line:
                warnings.append(_warn(line, number))
            facts.info(line)
        if i in flagged:  # error lines are short; the cap bounds the patterns' work on a pathological one
            nccl_errors.record(facts.found, line[:4096].rstrip("\r"), number, flagged[i])
    if any(c.src_bus or c.dst_bus for c in channels):  # one NCCL build prints one kind of bracket
        channels = [_as_bus(c) for c in channels]
    return NcclLog(
        version=facts.versions[0] if facts.versions else None, versions=facts.versions, networks=facts.networks,
        ib_devices=facts.ib, socket_interfaces=facts.sock, env=facts.env, nranks=facts.nranks, nnodes=facts.nnodes,
        nvls=facts.nvls, nvls_channels=facts.nvls_channels, channels=channels, warnings=warnings, problems=nccl_errors.problems(facts.found, facts.nranks),
        lines=len(lines), nccl_lines=nccl_lines, skipped=skipped)


class Summary(BaseModel):
    """What one stage's NCCL lines say of the connections its collectives made, for a
    check's details and judges (bandwidth: the large collectives' rings and NVLS)."""

    version: str | None
    networks: list[str]
    nvls: bool | None  # NVLS multicast available on every device that said
    nvls_channels: int | None  # above 0: NCCL set NVLS up for these collectives
    transports: list[str]  # the kinds seen on any channel (P2P, SHM, NET, NVLS ...), in order
    peers: dict[str, list[str]]  # "src->dst" -> the transports that pair used
    warnings: list[str]
    problems: list[dict]


def summary(log: NcclLog) -> Summary:
    peers = log.peers()
    kinds: list[str] = []
    for transports in peers.values():
        for t in transports:
            _add(kinds, t.split("/")[0])
    return Summary(version=log.version, networks=log.networks, nvls=log.nvls, nvls_channels=log.nvls_channels, transports=kinds,
                   peers={f"{a}->{b}": t for (a, b), t in sorted(peers.items())}, warnings=[w.message for w in log.warnings[:50]],
                   problems=[p.model_dump() for p in log.problems])


def _add(seen: list[str], item: str) -> None:
    if item not in seen:
        seen.append(item)


def _add_version(seen: list[str], v: str) -> None:
    # torch's error text says "NCCL version 2.19.3" of the same library that printed "2.19.3+cuda12.3"
    base = v.split("+")[0]
    for i, old in enumerate(seen):
        if old == v or ("+" not in v and old.split("+")[0] == base):
            return
        if "+" not in old and old == base:
            seen[i] = v
            return
    seen.append(v)


def _as_bus(c: Channel) -> Channel:
    update = {}
    if c.src_dev is not None:
        update.update(src_dev=None, src_bus=format(c.src_dev))
    if c.dst_dev is not None:
        update.update(dst_dev=None, dst_bus=format(c.dst_dev))
    return c.model_copy(update=update)
