"""The shm check's facts and their judges, pure functions of them: what the
check gathered about /dev/shm (`ShmFacts`), whose a fault there is (`owner`),
the filesystem behind it (`judge_mount`), its size and free space
(`judge_space`, which also judges a `df` capture in `preflight explain`),
the memory that backs a segment (`judge_memory`), and `judge`, which holds
them all against a floor in bytes. checks/shm.py gathers the facts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from preflight.readers.nccl import nccl_env
from preflight.readers.system.shm_mount import Mount, ShmFile
from preflight.base.actions import Action, Domain, Next
from preflight.base.findings import Finding, Measurement, Status
from preflight.base.units import fmt_bytes

FIX_SIZE = (
    "give /dev/shm at least {floor}: `docker run --shm-size={gib}g` (or --ipc=host); in Kubernetes mount an "
    "emptyDir with medium: Memory and sizeLimit: {gib}Gi at /dev/shm; on a host `mount -o remount,size={gib}G /dev/shm` "
    "and the same size in /etc/fstab"
)


@dataclass
class ShmFacts:
    path: str
    exists: bool
    mount: Mount | None = None
    size_bytes: int | None = None  # None: no limit (a tmpfs mounted with size=0)
    free_bytes: int | None = None
    free_inodes: int | None = None  # None: no limit (nr_inodes=0)
    mode: int | None = None  # permission bits of the directory
    mem_total_bytes: int | None = None
    # MemAvailable: what the kernel can give a new segment without swapping (a tmpfs page is
    # RAM or swap, never reclaimable cache), so /dev/shm backs no more than this, whatever its size.
    mem_available_bytes: int | None = None
    cgroup_headroom_bytes: int | None = None  # memory.max - memory.current; tmpfs pages count there
    write_error: str | None = None
    segment_bytes: int = 0
    segment_skipped: str | None = None  # why no segment was written where one was asked for
    segment_error: str | None = None
    segment_seconds: float | None = None
    largest_files: list[ShmFile] = field(default_factory=list)
    users: dict[int, str] = field(default_factory=dict)  # uid -> name, of the local accounts (/etc/passwd)
    shm_disabled_by: list[str] = field(default_factory=list)  # "environment", "/etc/nccl.conf"
    # Slurm jobs running here besides the one this run serves (a prolog's SLURM_JOB_ID): the
    # space and inodes in use may be theirs, so they are reported, not judged.
    other_jobs: list[str] = field(default_factory=list)
    # How this process is known to run in a container (readers/system/container.py), or None: then
    # /dev/shm, its mount and the memory limit are what the container was started with.
    container: str | None = None
    host_ipc: bool | None = None  # in the host's IPC namespace (--ipc=host, hostIPC): /dev/shm is the host's
    slurm_node: bool = False  # root's slurmd runs beside this process: a container that is a Slurm node (soperator)
    limit_of_job: str | None = None  # the Slurm job whose cgroup sets the memory limit (its --mem), where one does


def owner(f: ShmFacts, shm: bool = True) -> Next:
    """Whose a /dev/shm that is too small, read-only or not a tmpfs is (``shm``; else the
    memory limit's): a container's is what its job was started with (Docker's --shm-size, a
    pod's emptyDir), the job's to fix, and the node takes other jobs; the host's is the node's
    configuration, and so is the /dev/shm of a container that shares the host's IPC namespace
    (the host's, mounted in; its memory limit is still the container's), and both of a
    container that is itself the Slurm node."""
    if f.limit_of_job and not shm:  # a job's --mem binds, in a container or not (pyxis, soperator's slurmd pod)
        return Next(Action.FIX_JOB, Domain.JOB, f"the memory limit is Slurm job {f.limit_of_job}'s cgroup: what the job asked for (--mem)")
    if f.container and f.host_ipc and shm:
        return Next(Action.DRAIN, Domain.SOFTWARE, f"in a container ({f.container}) that shares the host's IPC namespace "
                    "(--ipc=host, hostIPC): its /dev/shm is the host's, the node's configuration")
    if f.container and f.slurm_node:
        return Next(Action.DRAIN, Domain.SOFTWARE, f"in a container ({f.container}) that runs slurmd, a Slurm node in a pod (as soperator's): "
                    f"its {'/dev/shm' if shm else 'memory limit'} is every job's here, the node's configuration")
    if f.container:
        return Next(Action.FIX_JOB, Domain.JOB, f"in a container ({f.container}): its {'/dev/shm' if shm else 'memory limit'} is what the job was started with")
    return Next(Action.DRAIN, Domain.SOFTWARE, "the host's /dev/shm is the node's configuration" if shm else
                "the memory limit is that of the unit or slice preflight runs in: the node's configuration")


# Memory the node has, held by processes and tmpfs files: software, whoever filled it (any user can
# fill the host's /dev/shm). A drain each time, never a hardware failure the history counts
# towards a lemon (history_judge.lemon): a user filling it between rechecks must not send a
# healthy node to service.
HELD = Next(Action.DRAIN, Domain.SOFTWARE, "what holds the memory is processes and files (a job's stale segments), software, not the node's hardware")


def _filled(f: ShmFacts) -> Next:
    """Whose a full /dev/shm is: a container's own is its job's (owner); the host's is software."""
    mine = owner(f)
    return mine if mine.domain == Domain.JOB else HELD


def fix_size(floor: float) -> str:
    return FIX_SIZE.format(floor=fmt_bytes(floor), gib=max(1, int(-(-floor // 2**30))))


def judge_mount(f: ShmFacts) -> list[Finding]:
    """Pure: what is wrong with the filesystem that backs /dev/shm."""
    found: list[Finding] = []
    m = f.mount
    if m is None:
        found.append(Finding(
            Status.WARN, f"cannot tell which filesystem backs {f.path}",
            f"{f.path} matched no mount in /proc/self/mountinfo, so it may not be a tmpfs",
            "check `findmnt /dev/shm`; it should be a tmpfs",
        ))
    elif m.fstype in ("ramfs", "devtmpfs"):
        found.append(Finding(
            Status.WARN, f"{f.path} is {m.fstype}, not its own tmpfs",
            f"{f.path} is on {m.fstype} ({m.mount_point}): memory-backed, but without a size of its own, "
            "so a runaway segment can take all of RAM",
            "mount a tmpfs on /dev/shm (`mount -t tmpfs -o size=...g tmpfs /dev/shm`, or Docker's --shm-size)", act=owner(f),
        ))
    elif m.fstype != "tmpfs":
        found.append(Finding(
            Status.FAIL, f"{f.path} is {m.fstype}, not tmpfs",
            f"{f.path} is on {m.fstype} ({m.source}, mounted at {m.mount_point}), so NCCL's shared-memory buffers would not be backed by RAM",
            "mount a tmpfs on /dev/shm (`mount -t tmpfs -o size=...g tmpfs /dev/shm`, or Docker's --shm-size)", act=owner(f),
        ))
    return found


def beside(f: ShmFacts) -> str | None:
    """Why the free space is not the node's to answer for: other jobs run here."""
    if not f.other_jobs:
        return None
    one = len(f.other_jobs) == 1
    return f"Slurm job{'' if one else 's'} {', '.join(f.other_jobs)} {'runs' if one else 'run'} on this node"


def judge_space(f: ShmFacts, floor: float) -> tuple[list[Finding], list[Measurement]]:
    """Pure: /dev/shm's size and free space against a floor in bytes. A `df` capture
    (preflight explain) is judged by this alone, as the check judges its statvfs.
    The size is what the node offers every job; the free space is judged only where
    no other job runs here: on a node jobs share, what is in use may be theirs."""
    found: list[Finding] = []
    measurements: list[Measurement] = []
    if f.size_bytes is not None:
        measurements.append(Measurement(name="shm_size", unit="bytes", value=f.size_bytes, floor=floor))
        if f.size_bytes < floor:
            docker = " (Docker's default --shm-size)" if f.size_bytes == 64 * 2**20 else ""
            found.append(Finding(
                Status.FAIL, f"{f.path} is {fmt_bytes(f.size_bytes)}, below the {fmt_bytes(floor)} floor",
                f"{f.path} is {fmt_bytes(f.size_bytes)}{docker}; NCCL fails creating its shared-memory segments "
                "or dies of SIGBUS, and DataLoader workers crash", fix_size(floor), act=owner(f),
            ))
    if f.free_bytes is not None and f.other_jobs:
        measurements.append(Measurement(name="shm_free", unit="bytes", value=f.free_bytes))  # no floor: not judged
    elif f.free_bytes is not None:
        measurements.append(Measurement(name="shm_free", unit="bytes", value=f.free_bytes, floor=floor))
        if f.size_bytes is not None and f.size_bytes >= floor > f.free_bytes:
            # Each name quoted: any user chooses it, and "job (8 GiB, owner daemon), x" must not read as two files.
            stale = ", ".join(f"{_quoted(x.name)} ({fmt_bytes(x.bytes)}{_owned_by(f, x.uid)})" for x in f.largest_files)
            used = f.size_bytes - f.free_bytes
            # What the listed files do not hold (subdirectories, smaller files, past the scan) is said too,
            # so the cause never rests on files that hold little of it.
            rest = used - sum(x.bytes for x in f.largest_files)
            elsewhere = f"; {fmt_bytes(rest)} of it in other files or subdirectories" if stale and rest >= 2**20 else ""
            found.append(Finding(
                Status.FAIL, f"only {fmt_bytes(f.free_bytes)} of {f.path} is free, below the {fmt_bytes(floor)} floor",
                f"{fmt_bytes(used)} of {f.path} is in use" + (f"; largest files: {stale}" if stale else "") + elsewhere,
                f"remove stale segments left by crashed jobs (`ls -laS {f.path}`), or make /dev/shm bigger", act=_filled(f),
            ))
    return found, measurements


def _quoted(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)  # a backslash escaped too: no name can close its quotes


def _owned_by(f: ShmFacts, uid: int | None) -> str:
    """Whose a file is, in words: the user who filled /dev/shm is the cause a person acts on."""
    if uid is None:
        return ""
    return f", owner {f.users.get(uid) or f'uid {uid}'}"


def judge_memory(f: ShmFacts, floor: float, space_short: bool = False) -> tuple[list[Finding], list[Measurement]]:
    """Pure: whether the node's memory can back a segment of the floor's size.

    The kernel lets a tmpfs be sized above RAM, and Kubernetes' memory-backed emptyDir and
    many VM images mount /dev/shm so (the H200 VM in tests/fixtures/node/h200-1x-vm: 128 GiB
    on 125.8 GiB), so a size above RAM is no finding. What a new segment can really get is
    the free space (judged by judge_space), the memory the kernel has available, and the
    memory cgroup's headroom (judged in judge): the least of them binds. MemAvailable is not
    judged beside other jobs (what they hold is theirs), nor where the size or the free space
    has already failed (one cause, said once), nor where a memory cgroup limit binds this
    process: in a container /proc/meminfo is the host's (without lxcfs), and the limit's
    headroom, judged in judge, is what a segment here can get."""
    if f.mem_available_bytes is None:
        return [], []
    judged = not f.other_jobs and not space_short and f.cgroup_headroom_bytes is None
    measurements = [Measurement(name="shm_memory_available", unit="bytes", value=f.mem_available_bytes, floor=floor if judged else None)]
    if f.segment_skipped and not judged and not f.other_jobs and not space_short:
        # Under a cgroup limit the host's MemAvailable is not judged, but it stopped the write that
        # proves the backing: the limit says yes, the host says no, and nothing settled it.
        return [Finding(Status.WARN, f"{f.path}'s backing not proven: no segment was written",
                        f"{f.segment_skipped}; this process's memory limit would allow it, the host's memory would not",
                        "free memory on the host (`ps aux --sort=-rss | head`, `ipcs -m`, `df -t tmpfs`), then run again")], measurements
    if not judged or f.mem_available_bytes >= floor:
        return [], measurements
    total = f" of {fmt_bytes(f.mem_total_bytes)}" if f.mem_total_bytes else ""
    return [Finding(
        Status.FAIL, f"only {fmt_bytes(f.mem_available_bytes)} of memory is available to back {f.path}, below the {fmt_bytes(floor)} floor",
        f"the kernel has {fmt_bytes(f.mem_available_bytes)}{total} available (MemAvailable); pages in {f.path} are memory, "
        "so a segment of the floor's size would push the node into swap or the OOM killer, whatever the tmpfs's size says",
        "free memory: stop what holds it (`ps aux --sort=-rss | head`), remove stale files from /dev/shm and other "
        "tmpfs mounts (`df -t tmpfs`) and stale SysV segments (`ipcs -m`, `ipcrm`); or give the node more memory",
        act=HELD if f.mem_total_bytes is not None and f.mem_total_bytes >= floor else None,
    )], measurements


def _shm_switch_owner(f: ShmFacts) -> Next:
    """NCCL_SHM_DISABLE=1 in the environment, a user's ~/.nccl.conf or a container's files is
    the job's setting; in the host's /etc/nccl.conf it is the node's, for every job."""
    if f.container or not any(where.startswith("/etc/") for where in f.shm_disabled_by):
        return Next(Action.FIX_JOB, Domain.JOB, "NCCL_SHM_DISABLE is set in the job's environment or image")
    return Next(Action.WATCH, Domain.SOFTWARE, "NCCL_SHM_DISABLE is set in the node's nccl.conf: every job there inherits it")


def judge(f: ShmFacts, floor: float) -> tuple[list[Finding], list[Measurement]]:
    """Pure: what is wrong with these facts, against a floor in bytes."""
    if not f.exists:
        return [Finding(Status.FAIL, f"{f.path} does not exist", f"{f.path} is missing: NCCL and DataLoader workers cannot create shared memory",
                        fix_size(floor), act=owner(f))], []
    found = judge_mount(f)
    space, measurements = judge_space(f, floor)
    found += space
    if f.mode is not None and f.mode & 0o777 != 0o777:
        found.append(Finding(
            Status.FAIL, f"{f.path} has mode {f.mode:04o}, not world-writable",
            f"only some users can create files in {f.path} (mode {f.mode:04o}); a job that does not run as root fails in shm_open",
            "give /dev/shm mode 1777 (`chmod 1777 /dev/shm`), as every distribution ships it", act=owner(f),
        ))
    if f.free_inodes == 0 and not f.other_jobs:
        found.append(Finding(Status.FAIL, f"{f.path} has no free inodes", f"{f.path} cannot hold another file", f"remove stale files from {f.path}"))
    if f.write_error:
        if f.write_error == "read-only":
            fix = "remount it read-write (`mount -o remount,rw /dev/shm`); in Kubernetes do not mount it readOnly"
        elif f.write_error == "permission denied":
            fix = "give /dev/shm mode 1777 (`chmod 1777 /dev/shm`), as every distribution ships it"
        else:
            fix = f"free space and inodes in {f.path}: remove stale files left by crashed jobs"
        found.append(Finding(
            Status.FAIL, f"{f.path} is not writable ({f.write_error})",
            f"creating a file in {f.path} failed ({f.write_error}); NCCL's shm_open fails the same way", fix,
            act=owner(f) if f.write_error in ("read-only", "permission denied") else None,
        ))
    if f.cgroup_headroom_bytes is not None and f.cgroup_headroom_bytes < floor:
        whose = f"Slurm job {f.limit_of_job}'s" if f.limit_of_job else "the container's" if f.container else "the memory cgroup's"
        raise_it = "ask the job for more memory (--mem) by" if f.limit_of_job else "raise the limit by"
        found.append(Finding(
            Status.FAIL, f"{whose} memory limit leaves {fmt_bytes(max(0, f.cgroup_headroom_bytes))}, below the {fmt_bytes(floor)} floor",
            f"pages in /dev/shm are charged to {whose} memory cgroup, so a segment of the floor's size would be OOM-killed",
            f"{raise_it} at least the /dev/shm floor",
            # In a container the limit is what it was started with (a pod's resources, docker --memory);
            # on the host it is the unit's or the slice's preflight runs in: the node's configuration.
            act=owner(f, shm=False),
        ))
    if f.segment_bytes:
        if f.segment_error and not f.write_error:
            found.append(Finding(
                Status.FAIL, f"a {fmt_bytes(f.segment_bytes)} segment in {f.path} could not be used",
                f"{f.segment_error}: the tmpfs promises more memory than it can back, and NCCL would die of SIGBUS", fix_size(floor),
            ))
        elif f.segment_seconds:
            measurements.append(Measurement(name="shm_segment_duration", unit="seconds", value=f.segment_seconds))
            measurements.append(Measurement(name="shm_write_bandwidth", unit="bytes_per_second", value=f.segment_bytes / f.segment_seconds))
    memory, measured = judge_memory(f, floor, space_short=bool(space))
    found += memory
    measurements += measured
    if f.shm_disabled_by:
        found.append(Finding(
            Status.WARN, f"NCCL_SHM_DISABLE=1 is set ({', '.join(f.shm_disabled_by)})",
            f"NCCL_SHM_DISABLE=1 in {', '.join(f.shm_disabled_by)} {nccl_env.SWITCHES['NCCL_SHM_DISABLE'][1]}",
            "unset NCCL_SHM_DISABLE (it is a debugging switch) and remove it from nccl.conf",
            act=_shm_switch_owner(f),
        ))
    return found, measurements


def backed_by(f: ShmFacts) -> str | None:
    """The figure that says memory backs the floor, where one was judged (not beside other jobs)."""
    if f.other_jobs:
        return None
    if f.cgroup_headroom_bytes is not None:
        return f"the memory limit's headroom ({fmt_bytes(f.cgroup_headroom_bytes)})"
    if f.mem_available_bytes is not None:
        return f"MemAvailable ({fmt_bytes(f.mem_available_bytes)})"
    return None
