"""NCCL debug logs (NCCL_DEBUG=INFO) and NCCL / PyTorch error logs: the parser
(text in, `NcclLog` out) and the text and JSON of `preflight nccl-log`.

Every fact is found by NCCL's own wording wherever it sits in a line, so any
prefix works: bare, "host:pid:tid [dev]", "[date time] ", Ray's "(Worker
pid=..., ip=...) ", torch's "[rank1]:", mpirun's "[56] ". A line the source
cut or interleaved with another is skipped, never completed by guessing: a
channel line counts only when its transport is one NCCL prints, whole.

Line formats follow NCCL's sources: transport/p2p.cc, shm.cc, net.cc
("Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d(%d)/GDRDMA(PCI)/Shared"),
and older releases that printed "Channel %02d :" (2.7-2.8), "Ring %02d :"
(2.6 and before), and the GPU's PCI bus id in the brackets (up to ~2.17).
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass

from pydantic import BaseModel

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


class Problem(BaseModel):
    """A known error signature; one per category, at its first occurrence."""

    category: str
    title: str
    line: int
    text: str  # the first line that showed it, as printed (500 characters at most)
    count: int  # lines that showed it
    cause: str
    fix: str


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


# --- what each known error means ---------------------------------------------


@dataclass(frozen=True)
class _Sig:
    needles: tuple[str, ...]  # literal text the pattern needs: a cheap test before the regex
    pattern: str
    title: str
    cause: str
    fix: str


_SHM_FIX = ("give /dev/shm more space: `docker run --shm-size=1g` (or --ipc=host); in Kubernetes mount an emptyDir "
            "with medium: Memory at /dev/shm; on a host `mount -o remount,size=8G /dev/shm`; remove stale "
            "/dev/shm/nccl-* files left by crashed jobs. `preflight run --only shm` checks it")
_FIRST = "find the rank that failed first and read its log"

# Order matters only for reading; each category is matched on its own.
_SIGS: dict[str, _Sig] = {
    # https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/runtime_and_mpi_issues.html
    # ("Shared memory", "Docker"); https://kubernetes.io/docs/concepts/storage/volumes/#emptydir
    "shm_no_space": _Sig(
        ("/dev/shm",),
        r"failed to extend /dev/shm|/dev/shm/\S+.*No space left on device",
        "/dev/shm is too small for NCCL's shared-memory segments",
        "NCCL could not grow a segment in /dev/shm to the size it needs: /dev/shm is full or too small "
        "(Docker's default is 64 MiB). NCCL uses these segments between the processes of one node, so init fails",
        _SHM_FIX),
    # Same page, "Systemd".
    "shm_removed": _Sig(
        ("unlink shared memory",),
        r"unlink shared memory \S+ failed",
        "a shared-memory segment was removed under NCCL",
        "NCCL's segment in /dev/shm vanished while in use: systemd-logind removes a user's IPC objects when it "
        "believes the user logged out, which jobs started by mpirun or Slurm look like",
        "set RemoveIPC=no in /etc/systemd/logind.conf and restart systemd-logind"),
    # Same page; a create error next to "failed to extend" is that one, and is folded into it.
    "shm_create": _Sig(
        ("shared memory segment",),
        r"Error while (?:creating|attaching to) shared memory segment",
        "NCCL could not create a shared-memory segment",
        "creating or mapping a segment in /dev/shm failed: it is missing, read-only, not a tmpfs, or full "
        "(the WARN line says which)",
        "/dev/shm must be a writable tmpfs with mode 1777 and room to spare in the job's container: " + _SHM_FIX),
    # https://github.com/NVIDIA/nccl-tests/issues/206 (memlock, also under mpirun),
    # https://github.com/NVIDIA/nccl/issues/562, https://github.com/NVIDIA/nccl/issues/426 (GID index),
    # and the "--ulimit memlock=-1" of the runtime_and_mpi_issues page above.
    "ib_verbs": _Sig(
        ("ibv_", "Unable to open device"),
        r"\bibv_\w+ failed|Call to ibv_\w+|NET/IB\w* ?: ?Unable to open device",
        "an InfiniBand verbs call failed",
        "NCCL's call into the RDMA stack (libibverbs) failed. ibv_create_qp, ibv_create_cq and ibv_reg_mr fail "
        "mostly on the locked-memory limit (ulimit -l) or in a container that cannot use the RDMA device; "
        "ibv_modify_qp on a port that is down or, on RoCE, a wrong GID index",
        "check the HCAs with `ibv_devinfo` (port state PORT_ACTIVE) and `ulimit -l` inside the job, where it "
        "must be unlimited (Docker --ulimit memlock=-1; /etc/security/limits.conf on hosts, and check it under "
        "mpirun/srun too); in Kubernetes give the pod the RDMA device (RDMA device plugin resource, IPC_LOCK); "
        "choose the HCAs with NCCL_IB_HCA and, on RoCE, NCCL_IB_GID_INDEX (see `show_gids`); run ib_write_bw "
        "between the nodes"),
    # https://github.com/NVIDIA/nccl/issues/426 and /902 (maintainer: error 12 is a timeout).
    "ib_completion": _Sig(
        ("Got completion",),
        r"NET/IB\w* ?: ?Got completion (?:from peer \S+ )?with (?:error|status)",
        "an RDMA transfer failed on the network",
        "an InfiniBand/RoCE work request completed with an error; status 12 (transport retry counter "
        "exceeded) is a timeout: the two NICs cannot reach each other (link down, routing, RoCE GID or "
        "traffic class), the fabric drops packets, or the peer node died",
        "check the links at both ends (`ibstat`, `ibv_devinfo`, switch port counters) and run ib_write_bw "
        "between the two nodes; on RoCE set NCCL_IB_GID_INDEX and NCCL_IB_TC as the fabric requires; raise "
        "NCCL_IB_TIMEOUT only for a slow fabric, it does not fix a broken one"),
    # https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname and the
    # "IP Network Interfaces" part of https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html
    "socket": _Sig(
        ("ocket", "Connection closed", "interface found"),
        r"\b(?:ncclS|s)ocket[A-Z]\w*: |socket\.cc:\d+ -> \d|[Nn]et : Connection closed by remote peer"
        r"|no socket interface found|NET/Socket ?: ?no interface found",
        "a socket connection between ranks failed",
        "NCCL's TCP traffic (bootstrap, or the Socket transport) failed: a peer process died first (the usual "
        "reason), the interface NCCL picked cannot reach the other node (docker0, a VPN, a down link), or a "
        "firewall blocks the ports",
        _FIRST + "; pin the interface that routes between the nodes with NCCL_SOCKET_IFNAME (the "
        "\"Bootstrap : Using\" and \"NET/Socket : Using\" lines show what NCCL picked); allow TCP between the "
        "nodes (NCCL uses ephemeral ports)"),
    # Result codes: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api/types.html and the
    # "Errors" part of the runtime_and_mpi_issues page.
    "unhandled_cuda_error": _Sig(
        ("cuda error", "CudaError", "Cuda failure"),
        r"unhandled cuda error|ncclUnhandledCudaError|Cuda failure",
        "a CUDA call inside NCCL failed",
        "NCCL got an error from the CUDA runtime or driver, named by the \"Cuda failure\" WARN: out of memory "
        "(the job left no room for NCCL's buffers), invalid device or argument (a device mapping mismatch), "
        "or a GPU fault",
        "read the \"Cuda failure\" WARN; for out of memory leave GPU memory free for NCCL; otherwise look "
        "for Xid errors on the node (`preflight xid`) and run `preflight run`"),
    "unhandled_system_error": _Sig(
        ("system error", "SystemError"),
        r"unhandled system error|ncclSystemError",
        "a system call or library NCCL depends on failed",
        "a call outside NCCL failed (sockets, shared memory, InfiniBand verbs, memory allocation); the NCCL "
        "WARN before it, and the other problems listed here, say which",
        "read the first NCCL WARN of the failing rank (rerun with NCCL_DEBUG=INFO if there is none) and "
        "fix that"),
    # https://github.com/NVIDIA/nccl/issues/2057: an ungrouped send/recv order in the application.
    "internal_error": _Sig(
        ("nternal error", "InternalError"),
        r"internal error - please report|ncclInternalError|NCCL error.*\binternal error\b",
        "NCCL's internal check failed",
        "an internal check in NCCL failed: a bug in NCCL, memory corruption, or a use of NCCL it does not "
        "check, such as sends and receives issued in different orders on two ranks without "
        "ncclGroupStart/End",
        "read the NCCL WARN before it; check that every rank issues the same collectives in the same order "
        "and groups its send/recv pairs; try the newest NCCL; report it to NVIDIA/nccl with the "
        "NCCL_DEBUG=INFO log if it persists"),
    "invalid_usage": _Sig(
        ("nvalid usage", "InvalidUsage", "invalid argument (run", "InvalidArgument"),
        r"invalid usage|ncclInvalidUsage|invalid argument \(run with NCCL_DEBUG|ncclInvalidArgument",
        "the application called NCCL incorrectly",
        "NCCL rejected a call: a programming error in the application (a bad argument, pointer or device, "
        "mismatched calls), not a fault of the node",
        "rerun with NCCL_DEBUG=WARN: the WARN names the check that failed; fix the calling code"),
    "remote_error": _Sig(
        ("remote process exited", "RemoteError"),
        r"remote process exited or there was a network error|ncclRemoteError",
        "a peer process exited or the network failed",
        "this rank lost its peer: a remote process exited early (crash, OOM kill, preemption) or the network "
        "between the nodes failed; this rank is a victim, not the cause",
        _FIRST + " (and its node's `dmesg` for OOM kills and Xid errors); check the links between the nodes"),
    # https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html (TORCH_NCCL_TRACE_BUFFER_SIZE,
    # TORCH_NCCL_DUMP_ON_TIMEOUT) and https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html
    "watchdog_timeout": _Sig(
        ("Watchdog caught",),
        r"Watchdog caught collective operation timeout",
        "a collective timed out",
        "the ranks listed waited for a collective that never finished: another rank hung (a stuck GPU, a "
        "dead peer, a data-loader stall) or issued different collectives; the ranks that report a timeout "
        "are the ones that waited, not the culprit",
        "look at the rank that did not report (or failed first); rerun with NCCL_DEBUG=INFO and "
        "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 (flight recorder); `py-spy dump "
        "--pid PID` on a hung rank shows where it is stuck; `preflight run` on its node"),
}
_SIG_RE = {name: re.compile(s.pattern) for name, s in _SIGS.items()}
_NEEDLES = [(n, name) for name, s in _SIGS.items() for n in s.needles]

# --- the lines ---------------------------------------------------------------

# Patterns start with literal text, and each runs only on lines that hold that
# text, so a 64 MiB log parses in seconds.
_CHANNEL = re.compile(
    r"(?:Channel|Ring) (?P<ch>\d{1,5})(?:/\d{1,3})? : (?P<src>\d{1,9})(?:\[(?P<sdev>[0-9a-fA-F]{1,16})\])?"
    r" -> (?P<dst>\d{1,9})(?:\[(?P<ddev>[0-9a-fA-F]{1,16})\])?(?: \[(?P<dir>send|receive)\])? via (?P<t>.*)$")
_NET_T = r"NET/(?P<net>[A-Za-z][\w .-]*?)/\d{1,4}(?:\(\d{1,9}\))?(?:/GDRDMA)?(?:\(PCI\))?(?:/Shared)?"
# Transports NCCL prints, whole; a cut or interleaved one does not match.
_KNOWN = {
    "P2P": re.compile(r"P2P/(?:IPC|CUMEM|MNNVL|direct pointer|indirect/\d+\[\d+\])(?:/read)?(?:/CE)?"),
    "SHM": re.compile(r"SHM/(?:direct|CE)/(?:direct|CE)"),
    "NET": re.compile(_NET_T),
    "COLLNET": re.compile("COLL" + _NET_T),
}
_OTHER = re.compile(r"[A-Z][A-Za-z0-9_]*(?:/[\w .()\[\]-]+)*")  # a kind this parser does not know yet
_WHERE = re.compile(r"[\w./-]+:\d+")
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
_NCCL = re.compile(r"NCCL (?:INFO|WARN|TRACE)\b|NCCL version \d")
_WATCHDOG = re.compile(r"WorkNCCL\((?P<args>.*?)\) ran for (?P<ran>\d+) milliseconds")
_RANK = re.compile(r"\[Rank (\d+)\]|^\[rank(\d+)\]:")


def _transport(t: str) -> tuple[str, str | None] | None:
    """(kind, net) of a transport NCCL prints, or None for a cut or garbled one."""
    if t == "direct shared memory":  # SHM before 2.8
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
    where = head.pop() if head and _WHERE.fullmatch(head[-1]) else None
    dev = int(m[1]) if head and (m := _DEVTOK.fullmatch(head[-1])) else None
    host = pid = None
    if dev is not None and len(head) > 1 and (m := _HOSTTOK.search(head[-2][-300:])):
        host, pid = m[1], int(m[2])
    return Warn(line=number, where=where, message=line[at + 9:].strip(), host=host, pid=pid, dev=dev)


def _flagged(text: str, lines: list[str]) -> dict[int, set[str]]:
    """Line index -> the categories whose needles it holds, found by str.find over the whole text at C speed."""
    starts = [0, *itertools.accumulate(len(line) + 1 for line in lines)]
    out: dict[int, set[str]] = {}
    for needle, name in _NEEDLES:
        at = text.find(needle)
        while at >= 0:
            i = bisect.bisect_right(starts, at) - 1
            out.setdefault(i, set()).add(name)
            at = text.find(needle, starts[i + 1])
    return out


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

    def signatures(self, line: str, number: int, names: set[str]) -> None:
        for name in _SIGS:  # in table order, so one line counts the same way every time
            if name in names and _SIG_RE[name].search(line):
                hit = self.found.setdefault(name, {"line": number, "text": line.strip()[:500], "count": 0, "ranks": []})
                hit["count"] += 1
                if name == "watchdog_timeout":
                    if "args" not in hit:
                        hit["args"] = dict(re.findall(r"(\w+)(?:\(ms\))?=([^,]+)", m["args"])) if (m := _WATCHDOG.search(line)) else {}
                    if (r := _RANK.search(line)) and int(r[1] or r[2]) not in hit["ranks"]:
                        hit["ranks"].append(int(r[1] or r[2]))


def parse(text: str) -> NcclLog:
    """Every fact in ``text``; never raises, never guesses."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    flagged = _flagged(text, lines)
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
            facts.signatures(line[:4096].rstrip("\r"), number, flagged[i])
    if any(c.src_bus or c.dst_bus for c in channels):  # one NCCL build prints one kind of bracket
        channels = [_as_bus(c) for c in channels]
    return NcclLog(
        version=facts.versions[0] if facts.versions else None, versions=facts.versions, networks=facts.networks,
        ib_devices=facts.ib, socket_interfaces=facts.sock, env=facts.env, nranks=facts.nranks, nnodes=facts.nnodes,
        nvls=facts.nvls, channels=channels, warnings=warnings, problems=_problems(facts.found, facts.nranks),
        lines=len(lines), nccl_lines=nccl_lines, skipped=skipped)


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


def _problems(found: dict[str, dict], nranks: int | None) -> list[Problem]:
    if "shm_no_space" in found:
        found.pop("shm_create", None)  # "Error while creating" is how the same failure ends
    out = []
    for name, hit in found.items():
        sig = _SIGS[name]
        title, cause = sig.title, sig.cause
        if name == "watchdog_timeout":
            title, cause = _watchdog(hit, nranks, cause)
        out.append(Problem(category=name, title=title, line=hit["line"], text=hit["text"], count=hit["count"],
                           cause=cause, fix=sig.fix))
    return sorted(out, key=lambda p: p.line)


def _watchdog(hit: dict, nranks: int | None, cause: str) -> tuple[str, str]:
    args = hit["args"]  # SeqNum, OpType, NumelIn, NumelOut, Timeout: "Timeout(ms)=600000"
    what = args.get("OpType", "a collective")
    if "SeqNum" in args:
        what += f" (SeqNum {args['SeqNum']})"
    title = f"{what} timed out"
    if args.get("Timeout", "").isdigit():
        title += f" after {int(args['Timeout']) / 1000:g} s"
    ranks = sorted(hit["ranks"])
    if ranks:
        title += f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        if nranks and len(ranks) < nranks:
            silent = [r for r in range(nranks) if r not in ranks]
            cause += f"; rank(s) {', '.join(map(str, silent[:16]))}{' ...' if len(silent) > 16 else ''} did not report it"
    return title, cause


# --- for a person, and for machines ----------------------------------------------

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
        out.append(f"PROBLEM {p.category}: {p.title} (line {p.line}{seen})")
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
