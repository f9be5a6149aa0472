"""/dev/shm: mounted, big enough, writable, and really backed by memory.

NCCL's SHM transport and PyTorch's DataLoader workers put their buffers in
/dev/shm. Too small (Docker's 64 MiB default) and NCCL dies creating segments
or takes SIGBUS later; disabled (NCCL_SHM_DISABLE=1) and intra-node traffic
falls back to sockets, which made one real job 14x slower.

The facts and their pure judges are in preflight/checkkit/shm_judges.py; here
the gathering, the floor a run is held to, and the check.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict

from preflight.checkkit.shm_judges import ShmFacts, backed_by, beside, judge
from preflight.readers.system import container, jobs, memory
from preflight.readers.nccl import nccl_env
from preflight.readers.system.shm_mount import largest_files, local_users, mount_of, parse_mountinfo, touch_segment
from preflight.pipeline import floor_bounds
from preflight.pipeline.check import Check, Context, Result
from preflight.base.host import Host
from preflight.base.units import fmt_bytes

SHM = "/dev/shm"


def _shm_disabled_by(host: Host) -> list[str]:
    return [where for value, where in nccl_env.read(host).get("NCCL_SHM_DISABLE", []) if value and nccl_env.nccl_int(value) == 1]


SHARED_SEGMENT = 1 << 20  # bytes written while other jobs run here: writable, without taking their space


def gather(host: Host, segment_bytes: int, deadline: float = math.inf, backs: int | None = None) -> ShmFacts:
    """``segment_bytes``: the segment written. ``backs`` (default: the segment): what the free
    space, MemAvailable and the memory cgroup's headroom must each hold before anything is
    written; past any of them the write is left out and the judge names the figure. Where the
    kernel gives no figure for memory (neither MemAvailable nor a cgroup limit), only a write
    proves the backing, so ``backs`` itself is written."""
    path = host.path(SHM)
    boxed = container.detect(host)
    facts = ShmFacts(path=SHM, exists=path.is_dir(), shm_disabled_by=_shm_disabled_by(host), other_jobs=jobs.others(host),
                     container=boxed, host_ipc=container.host_ipc(host), slurm_node=bool(boxed) and jobs.slurmd_here(host))
    backs = max(segment_bytes, backs or 0)
    if facts.other_jobs:
        segment_bytes, backs = min(segment_bytes, SHARED_SEGMENT), min(backs, SHARED_SEGMENT)
    meminfo = memory.meminfo(host)
    facts.mem_total_bytes, facts.mem_available_bytes = meminfo.get("MemTotal"), meminfo.get("MemAvailable")
    limit = memory.cgroup_limit(host)
    facts.cgroup_headroom_bytes = limit[0] if limit else None
    facts.limit_of_job = memory.slurm_job(limit[1]) if limit else None
    if facts.mem_available_bytes is None and facts.cgroup_headroom_bytes is None:
        segment_bytes = backs
    if not facts.exists:
        return facts
    try:
        mounts = parse_mountinfo(host.read_text("/proc/self/mountinfo"))
        real = "/" + os.path.relpath(os.path.realpath(path), os.path.realpath(host.root))
        facts.mount = mount_of(real, mounts)
    except OSError:
        pass
    facts.mode = path.stat().st_mode & 0o7777
    st = os.statvfs(path)
    if st.f_blocks:  # a tmpfs mounted with size=0 has no limit and reports 0 blocks
        facts.size_bytes = st.f_blocks * st.f_frsize
        facts.free_bytes = st.f_bavail * st.f_frsize
    if st.f_files:  # likewise nr_inodes=0
        facts.free_inodes = st.f_favail
    if st.f_flag & os.ST_RDONLY:
        facts.write_error = "read-only"
        return facts
    if not os.access(path, os.W_OK | os.X_OK):
        facts.write_error = "permission denied"
        return facts
    facts.largest_files = largest_files(path)
    if facts.largest_files:
        try:
            users = local_users(host.read_text("/etc/passwd"))
            facts.users = {f.uid: users[f.uid] for f in facts.largest_files if f.uid in users}
        except OSError:
            pass  # owners said by uid
    too_small = facts.free_bytes is not None and facts.free_bytes < backs
    on_disk = facts.mount is not None and facts.mount.fstype not in ("tmpfs", "ramfs", "devtmpfs")
    if segment_bytes <= 0 or too_small or on_disk:
        return facts  # known already: ENOSPC, or a disk that says nothing about memory
    headroom = facts.cgroup_headroom_bytes
    if headroom is not None and headroom < backs:
        return facts  # writing would summon the OOM killer; the judge reports the limit instead
    if facts.mem_available_bytes is not None and facts.mem_available_bytes < backs:
        # Likewise for the node's memory, under a cgroup limit too: pages past the host's
        # MemAvailable push it into swap or the global OOM killer, which may take a neighbour's job.
        facts.segment_skipped = (f"the node's MemAvailable ({fmt_bytes(facts.mem_available_bytes)}) could not back a "
                                 f"{fmt_bytes(backs)} segment without pushing the host into swap or its OOM killer")
        return facts
    facts.segment_bytes = segment_bytes
    facts.segment_error, facts.segment_seconds = touch_segment(path, segment_bytes, deadline)
    if facts.segment_error and facts.segment_error.startswith("cannot create"):
        facts.write_error = facts.segment_error
    return facts


# The segment written below the full level. It proves what no figure tells: that this tmpfs takes
# a new file, reserves its pages (fallocate: ENOSPC here, not SIGBUS inside NCCL) and lets every
# page be written and read back. Every page comes the same way, so that takes many pages, not the
# floor's worth: 64 MiB is 16384 small pages or 32 huge ones (a huge=always tmpfs), Docker's whole
# default /dev/shm, and 0.04 s at the H200 VM's 1.79 GB/s first-touch rate, where the 16 GiB floor
# took 9.6 s. Whether memory backs the floor is the kernel's to say, and it says so at once: the
# free space (statvfs), MemAvailable and the memory cgroup's headroom, each judged against it.
PROOF_SEGMENT = 64 << 20


LEAST = 1 << 30  # NGC's single-process minimum (cpu.toml's floor): a scaled floor never goes below it


def floor_for(ctx: Context) -> tuple[int, str | None]:
    """The floor in bytes this run is judged by, and how it was scaled (None: as given). A
    profile's floor that provides for N GPUs' ranks (``for_gpus``: an 8-GPU node's NCCL segments
    and DataLoader batches) holds a node that gives the run fewer GPUs (a pod given 1 or 2 of
    them) to that share, never under LEAST. A site's floor (config, calibrate) is the site's
    number for its nodes, and is kept as it is."""
    f = ctx.profile.floors["shm_min_bytes"]
    value, of = int(f.value), f.for_gpus
    gpus = ctx.shape.gpus if ctx.shape is not None and ctx.profile.has_gpus else None
    if of is None or not gpus or gpus >= of or not f.from_profile or value <= LEAST:
        return value, None
    scaled = max(LEAST, value * gpus // of)
    return scaled, f"the profile's {fmt_bytes(value)} for {of} GPUs' ranks, this node gives the run {gpus}"


class Shm(Check):
    name = "shm"
    description = "/dev/shm is a tmpfs, big enough, writable, backed by memory; NCCL_SHM_DISABLE is not set"
    floors = ("shm_min_bytes",)
    floor_units = {"shm_min_bytes": ("bytes", "min")}
    floor_sane = floor_bounds.by_unit(floor_units)
    timeout_seconds = 60.0
    order = 30
    beside_ranks = True  # reads the node: runs while the ranks import torch

    def run(self, ctx: Context) -> Result:
        floor, scaled = floor_for(ctx)
        small = min(floor, PROOF_SEGMENT)
        if ctx.settings.level == "full":
            # Where time is the point (a burn-in's minutes), the floor's whole size is written too: the
            # pages a job's segments would take, faulted in for real (on a VM, from the host: seconds).
            segment, backs = floor, floor
        elif ctx.settings.level == "quick":
            # A prolog's seconds: the figures are judged against the floor; the write needs room for itself alone.
            segment, backs = small, small
        else:
            segment, backs = small, floor  # the figures must hold the floor before the small segment is written
        facts = gather(ctx.host, segment, ctx.deadline, backs)
        findings, measurements = judge(facts, floor)
        fs = facts.mount.fstype if facts.mount else "unknown filesystem"
        if facts.size_bytes is None:
            size = f"{fs} with no size limit"
        else:
            size = f"{fmt_bytes(facts.size_bytes)} {fs}, {fmt_bytes(facts.free_bytes or 0)} free"
        segment = f"; a {fmt_bytes(facts.segment_bytes)} segment was created and written" if facts.segment_bytes else ""
        if facts.segment_bytes and facts.segment_bytes < floor and (by := backed_by(facts)):
            segment += f"; memory for the {fmt_bytes(floor)} floor: {by}"
        if facts.segment_skipped:
            segment = f"; no segment written: {facts.segment_skipped}"
        ok = f"{facts.path}: {size}{segment}"
        if scaled:
            ok += f"; floor {fmt_bytes(floor)}: {scaled}"
        if why := beside(facts):
            ok += f"; the free space is not judged: {why}"
        return self.conclude(findings, ok, measurements=measurements, details=asdict(facts))
