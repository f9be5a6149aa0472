"""The catalogue of known NCCL and PyTorch errors: each one's signature (the
words NCCL or torch print), its cause and its fix, with the source it comes
from; how the lines that show one become a Problem (one per category, at its
first line); and the wording of a PyTorch watchdog timeout (the op, its
SeqNum, the timeout, the ranks that waited and those that did not report).

nccl_log's parse reads the lines and hands each flagged one here, so a new
known error is one entry in _SIGS and nothing in the grammar.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel


class Problem(BaseModel):
    """A known error signature; one per category, at its first occurrence."""

    category: str
    # "fail": the job broke or cannot start; "warn": it runs, without something it asked for
    severity: Literal["fail", "warn"] = "fail"
    title: str
    line: int
    text: str  # the first line that showed it, as printed (500 characters at most)
    count: int  # lines that showed it
    cause: str
    fix: str


# --- what each known error means ---------------------------------------------


@dataclass(frozen=True)
class _Sig:
    needles: tuple[str, ...]  # literal text the pattern needs: a cheap test before the regex
    pattern: str
    title: str
    cause: str
    fix: str
    severity: Literal["fail", "warn"] = "fail"
    # A line that matches ``pattern`` and this is NCCL coping, at INFO, in the same words: not the problem.
    unless: str | None = None


_SHM_FIX = ("give /dev/shm more space: `docker run --shm-size=1g` (or --ipc=host); in Kubernetes mount an emptyDir "
            "with medium: Memory at /dev/shm; on a host `mount -o remount,size=8G /dev/shm`; remove stale "
            "/dev/shm/nccl-* files left by crashed jobs. `preflight run --only shm` checks it")
_FIRST = "find the rank that failed first and read its log"

# Order matters only for reading; each category is matched on its own.
_SIGS: dict[str, _Sig] = {
    # https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/runtime_and_mpi_issues.html
    # ("Shared memory", "Docker"); https://kubernetes.io/docs/concepts/storage/volumes/#emptydir. NCCL up
    # to 2.11 grew the segment with posix_fallocate in include/shm.h, whose WARN names no path:
    # "include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device".
    "shm_no_space": _Sig(
        ("/dev/shm", "posix_fallocate"),
        r"failed to extend /dev/shm|/dev/shm/\S+.*No space left on device"
        r"|Call to posix_fallocate failed ?: ?No space left on device",
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
        "between the nodes",
        # src/misc/ibvwrap.cc since 2.26: each retried QP transition is an INFO "..., retrying 1/34 after 100 msec
        # of sleep"; only the WARN after the last try (same words, no "retrying") is the failure.
        unless=r"NCCL INFO .*Call to ibv_\w+ failed.*, retrying \d+/\d+ after"),
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
    # NCCL's own words when in-network reduction cannot be set up (transport.cc since 2.9, "using %s
    # instead" in 2.7-2.8; graph/tuning.cc and init.cc 2.9-2.21); the job goes on without it.
    # https://docs.nvidia.com/networking/display/sharpltsv391/using+nvidia+sharp+with+nvidia+nccl (what
    # SHARP needs), https://docs.nvidia.com/networking/display/hpcxv226/NCCL-RDMA-SHARP-Plugins
    # (NCCL_COLLNET_ENABLE=1), https://docs.nvidia.com/networking/display/sharpv3110/Running+NVIDIA+SHARP+Aggregation+Manager+(AM)+Daemons
    # The INFO "less than CollNet node threshold, disabling CollNet" is by design (a one-node communicator) and not matched.
    "collnet_fallback": _Sig(
        ("Cannot initialize CollNet", "CollNet is not supported", "disabling CollNet"),
        r"Cannot initialize CollNet, using .+ instead|CollNet is not supported or fails to initialize"
        r"|CollNet currently only supports up to \d+ GPUs per node, disabling CollNet",
        "CollNet (SHARP in-network reduction) could not be used: NCCL fell back to the point-to-point network",
        "the job asked for in-network reduction (NCCL_COLLNET_ENABLE=1 or NCCL_ALGO=COLLNET: SHARP, where the "
        "InfiniBand switches add up the data) and NCCL could not set it up, so it runs without it: all_reduce "
        "across nodes goes over the point-to-point network (ring/tree) and is slower than the job was sized "
        "for; nothing fails, which is why only this line says so",
        "check that the SHARP plugin loads (HPC-X or nccl-rdma-sharp-plugins' libnccl-net.so on LD_LIBRARY_PATH; "
        "the log's \"NET/Plugin\" lines name the coll plugin) and that NCCL_COLLNET_ENABLE is meant to be set "
        "here; that the SHARP aggregation manager (sharp_am) runs beside the subnet manager or in UFM; that the "
        "HCAs (ConnectX-6 HDR or newer) and switches (Quantum HDR or newer) support SHARP and GPUDirect RDMA "
        "works; where the WARN names a GPUs-per-node limit, use fewer GPUs per node in the communicator",
        "warn"),
    # https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname and the
    # "IP Network Interfaces" part of https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html
    # Since 2.29 the socket calls live in src/os/linux.cc and their WARNs name ncclOsSocket* functions
    # ("ncclOsSocketProgressOpt: Call to recv from <addr> failed", "ncclOsSocketPollConnect to <addr>
    # failed"). Two INFO lines under such a name are NCCL coping, not failing (src/misc/socket.cc 2.26-2.28,
    # src/os/linux.cc since 2.29): "<fn>: connect to <addr> returned <err>, retrying (N/M) after sleep"
    # (a peer not listening yet; a connect that runs out of retries WARNs "exceeded error retry count"),
    # and "socketFinalizeAccept: didn't receive a valid magic" (a stray connection, dropped).
    "socket": _Sig(
        ("ocket", "Connection closed", "interface found"),
        r"\b(?:ncclS|ncclOsS|s)ocket[A-Z]\w*: (?!.*, retrying \(\d|didn't receive a valid magic"
        # 2.30 (src/misc/socket.cc) drops a connection that never sent the magic (a port scanner, a probe) in
        # these words at INFO; "abort called" (2.19+) is the application aborting the communicator on purpose.
        r"|handshake receive from \S+ failed, discarding|peer \S+ closed before magic handshake|abort called\s*$)"
        r"|\b(?:ncclOsS|s)ocketPollConnect to \S+ failed|socket\.cc:\d+ -> \d"
        r"|[Nn]et : Connection closed by remote peer"
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
        "for Xid errors on the node (`preflight xid`) and run `preflight run`",
        # CUDACHECKIGNORE/CUCHECKIGNORE (src/include/checks.h, every release): an error NCCL clears and
        # ignores (cudaIpcCloseMemHandle, cuMemUnmap at teardown) is logged at INFO as "Cuda failure '...'".
        unless=r"NCCL INFO .*\bCuda failure\b"),
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
_UNLESS = {name: re.compile(s.unless) for name, s in _SIGS.items() if s.unless}
_NEEDLES = [(n, name) for name, s in _SIGS.items() for n in s.needles]
# The application aborted a communicator (ncclCommAbort: torch's destroy_process_group and its error handling
# do): init.cc's "... - Abort COMPLETE" (INIT, shown by default) and socketProgressOpt's "abort called" (NET).
# Each thread that was blocked in a socket then returns ncclInternalError (3) up its call chain, at INFO
# ("misc/socket.cc:47 -> 3", NVIDIA/Fuser#3055): the abort's echo, no failure of its own. A real socket
# failure WARNs first, in words of its own, and stays a problem.
ABORTED = "_aborted"
_NEEDLES += [("Abort COMPLETE", ABORTED), ("abort called", ABORTED)]
_CHAIN = re.compile(r"NCCL INFO \S*socket\.cc:\d+ -> 3\s*$")

# torch's watchdog line: the op's arguments and how long it ran, and which rank printed it.
_WATCHDOG = re.compile(r"WorkNCCL\((?P<args>.*?)\) ran for (?P<ran>\d+) milliseconds")
_RANK = re.compile(r"\[Rank (\d+)\]|^\[rank(\d+)\]:")


def flagged(text: str, lines: list[str]) -> dict[int, set[str]]:
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


def record(found: dict[str, dict], line: str, number: int, names: set[str]) -> None:
    """Count the known errors this line shows into ``found`` (category -> first line, its text, count, ranks);
    ``names`` are the categories whose needles the line holds (from ``flagged``)."""
    if ABORTED in names:
        found.setdefault(ABORTED, {"line": number})
    for name in _SIGS:  # in table order, so one line counts the same way every time
        if name in names and _SIG_RE[name].search(line) and not (name in _UNLESS and _UNLESS[name].search(line)):
            hit = found.setdefault(name, {"line": number, "text": line.strip()[:500], "count": 0, "ranks": [], "chains": 0})
            hit["count"] += 1
            if name == "socket" and _CHAIN.search(line):
                hit["chains"] += 1
            if name == "watchdog_timeout":
                if "args" not in hit:
                    hit["args"] = dict(re.findall(r"(\w+)(?:\(ms\))?=([^,]+)", m["args"])) if (m := _WATCHDOG.search(line)) else {}
                if (r := _RANK.search(line)) and int(r[1] or r[2]) not in hit["ranks"]:
                    hit["ranks"].append(int(r[1] or r[2]))


def problems(found: dict[str, dict], nranks: int | None) -> list[Problem]:
    """One Problem per category ``record`` found, in the order they appear in the log."""
    if "shm_no_space" in found:
        found.pop("shm_create", None)  # "Error while creating" is how the same failure ends
    if found.pop(ABORTED, None) and "socket" in found and found["socket"]["chains"] == found["socket"]["count"]:
        found.pop("socket")  # only the return chain of an abort the application asked for (ABORTED above)
    out = []
    for name, hit in found.items():
        sig = _SIGS[name]
        title, cause = sig.title, sig.cause
        if name == "watchdog_timeout":
            title, cause = _watchdog(hit, nranks, cause)
        out.append(Problem(category=name, severity=sig.severity, title=title, line=hit["line"], text=hit["text"],
                           count=hit["count"], cause=cause, fix=sig.fix))
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
