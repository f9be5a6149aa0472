"""The Slurm jobs running on this node now, read from /proc alone.

Every step of a Slurm job (its batch script, each srun, the extern step)
runs under a slurmstepd on the node, which titles itself
``slurmstepd: [JOBID.STEP]`` over its command line. Reading those titles needs
no Slurm command: a prolog must not call back into slurmctld, which may be
waiting for it (examples/slurm/prolog.sh).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from preflight.base.host import Host

# "slurmstepd: [41.batch]", "[41.0]", "[41.extern]", "[41.interactive]", and since Slurm 24.05 the
# job's step manager "[41.extern stepmgr]" (slurmstepd.c, _set_job_log_prefix: "[%s%s]" with
# " stepmgr"); the title is written over argv, so whatever follows it (NULs, spaces) is padding.
TITLE = re.compile(rb"slurmstepd: \[(\d+)\.[^\]\s]+(?: stepmgr)?\]")


def job_of(comm: str, cmdline: bytes) -> str | None:
    """The job id a process runs a step of, or None where it is no titled slurmstepd
    (one still starting has not written its title yet: its job is not known)."""
    if comm.strip() != "slurmstepd":
        return None
    found = TITLE.match(cmdline)
    return found.group(1).decode() if found else None


def _root_processes(host: Host, name: str) -> Iterator[tuple[str, str]]:
    """(its /proc directory, comm) of each of root's processes named ``name``."""
    try:
        entries = list(os.scandir(host.path("/proc")))
    except OSError:
        return
    for e in entries:
        if not e.name.isdigit():
            continue
        try:
            with open(os.path.join(e.path, "comm"), "rb") as f:
                comm = f.read(64).decode(errors="replace")
            if comm.strip() != name or not _roots(e.path, recorded=host.root != Path("/")):
                continue
        except OSError:  # gone since the listing, or not ours to read
            continue
        yield e.path, comm


def running(host: Host) -> list[str]:
    """Ids of the Slurm jobs with a step on this node, lowest first."""
    jobs: set[str] = set()
    for proc, comm in _root_processes(host, "slurmstepd"):
        try:
            with open(os.path.join(proc, "cmdline"), "rb") as f:
                job = job_of(comm, f.read(256))
        except OSError:
            continue
        if job is not None:
            jobs.add(job)
    return sorted(jobs, key=int)


def slurmd_here(host: Host) -> bool:
    """Whether root's slurmd runs in this process's own mount namespace: in a container, that
    container is then a Slurm node (soperator's worker pods run slurmd, and every job, inside
    one), so its /dev/shm is every job's here, the node's configuration. Seeing one is not
    enough: a container given the host's PIDs (hostPID, --pid=host) sees the host's slurmd and
    every pod's processes, and any root pod may name a process slurmd. Unreadable: False."""
    try:
        mine = os.stat(host.path("/proc/self/ns/mnt")).st_ino
    except OSError:
        return False
    for proc, _ in _root_processes(host, "slurmd"):
        try:
            if os.stat(os.path.join(proc, "ns", "mnt")).st_ino == mine:
                return True
        except OSError:
            continue
    return False


def _roots(proc: str, recorded: bool) -> bool:
    """Whether the process runs as root, as slurmd starts every slurmstepd: any user can
    title a process "slurmstepd: [1.0]" (and hide a full /dev/shm behind it), none but
    root can make one of root's. Read from status (Uid: real effective saved fs), which a
    process cannot change, unlike the owner of its /proc directory. A recorded tree
    without it (tests/fixtures/proc) says nothing against the title."""
    try:
        with open(os.path.join(proc, "status"), "rb") as f:
            for line in f.read(4096).splitlines():
                if line.startswith(b"Uid:"):
                    return line.split()[1:2] == [b"0"]
    except FileNotFoundError:
        return recorded
    return False


def others(host: Host) -> list[str]:
    """The Slurm jobs running here other than the one this process serves: in a prolog
    (and in anything run inside a job) SLURM_JOB_ID is that job, not another."""
    own = (host.environ.get("SLURM_JOB_ID") or "").strip()
    return [j for j in running(host) if j != own]
