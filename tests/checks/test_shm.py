"""The shm check: the judge on recorded facts, the gatherer on recorded files
and on real tmpfs mounts in a private mount namespace."""

import json
import os
import re
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import FIXTURES, make_ctx, needs_root

import fakes
from preflight.base.actions import Action
from preflight.base.findings import Status
from preflight.checkkit import shm_judges
from preflight.checkkit.shm_judges import ShmFacts, judge
from preflight.checks import shm
from preflight.readers.system import container, memory
from preflight.readers.system.shm_mount import Mount, ShmFile
from preflight.base.host import Host
from preflight.base.units import fmt_bytes
from preflight.pipeline.check import Context
from preflight.pipeline.report import Report
from preflight.pipeline.settings import Settings

GiB, MiB = 2**30, 2**20
UNIT = Path("/sys/fs/cgroup/system.slice/preflight.service")  # a cgroup no Slurm job's: the node's unit


def healthy(**kw) -> ShmFacts:
    base = dict(
        path="/dev/shm", exists=True, mount=Mount("/dev/shm", "tmpfs", "tmpfs", ["rw", "size=32g"]),
        size_bytes=32 * GiB, free_bytes=32 * GiB, free_inodes=1000, mode=0o1777, mem_total_bytes=64 * GiB,
        segment_bytes=GiB, segment_seconds=0.5,
    )
    return ShmFacts(**{**base, **kw})


def statuses(findings):
    return [f.status for f in findings]


# --- the judge, on recorded facts ---------------------------------------------

def test_healthy_tmpfs_has_no_findings_and_reports_its_figures():
    findings, ms = judge(healthy(), GiB)
    assert findings == []
    by_name = {m.name: m for m in ms}
    assert by_name["shm_size"].value == 32 * GiB and by_name["shm_size"].floor == GiB
    assert by_name["shm_write_bandwidth"].value == 2 * GiB and by_name["shm_write_bandwidth"].unit == "bytes_per_second"


def test_docker_default_64m_from_a_real_container_fails_naming_size_and_fix():
    # df -h inside a Docker container on a GH200 host (tests/fixtures/df/SOURCE.md)
    text = (FIXTURES / "df" / "shm_01_docker-default-64M_df-h_gh200-container.txt").read_text()
    source, size = next(line.split()[:2] for line in text.splitlines() if line.endswith(" /dev/shm"))
    assert (source, size) == ("shm", "64M")
    facts = healthy(mount=Mount("/dev/shm", "tmpfs", source, ["rw", "size=65536k"]), size_bytes=64 * MiB, free_bytes=64 * MiB, segment_bytes=0)
    findings, _ = judge(facts, GiB)
    assert statuses(findings) == [Status.FAIL]
    f = findings[0]
    assert f.summary == "/dev/shm is 64 MiB, below the 1 GiB floor"
    assert "Docker's default" in f.cause and "SIGBUS" in f.cause
    assert "--shm-size=1g" in f.remedy and "medium: Memory" in f.remedy


def test_full_tmpfs_fails_and_names_the_largest_files_and_their_owners():
    files = [ShmFile("nccl-LEFTOVER", 30 * GiB, 1001), ShmFile("psm_x", GiB, 123456), ShmFile("old", MiB)]
    facts = healthy(free_bytes=100 * MiB, largest_files=files, users={1001: "alice"}, segment_bytes=0)
    (f,), _ = judge(facts, GiB)
    assert f.status is Status.FAIL and "only 100 MiB of /dev/shm is free" in f.summary
    assert '"nccl-LEFTOVER" (30 GiB, owner alice), "psm_x" (1 GiB, owner uid 123456), "old" (1 MiB)' in f.cause and "stale segments" in f.remedy


def test_a_full_tmpfs_cause_cannot_be_made_to_blame_another_user():
    """Any user names their files: one called `job (8.0 GiB, owner daemon), x` read as daemon's 8 GiB, and
    50 MB in a subdirectory the scan never enters went unsaid while root was pointed at daemon's files."""
    files = [ShmFile("job (8.0 GiB, owner daemon), x", 8 * 1024, 65534), ShmFile("torch_12345", 4096, 1)]
    facts = healthy(size_bytes=GiB + 60 * MiB, free_bytes=GiB - 50 * MiB, largest_files=files, users={65534: "nobody", 1: "daemon"}, segment_bytes=0)
    (f,), _ = judge(facts, GiB)
    assert '"job (8.0 GiB, owner daemon), x" (8 KiB, owner nobody), "torch_12345" (4 KiB, owner daemon)' in f.cause
    assert "of it in other files or subdirectories" in f.cause
    sly = healthy(size_bytes=GiB + 60 * MiB, free_bytes=GiB - 50 * MiB, largest_files=[ShmFile('job\\" (60 GiB, owner root), "z', 4096, 65534)],
                  users={65534: "nobody"}, segment_bytes=0)
    (f,), _ = judge(sly, GiB)
    assert '"job\\\\\\" (60 GiB, owner root), \\"z" (4 KiB, owner nobody)' in f.cause  # its backslash and quotes escaped


@needs_root
def test_a_full_dev_shm_names_who_filled_it():
    # Any user can fill the host's /dev/shm: the drain is right (a job's segments would not fit), and
    # its cause says whose files hold the space, read from /etc/passwd (no directory service asked).
    setup = ("mount -t tmpfs -o size=1200m tmpfs /dev/shm && fallocate -l 1100m /dev/shm/leftover "
             "&& chown nobody /dev/shm/leftover")
    p = in_private_shm(setup, "run --profile cpu --only shm")
    assert p.returncode == 1, p.stderr
    assert re.search(r'largest files: "leftover" \([0-9.]+ GiB, owner nobody\)', p.stderr), p.stderr


def test_a_filled_or_memory_short_host_shm_is_software_that_no_lemon_counts():
    """Was: the free-space FAIL took the default act, a drain in the node's domain, so any user
    who filled the host's /dev/shm before three hourly rechecks (deleting it between) made the
    history call a healthy node a lemon, and slurm-healthcheck sent it for hardware service."""
    from preflight.base.actions import Domain

    (full,), _ = judge(healthy(free_bytes=100 * MiB, segment_bytes=0), GiB)
    assert (full.next.action, full.next.domain) == (Action.DRAIN, Domain.SOFTWARE)
    (short,), _ = judge(healthy(mem_available_bytes=512 * MiB, segment_bytes=0), GiB)
    assert (short.next.action, short.next.domain) == (Action.DRAIN, Domain.SOFTWARE)
    # A node with less memory than the floor in all holds no files to blame: the node's own.
    (small,), _ = judge(healthy(mem_total_bytes=768 * MiB, mem_available_bytes=512 * MiB, segment_bytes=0), GiB)
    assert small.next.domain == Domain.NODE
    # A container's own /dev/shm, filled, is its job's.
    (job,), _ = judge(healthy(free_bytes=100 * MiB, segment_bytes=0, container="docker"), GiB)
    assert job.next.action == Action.FIX_JOB


def test_disk_backed_dev_shm_fails():
    facts = healthy(mount=Mount("/dev/shm", "ext4", "/dev/vda", ["rw"]))
    (f,), _ = judge(facts, GiB)
    assert f.status is Status.FAIL and f.summary == "/dev/shm is ext4, not tmpfs"


def test_read_only_fails():
    facts = healthy(mount=Mount("/dev/shm", "tmpfs", "tmpfs", ["ro"]), write_error="read-only", segment_bytes=0)
    (f,), _ = judge(facts, GiB)
    assert f.status is Status.FAIL and "not writable (read-only)" in f.summary and "remount" in f.remedy


def test_a_full_inode_table_is_not_told_to_remount():
    facts = healthy(free_inodes=0, write_error="cannot create /dev/shm/x: No space left on device", segment_bytes=0)
    findings, _ = judge(facts, GiB)
    assert all("remount" not in f.remedy for f in findings)
    assert any("remove stale files" in f.remedy for f in findings)


def test_not_world_writable_fails_for_non_root_jobs():
    (f,), _ = judge(healthy(mode=0o700), GiB)
    assert f.status is Status.FAIL and "mode 0700" in f.summary and "chmod 1777" in f.remedy
    assert judge(healthy(mode=0o777), GiB)[0] == []  # Kubernetes emptyDir: no sticky bit, still fine


def test_unlimited_tmpfs_is_judged_by_the_segment_alone():
    findings, ms = judge(healthy(size_bytes=None, free_bytes=None, free_inodes=None), GiB)
    assert findings == [] and "shm_size" not in {m.name for m in ms}


@pytest.mark.parametrize("fstype", ["ramfs", "devtmpfs"])
def test_memory_backed_but_not_a_tmpfs_of_its_own_warns(fstype):
    (f,), _ = judge(healthy(mount=Mount("/dev", fstype, fstype, ["rw"])), GiB)
    assert f.status is Status.WARN and "memory-backed" in f.cause


def test_a_shortfall_of_4k_is_not_rounded_away():
    (f,), _ = judge(healthy(free_bytes=GiB - 4096, segment_bytes=0), GiB)
    assert f.summary.startswith("only 1023.9 MiB of /dev/shm is free")


def test_unknown_filesystem_warns_rather_than_claiming_tmpfs():
    (f,), _ = judge(healthy(mount=None), GiB)
    assert f.status is Status.WARN and "cannot tell which filesystem" in f.summary


# --- a node jobs share: what the node offers, not what the other jobs use ------------

def test_beside_another_job_the_free_space_and_inodes_are_reported_not_judged():
    facts = healthy(size_bytes=1536 * MiB, free_bytes=736 * MiB, free_inodes=0, largest_files=[ShmFile("job-a", 800 * MiB)],
                    segment_bytes=MiB, other_jobs=["41"])
    findings, ms = judge(facts, GiB)
    assert findings == []
    free = next(m for m in ms if m.name == "shm_free")
    assert free.value == 736 * MiB and free.floor is None  # no floor: no metric says it is past one
    assert shm_judges.beside(facts) == "Slurm job 41 runs on this node"
    assert shm_judges.beside(healthy(other_jobs=["41", "57"])) == "Slurm jobs 41, 57 run on this node"
    # The same facts with no other job here: leftovers, judged.
    (f,), _ = judge(healthy(size_bytes=1536 * MiB, free_bytes=736 * MiB, largest_files=[ShmFile("job-a", 800 * MiB)], segment_bytes=0), GiB)
    assert f.status is Status.FAIL and f.summary == "only 736 MiB of /dev/shm is free, below the 1 GiB floor"


def test_beside_another_job_what_the_node_offers_is_still_judged():
    # Too small for any job, on disk, or read-only: the node's own fault, whoever runs on it.
    for facts, summary in (
        (healthy(size_bytes=64 * MiB, free_bytes=10 * MiB, segment_bytes=0), "/dev/shm is 64 MiB, below the 1 GiB floor"),
        (healthy(mount=Mount("/dev/shm", "ext4", "/dev/vda", ["rw"])), "/dev/shm is ext4, not tmpfs"),
        (healthy(write_error="read-only", segment_bytes=0), "/dev/shm is not writable (read-only)"),
        (healthy(mode=0o700), "/dev/shm has mode 0700, not world-writable"),
    ):
        (f,), _ = judge(ShmFacts(**{**facts.__dict__, "other_jobs": ["41"]}), GiB)
        assert (f.status, f.summary) == (Status.FAIL, summary)


def test_missing_dev_shm_fails():
    (f,), _ = judge(ShmFacts(path="/dev/shm", exists=False), GiB)
    assert f.status is Status.FAIL and f.summary == "/dev/shm does not exist"


def test_tmpfs_that_cannot_back_its_size_fails():
    facts = healthy(segment_error="could not reserve and write 1 GiB: No space left on device", segment_seconds=None)
    (f,), _ = judge(facts, GiB)
    assert f.status is Status.FAIL and "SIGBUS" in f.cause


def test_container_memory_limit_below_the_floor_fails():
    facts = healthy(cgroup_headroom_bytes=200 * MiB, segment_bytes=0)
    (f,), _ = judge(facts, GiB)
    assert f.status is Status.FAIL and "memory limit leaves 200 MiB" in f.summary


def h200_vm_shm() -> ShmFacts:
    """The H200 VM's own /dev/shm as 0.2.0 gathered it (tests/fixtures/node/h200-1x-vm/report-quick-keep-going.json):
    the top of two stacked tmpfs mounts, 128 GiB on 125.8 GiB of RAM; MemAvailable 125 GiB is
    `free -g`'s available column in node-facts.txt, which 0.2.0 did not gather."""
    report = json.loads((FIXTURES / "node" / "h200-1x-vm" / "report-quick-keep-going.json").read_text())
    details = dict(next(c for c in report["checks"] if c["check"] == "shm")["details"])
    details["mount"] = Mount(**details["mount"])
    return ShmFacts(**details, mem_available_bytes=125 * GiB)


def test_a_tmpfs_sized_above_ram_is_no_finding_while_memory_backs_the_floor():
    facts = h200_vm_shm()
    assert facts.size_bytes == 128 * GiB > facts.mem_total_bytes
    assert judge(facts, 16 * GiB)[0] == []  # h200-sxm's floor; the VM's cgroup limit left 124.9 GiB
    findings, ms = judge(replace(facts, cgroup_headroom_bytes=None), 16 * GiB)  # the same node with no memory cgroup limit
    assert findings == []
    available = next(m for m in ms if m.name == "shm_memory_available")
    assert (available.value, available.floor) == (125 * GiB, 16 * GiB)


def test_too_little_memory_to_back_the_floor_fails_whatever_the_size_says():
    (f,), _ = judge(replace(h200_vm_shm(), mem_available_bytes=6 * GiB, cgroup_headroom_bytes=None, segment_bytes=0), 16 * GiB)
    assert f.status is Status.FAIL
    assert f.summary == "only 6 GiB of memory is available to back /dev/shm, below the 16 GiB floor"
    assert "MemAvailable" in f.cause and "125.8 GiB" in f.cause and "ipcs -m" in f.remedy


def test_a_slurm_jobs_memory_request_short_of_the_floor_is_the_jobs_to_fix_not_a_drain():
    """Was: run inside a job step (or a prolog in the job's cgroup, PrologFlags=Contain) whose --mem
    left too little room, "the container's memory limit" FAILed with a drain: the node was blamed
    for what the job asked for."""
    facts = healthy(cgroup_headroom_bytes=int(1.5 * GiB), limit_of_job="4242")
    (fail,) = [x for x in judge(facts, 2 * GiB)[0] if x.status is Status.FAIL]
    assert fail.summary == "Slurm job 4242's memory limit leaves 1.5 GiB, below the 2 GiB floor"
    assert fail.act.action is Action.FIX_JOB and "--mem" in fail.remedy and "--mem" in fail.act.source
    # A container inside the job (pyxis), or soperator's pod that runs slurmd: the job's --mem still binds.
    for boxed in (healthy(cgroup_headroom_bytes=int(1.5 * GiB), limit_of_job="4242", container="pyxis"),
                  healthy(cgroup_headroom_bytes=int(1.5 * GiB), limit_of_job="4242", container="kubernetes", slurm_node=True)):
        (fail,) = [x for x in judge(boxed, 2 * GiB)[0] if x.status is Status.FAIL]
        assert fail.summary.startswith("Slurm job 4242's memory limit") and fail.act.action is Action.FIX_JOB
    unit = healthy(cgroup_headroom_bytes=int(1.5 * GiB))  # the unit's or slice's limit: the node's
    (fail,) = [x for x in judge(unit, 2 * GiB)[0] if x.status is Status.FAIL]
    assert fail.summary.startswith("the memory cgroup's memory limit leaves") and fail.act.action is Action.DRAIN
    assert [memory.slurm_job(Path(p)) for p in ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
                                                "/slurm/uid_1000/job_77/step_extern", "/system.slice")] == ["4242", "77", None]


def test_no_segment_is_written_past_the_hosts_memavailable_under_a_cgroup_limit_either(monkeypatch):
    """A job step or pod with room under its limit on a host short of memory: writing would push
    the host into swap or its OOM killer, which may take a neighbour's job. Not written, and said."""
    monkeypatch.setattr(memory, "meminfo", lambda host: {"MemTotal": 64 * GiB, "MemAvailable": 10 * MiB})
    monkeypatch.setattr(memory, "cgroup_limit", lambda host: (8 * GiB, UNIT))
    facts = shm.gather(Host(), 64 * MiB)
    assert facts.segment_bytes == 0 and "MemAvailable (10 MiB) could not back a 64 MiB segment" in facts.segment_skipped
    (warn,) = judge(facts, 64 * MiB)[0]  # the host's figure is not judged under a limit, but the proof is missing
    assert warn.status is Status.WARN and "not proven" in warn.summary and "memory limit would allow it" in warn.cause


def test_under_a_memory_limit_the_hosts_memavailable_is_reported_not_judged():
    """A pod on a shared Kubernetes node: /proc/meminfo is the host's, lowered by neighbours
    above their requests; this pod's limit leaves it room for the floor, which is what binds."""
    findings, ms = judge(healthy(mem_available_bytes=6 * GiB, cgroup_headroom_bytes=20 * GiB), 16 * GiB)
    assert findings == [] and next(m for m in ms if m.name == "shm_memory_available").floor is None


def test_available_memory_is_not_judged_beside_other_jobs_nor_twice_with_the_free_space():
    findings, ms = judge(healthy(mem_available_bytes=100 * MiB, other_jobs=["41"]), GiB)
    assert findings == [] and next(m for m in ms if m.name == "shm_memory_available").floor is None
    (f,), _ = judge(healthy(free_bytes=100 * MiB, mem_available_bytes=100 * MiB, segment_bytes=0), GiB)
    assert f.summary == "only 100 MiB of /dev/shm is free, below the 1 GiB floor"


def test_no_segment_is_written_where_memory_cannot_back_it(monkeypatch):
    monkeypatch.setattr(memory, "meminfo", lambda host: {"MemTotal": 64 * GiB, "MemAvailable": 10 * MiB})
    monkeypatch.setattr(memory, "cgroup_limit", lambda host: None)
    facts = shm.gather(Host(), 64 * MiB)
    assert facts.mem_available_bytes == 10 * MiB and facts.segment_bytes == 0 and facts.segment_error is None


def test_below_full_the_figures_must_hold_the_floor_before_the_small_segment_is_written(monkeypatch):
    """The standard level writes 64 MiB, but only once the free space, the cgroup's headroom and
    MemAvailable each hold the floor, as the floor's own write asked: the host short of the floor
    under a limit with room is the same warning the 1 GiB write gave, not a pass on 64 MiB."""
    monkeypatch.setattr(memory, "meminfo", lambda host: {"MemTotal": 64 * GiB, "MemAvailable": 512 * MiB})
    monkeypatch.setattr(memory, "cgroup_limit", lambda host: (8 * GiB, UNIT))
    facts = shm.gather(Host(), 64 * MiB, backs=GiB)
    assert facts.segment_bytes == 0 and "MemAvailable (512 MiB) could not back a 1 GiB segment" in facts.segment_skipped
    (warn,) = judge(facts, GiB)[0]
    assert warn.status is Status.WARN and "not proven" in warn.summary
    monkeypatch.setattr(memory, "cgroup_limit", lambda host: (512 * MiB, UNIT))  # the limit itself short: FAIL, nothing written
    facts = shm.gather(Host(), 64 * MiB, backs=GiB)
    assert facts.segment_bytes == 0 and facts.segment_skipped is None
    (fail,) = judge(facts, GiB)[0]
    assert fail.status is Status.FAIL and "memory limit leaves 512 MiB" in fail.summary


def test_where_no_figure_says_what_memory_backs_the_floors_size_is_written(monkeypatch):
    # No MemAvailable and no cgroup limit: only a write of the whole proves the backing.
    monkeypatch.setattr(memory, "meminfo", lambda host: {})
    monkeypatch.setattr(memory, "cgroup_limit", lambda host: None)
    facts = shm.gather(Host(), 64 * MiB, backs=128 * MiB)
    assert facts.segment_bytes == 128 * MiB and facts.segment_error is None, facts


def test_nccl_shm_disable_warns_with_the_cost():
    (f,), _ = judge(healthy(shm_disabled_by=["the environment", "/etc/nccl.conf"]), GiB)
    assert f.status is Status.WARN
    assert "14x slower" in f.cause and "/etc/nccl.conf" in f.summary


# --- gatherer pieces, on recorded files (the readers': tests/readers/test_shm_mount.py, test_memory.py)

def test_nccl_shm_disable_found_in_env_and_nccl_conf(tmp_path):
    (tmp_path / "etc").mkdir()
    # As NCCL reads the file: the name up to "=" as written, the value by strtol ("1  # debugging" is 1).
    (tmp_path / "etc" / "nccl.conf").write_text("# site\nNCCL_DEBUG=WARN\nNCCL_SHM_DISABLE=1  # debugging\n")
    host = Host(root=tmp_path, environ={"NCCL_SHM_DISABLE": "1", "NCCL_CONF_FILE": "/nonexistent.conf"})
    assert shm._shm_disabled_by(host) == ["the environment", "/etc/nccl.conf"]
    assert shm._shm_disabled_by(Host(root=tmp_path, environ={"NCCL_SHM_DISABLE": "0", "NCCL_CONF_FILE": "/x"})) == ["/etc/nccl.conf"]


# --- real runs ------------------------------------------------------------------

def test_a_zero_floor_writes_no_segment():
    r = shm.Shm().run(make_ctx({"shm_min_bytes": 0}))
    assert r.status in (Status.PASS, Status.WARN) and "segment" not in r.summary
    assert r.details["segment_bytes"] == 0


def test_passes_on_this_hosts_dev_shm_and_leaves_nothing_behind():
    before = set(os.listdir("/dev/shm"))
    r = shm.Shm().run(make_ctx({"shm_min_bytes": 64 * MiB}))
    assert r.status in (Status.PASS, Status.WARN), r
    assert {m.name for m in r.measurements} >= {"shm_size", "shm_free", "shm_segment_duration"}
    assert set(os.listdir("/dev/shm")) == before


def test_standard_writes_a_small_segment_and_full_the_floors_size():
    before = set(os.listdir("/dev/shm"))
    ctx = make_ctx({"shm_min_bytes": 256 * MiB})
    r = shm.Shm().run(ctx)  # no level: standard
    assert r.status in (Status.PASS, Status.WARN), r
    assert r.details["segment_bytes"] == shm.PROOF_SEGMENT == 64 * MiB
    if r.status is Status.PASS:
        assert "; memory for the 256 MiB floor: " in r.summary
    ctx.settings.level = "full"
    r = shm.Shm().run(ctx)
    assert r.details["segment_bytes"] == 256 * MiB and "256 MiB segment was created and written" in r.summary
    assert set(os.listdir("/dev/shm")) == before


def in_private_shm(setup: str, args: str, env: dict | None = None, ipc: bool = False) -> subprocess.CompletedProcess:
    """Run preflight in its own mount namespace after ``setup`` remounts /dev/shm, and in a PID
    namespace of its own: it sees the Slurm jobs ``setup`` starts, not those running elsewhere
    on this machine (another test's cluster), which would make any /dev/shm a shared one.
    ``ipc``: in an IPC namespace of its own too, as a container is unless started with --ipc=host."""
    cmd = f"{setup} && exec {' '.join(map(shlex.quote, fakes.PREFLIGHT))} {args}"
    return subprocess.run(["unshare", "--mount", "--pid", *(["--ipc"] if ipc else []), "--fork", "--mount-proc", "sh", "-c", cmd],
                          capture_output=True, text=True, timeout=120, env=env)


def slurm_job(tmp_path: Path, job: str) -> str:
    """Shell that leaves a process titled as Slurm job ``job``'s batch slurmstepd running
    (the kernel names it after its file), as a job's step shows in /proc."""
    stepd = tmp_path / "slurmstepd"
    stepd.write_bytes(Path("/bin/sleep").read_bytes())
    stepd.chmod(0o755)
    started = f"{{ bash -c 'exec -a \"slurmstepd: [{job}.batch]\" {stepd} 300' & }}"
    return f"{started} && until pgrep -x slurmstepd >/dev/null; do sleep 0.05; done"  # titled before preflight looks


@needs_root
def test_docker_sized_64m_dev_shm_exits_1_naming_the_size_and_the_fix():
    p = in_private_shm("mount -t tmpfs -o size=64m tmpfs /dev/shm", "run --profile cpu --only shm")
    assert p.returncode == 1, p.stderr
    assert "/dev/shm is 64 MiB, below the 1 GiB floor" in p.stderr
    assert "--shm-size=1g" in p.stderr


@needs_root
def test_a_containers_64m_dev_shm_is_the_jobs_to_fix():
    # As Podman starts a container, its /run holds .containerenv (this machine may be a Docker
    # container already: then /.dockerenv says so first).
    setup = "mount -t tmpfs -o size=64m tmpfs /dev/shm && mount -t tmpfs tmpfs /run && touch /run/.containerenv"
    p = in_private_shm(setup, "run --profile cpu --only shm --json", ipc=True)
    assert p.returncode == 1, p.stderr
    report = Report.model_validate_json(p.stdout)
    assert (report.action.value, report.domain.value, report.action_check) == ("fix-job", "job", "shm")
    assert report.action_source.startswith("in a container (") and "its /dev/shm is what the job was started with" in report.action_source


@needs_root
@pytest.mark.skipif(os.stat("/proc/self/ns/ipc").st_ino != container.INIT_IPC_INO, reason="this machine is not in the host's IPC namespace itself")
def test_a_container_started_with_ipc_host_has_the_hosts_dev_shm_and_a_small_one_is_the_nodes():
    # docker run --ipc=host (a pod's hostIPC): the container shares the host's IPC namespace,
    # and the runtime mounts the host's /dev/shm in: its size is the node's configuration.
    setup = "mount -t tmpfs -o size=64m tmpfs /dev/shm && mount -t tmpfs tmpfs /run && touch /run/.containerenv"
    p = in_private_shm(setup, "run --profile cpu --only shm --json")
    assert p.returncode == 1, p.stderr
    report = Report.model_validate_json(p.stdout)
    assert (report.action.value, report.domain.value) == ("drain", "software")
    assert "shares the host's IPC namespace (--ipc=host, hostIPC): its /dev/shm is the host's" in report.action_source


def test_the_same_small_dev_shm_on_the_host_is_the_nodes_configuration(tmp_path):
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    facts = shm.gather(Host(tmp_path, environ={}), 0)
    assert facts.container is None
    (f,), _ = judge(healthy(size_bytes=64 * MiB, free_bytes=64 * MiB, segment_bytes=0, container=facts.container), GiB)
    assert f.status is Status.FAIL and (f.next.action.value, f.next.domain.value) == ("drain", "software")
    (tmp_path / ".dockerenv").write_text("")
    assert shm.gather(Host(tmp_path, environ={}), 0).container == "Docker (/.dockerenv)"


def test_nccl_shm_disable_is_the_jobs_setting_unless_the_hosts_nccl_conf_sets_it():
    (env,), _ = judge(healthy(shm_disabled_by=["the environment"]), GiB)
    assert (env.status, env.next.action.value, env.next.domain.value) == (Status.WARN, "fix-job", "job")
    (conf,), _ = judge(healthy(shm_disabled_by=["/etc/nccl.conf"]), GiB)
    assert (conf.next.action.value, conf.next.domain.value) == ("watch", "software")
    (boxed,), _ = judge(healthy(shm_disabled_by=["/etc/nccl.conf"], container="Docker (/.dockerenv)"), GiB)
    assert boxed.next.domain.value == "job"


def test_a_memory_limit_below_the_floor_is_the_containers_in_one_and_the_nodes_on_the_host():
    (f,), _ = judge(healthy(cgroup_headroom_bytes=100 * MiB, segment_bytes=0, container="Docker (/.dockerenv)"), GiB)
    assert f.status is Status.FAIL and (f.next.action.value, f.next.domain.value) == ("fix-job", "job")
    (f,), _ = judge(healthy(cgroup_headroom_bytes=100 * MiB, segment_bytes=0), GiB)  # the unit's or slice's limit
    assert (f.next.action.value, f.next.domain.value) == ("drain", "software")


def test_whose_a_containers_small_dev_shm_and_memory_limit_are_by_how_the_container_was_started():
    small = {"size_bytes": 64 * MiB, "free_bytes": 64 * MiB, "segment_bytes": 0, "container": "Docker (/.dockerenv)"}
    tight = {"cgroup_headroom_bytes": 100 * MiB, "segment_bytes": 0, "container": "Docker (/.dockerenv)"}
    whose = {}
    for how, extra in (("own", {}), ("ipc=host", {"host_ipc": True}), ("slurmd", {"slurm_node": True})):
        (shm_f,), _ = judge(healthy(**small, **extra), GiB)
        (mem_f,), _ = judge(healthy(**tight, **extra), GiB)
        whose[how] = (shm_f.next.action.value, mem_f.next.action.value)
    # --ipc=host mounts the host's /dev/shm in, but the memory limit is still the container's;
    # a container that runs slurmd (soperator's worker pod) is the node, both are its configuration.
    assert whose == {"own": ("fix-job", "fix-job"), "ipc=host": ("drain", "fix-job"), "slurmd": ("drain", "drain")}
    (f,), _ = judge(healthy(**tight, slurm_node=True), GiB)
    assert f.next.source == "in a container (Docker (/.dockerenv)) that runs slurmd, a Slurm node in a pod (as soperator's): its memory limit is every job's here, the node's configuration"


@needs_root
def test_read_only_dev_shm_fails():
    p = in_private_shm("mount -t tmpfs -o ro,size=2g tmpfs /dev/shm", "run --profile cpu --only shm --json")
    assert p.returncode == 1
    (r,) = Report.model_validate_json(p.stdout).checks
    assert r.status is Status.FAIL and "not writable (read-only)" in r.summary


@needs_root
def test_nearly_full_dev_shm_fails_naming_the_leftover():
    setup = "mount -t tmpfs -o size=1200m tmpfs /dev/shm && head -c 700M /dev/zero > /dev/shm/nccl-stale-segment"
    p = in_private_shm(setup, "run --profile cpu --only shm --json")
    assert p.returncode == 1
    (r,) = Report.model_validate_json(p.stdout).checks
    assert "of /dev/shm is free, below the 1 GiB floor" in r.summary
    assert '"nccl-stale-segment" (700 MiB, owner root)' in r.cause


@needs_root
def test_another_jobs_files_are_not_judged_as_the_nodes_and_not_taken_from(tmp_path):
    # A 1.5 GiB tmpfs with 800 MiB of job 41's data in it, job 41 still running: the node offers
    # 1.5 GiB, above the 1 GiB floor; the 736 MiB left is reported, and only 1 MiB is written.
    setup = f"mount -t tmpfs -o size=1536m tmpfs /dev/shm && head -c 800M /dev/zero > /dev/shm/job-41-data && {slurm_job(tmp_path, '41')}"
    p = in_private_shm(setup, "run --profile cpu --level quick --json")
    assert p.returncode == 0, p.stderr
    (r,) = Report.model_validate_json(p.stdout).checks
    assert r.status is Status.PASS and r.details["other_jobs"] == ["41"]
    assert r.summary == ("/dev/shm: 1.5 GiB tmpfs, 736 MiB free; a 1 MiB segment was created and written; "
                         "the free space is not judged: Slurm job 41 runs on this node")
    # The job the run serves (a prolog's SLURM_JOB_ID) is not another: its node is idle, and the data a leftover.
    p = in_private_shm(setup, "run --profile cpu --level quick --json", env={**os.environ, "SLURM_JOB_ID": "41"})
    assert p.returncode == 1, p.stderr
    (r,) = Report.model_validate_json(p.stdout).checks
    assert r.summary == "only 736 MiB of /dev/shm is free, below the 1 GiB floor" and '"job-41-data" (800 MiB, owner root)' in r.cause


@needs_root
def test_a_dev_shm_too_small_for_any_job_fails_beside_another_job_too(tmp_path):
    p = in_private_shm(f"mount -t tmpfs -o size=64m tmpfs /dev/shm && {slurm_job(tmp_path, '41')}", "run --profile cpu --level quick")
    assert p.returncode == 1, p.stderr
    assert "/dev/shm is 64 MiB, below the 1 GiB floor" in p.stderr


@needs_root
def test_disk_directory_bind_mounted_on_dev_shm_fails(tmp_path):
    p = in_private_shm(f"mount --bind {tmp_path} /dev/shm", "run --profile cpu --only shm --json")
    assert p.returncode == 1
    (r,) = Report.model_validate_json(p.stdout).checks
    assert "not tmpfs" in r.summary


@needs_root
@pytest.mark.parametrize("options", ["size=2g,nr_inodes=0", "size=0"])
def test_unlimited_tmpfs_options_pass(options):
    # The standard level writes the small segment; the kernel's memory figure backs the 1 GiB floor.
    p = in_private_shm(f"mount -t tmpfs -o {options} tmpfs /dev/shm", "run --profile cpu --only shm --json")
    assert p.returncode == 0, p.stderr
    (r,) = Report.model_validate_json(p.stdout).checks
    assert r.status is Status.PASS and "64 MiB segment was created and written; memory for the 1 GiB floor: " in r.summary
    if options == "size=0":  # no size for statvfs to give: the full level writes the floor's whole size
        p = in_private_shm(f"mount -t tmpfs -o {options} tmpfs /dev/shm", "run --profile cpu --level full --only shm --json")
        assert p.returncode == 0, p.stderr
        (r,) = Report.model_validate_json(p.stdout).checks
        assert r.status is Status.PASS and "1 GiB segment was created and written" in r.summary


@needs_root
def test_big_enough_private_tmpfs_passes_and_nccl_shm_disable_warns():
    env = {**os.environ, "NCCL_SHM_DISABLE": "1"}
    p = in_private_shm("mount -t tmpfs -o size=2g tmpfs /dev/shm", "run --profile cpu --only shm --json", env=env)
    assert p.returncode == 0, p.stderr
    (r,) = json.loads(p.stdout)["checks"]
    assert r["status"] == "WARN" and "NCCL_SHM_DISABLE=1" in r["summary"]
    assert "14x slower" in r["cause"]


@needs_root
def test_a_private_tmpfs_sized_at_twice_this_machines_ram_passes_without_a_warning():
    # As the H200 VM mounts it: the kernel allows a tmpfs above RAM, and only what memory backs is judged.
    total_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
    p = in_private_shm(f"mount -t tmpfs -o size={2 * total_kib}k tmpfs /dev/shm", "run --profile cpu --only shm --json")
    assert p.returncode == 0, p.stderr
    (r,) = json.loads(p.stdout)["checks"]
    assert r["status"] == "PASS", r["summary"]
    assert r["details"]["size_bytes"] > r["details"]["mem_total_bytes"]
    assert "64 MiB segment was created and written; memory for the 1 GiB floor: " in r["summary"]


@needs_root
def test_the_quick_level_writes_a_small_segment_and_still_fails_a_64m_dev_shm(tmp_path):
    # A 2 GiB tmpfs passes at quick with a 64 MiB segment written, not the 1 GiB floor's.
    p = in_private_shm("mount -t tmpfs -o size=2g tmpfs /dev/shm", f"run --profile cpu --level quick --json --report {tmp_path / 'a.json'}")
    assert p.returncode == 0, p.stderr
    (r,) = json.loads(p.stdout)["checks"]
    assert r["status"] == "PASS" and "64 MiB segment was created and written" in r["summary"]
    # The size is judged from statvfs alone: Docker's 64 MiB still fails, naming the floor.
    p = in_private_shm("mount -t tmpfs -o size=64m tmpfs /dev/shm", f"run --profile cpu --level quick --report {tmp_path / 'b.json'}")
    assert p.returncode == 1, p.stderr
    assert "/dev/shm is 64 MiB, below the 1 GiB floor" in p.stderr


@pytest.mark.gpu
def test_on_a_gpu_node_the_standard_level_writes_64_mib_against_the_profiles_floor():
    """The GPU profile's floor (16 GiB on H100/H200) is held by the kernel's figures, and 64 MiB is written:
    where the floor's own write took 10.6 s of the H200 VM's standard run (issue 34). Prints the seconds."""
    p = subprocess.run([*fakes.PREFLIGHT, "run", "--profile", "auto", "--only", "shm", "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (r,) = Report.model_validate_json(p.stdout).checks
    floor = next(m.floor for m in r.measurements if m.name == "shm_size")
    assert r.status is Status.PASS and r.details["segment_bytes"] == 64 * MiB < floor, r.summary
    assert f"; memory for the {fmt_bytes(floor)} floor: " in r.summary
    print(f"shm at standard: {r.duration_seconds:.3f} s ({r.details['segment_seconds']:.3f} s writing 64 MiB); {r.summary}")


# ---- the floor a run of fewer GPUs is judged by ------------------------------------------------


def _h100_ctx(gpus: int, site: dict | None = None) -> Context:
    from preflight.pipeline import profiles
    from preflight.pipeline.shape import NodeShape

    path = profiles.find("h100-sxm", Path("/nonexistent"))
    profile = profiles.resolve(profiles.load(path), path, site or {}, "--profile h100-sxm")
    shape = NodeShape(gpus=gpus, gpus_from="test", fabric="nvswitch" if gpus > 1 else "single", fabric_from="test")
    return Context(profile=profile, settings=Settings(), host=Host(), shape=shape)


@pytest.mark.parametrize("gpus, floor", [(8, 16 * GiB), (4, 8 * GiB), (2, 4 * GiB), (1, 2 * GiB)])
def test_a_pod_given_fewer_of_the_node_s_gpus_needs_its_share_of_the_8_gpu_floor(gpus, floor):
    # A 1-GPU pod with an 8 GiB /dev/shm is healthy: the 16 GiB floor holds 8 ranks' segments and batches.
    got, scaled = shm.floor_for(_h100_ctx(gpus))
    assert got == floor
    assert (scaled is None) == (gpus == 8)
    if scaled:
        assert scaled == f"the profile's 16 GiB for 8 GPUs' ranks, this node gives the run {gpus}"


def test_ranks_asked_of_a_whole_node_or_a_one_gpu_profile_s_floor_are_not_scaled():
    # --nproc-per-node 1 on all 8 GPUs: the node's /dev/shm still serves 8 GPUs' jobs.
    ctx = _h100_ctx(8)
    ctx.settings = Settings(nproc_per_node=1)
    assert shm.floor_for(ctx) == (16 * GiB, None)
    from preflight.pipeline import profiles

    path = profiles.find("gb10", Path("/nonexistent"))  # DGX Spark: its 2 GiB is for its one GPU already
    gb10 = profiles.resolve(profiles.load(path), path, {}, "--profile gb10")
    assert shm.floor_for(Context(profile=gb10, settings=Settings(), host=Host(), shape=_h100_ctx(1).shape)) == (2 * GiB, None)


def test_a_site_s_own_floor_is_never_scaled():
    from preflight.pipeline.profiles import SiteFloor

    site = {"shm_min_bytes": SiteFloor(12 * GiB, "config /etc/preflight/config.toml line 3")}
    assert shm.floor_for(_h100_ctx(1, site)) == (12 * GiB, None)
