"""`preflight explain` of an NCCL log (NCCL_DEBUG=INFO, or a PyTorch/NCCL error
log): what `preflight nccl-log` reports, as findings and facts.

Each known problem (readers/nccl/nccl_errors.py) is a finding of its own severity
(a failure makes `nccl-log` exit 1; a CollNet fallback warns), with its cause and fix. A setting NCCL reports that takes a fast
path away (NCCL_P2P_DISABLE=1: NVLink/PCIe peer traffic through host memory
or the network instead) warns, in nccl_log_text's words: it explains a slow
transport. Two NCCL versions in one job warn. The facts are the version, the
network, the ranks and the transports of every rank pair.
"""

from __future__ import annotations

from preflight.base.errors import UsageError
from preflight.outputs.explain import nccl_log_text
from preflight.outputs.explain.explained import Explained, Item
from preflight.pipeline.profiles import ResolvedProfile
from preflight.readers.nccl import nccl_log
from preflight.readers.nccl.nccl_errors import Problem
from preflight.readers.nccl.nccl_log import NcclLog

KIND, TITLE = "nccl-log", "NCCL log"
# What `preflight nccl-log FILE` and `explain` say of a file with no NCCL output, after the file's name.
NO_NCCL = ("holds no NCCL output; run the job with NCCL_DEBUG=INFO (and NCCL_DEBUG_FILE=/path/nccl.%h.%p.log for a file "
           "per process) and pass that log")
_ENV_FIX = {
    "NCCL_P2P_DISABLE": "unset NCCL_P2P_DISABLE (a debugging switch); if P2P hangs without it, fix the cause (ACS, IOMMU: `preflight run --only pcie`)",
    "NCCL_SHM_DISABLE": "unset NCCL_SHM_DISABLE (a debugging switch); if SHM fails without it, give /dev/shm room (`preflight run --only shm`)",
    "NCCL_IB_DISABLE": "unset NCCL_IB_DISABLE where the nodes have InfiniBand/RoCE (`ibv_devinfo` lists the HCAs)",
    "NCCL_NVLS_ENABLE": "unset NCCL_NVLS_ENABLE unless NVLS was turned off on purpose (it takes GPU memory for its buffers)",
}


def problem_items(problems: list[Problem]) -> list[Item]:
    """Each known NCCL error as a finding of its severity, naming the line that showed it
    (also what `explain` says of the errors in nccl-tests output)."""
    out = []
    for p in problems:
        more = f", and {p.count - 1} more line(s)" if p.count > 1 else ""
        out.append(Item(severity=p.severity, summary=p.title, cause=f"{p.cause} (line {p.line}{more}: {p.text})", fix=p.fix))
    return out


def judge(log: NcclLog) -> list[Item]:
    """Pure: the known problems, then the settings and versions that slow or split the job."""
    out = problem_items(log.problems)
    for (name, value), note in nccl_log_text._ENV_NOTES.items():
        if log.env.get(name) == value:
            out.append(Item(severity="warn", summary=f"{name}={value}: {note}",
                            cause=f"NCCL reports {name} set by environment to {value}: {note}, so NCCL takes a slower transport "
                                  "where the fast one would work",
                            fix=_ENV_FIX[name]))
    if len(log.versions) > 1:
        out.append(Item(severity="warn", summary=f"more than one NCCL in one job: {', '.join(log.versions)}",
                        cause="ranks loaded different NCCL libraries (different containers, or a torch wheel beside a system NCCL)",
                        fix="run every rank with the same NCCL: the same image, or NCCL_DEBUG=VERSION to see which each loads"))
    return out


def facts_of(log: NcclLog) -> dict:
    data = nccl_log_text.to_json(log, "")
    return {
        "version": log.version, "versions": log.versions, "networks": log.networks, "ib_devices": log.ib_devices,
        "socket_interfaces": log.socket_interfaces, "nranks": log.nranks, "nnodes": log.nnodes, "nvls": log.nvls,
        "env": log.env, "transports": data["peers"], "channel_lines": data["channel_lines"], "warnings": len(log.warnings),
        "lines": log.lines, "nccl_lines": log.nccl_lines, "problems": [p.category for p in log.problems],
    }


def explain(text: str, source: str, profile: ResolvedProfile | None) -> Explained:
    """Refuses, in `nccl-log`'s words, a text with no NCCL output."""
    log = nccl_log.parse(text)
    if not log.nccl_lines and not log.problems:  # the wrong file must not read as a clean run
        raise UsageError(f"{source} {NO_NCCL}")
    return Explained(kind=KIND, title=TITLE, source=source, findings=judge(log), facts=facts_of(log))
