"""The memory cgroup's headroom from recorded cgroup trees, v1 and v2."""

from pathlib import Path

from preflight.base.host import Host
from preflight.readers.system import memory

GiB, MiB = 2**30, 2**20


def _tree(root: Path, files: dict[str, str]) -> Host:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return Host(root=root)


def headroom(host: Host) -> int | None:
    """The bytes ``memory.cgroup_limit`` says the memory cgroup may still charge; None where no limit binds."""
    found = memory.cgroup_limit(host)
    return found[0] if found else None


def test_cgroup_v2_headroom(tmp_path):
    host = _tree(tmp_path, {
        "proc/self/cgroup": "0::/kubepods/pod1\n",
        "sys/fs/cgroup/kubepods/pod1/memory.max": str(2 * GiB),
        "sys/fs/cgroup/kubepods/pod1/memory.current": str(GiB + 5),
    })
    assert headroom(host) == GiB - 5


def test_the_cgroups_inactive_file_cache_counts_as_room(tmp_path):
    """The kernel reclaims a cgroup's inactive page cache before it calls the OOM killer
    (the kubelet's working set leaves it out too): a container whose cache filled its limit has room."""
    host = _tree(tmp_path, {
        "proc/self/cgroup": "0::/kubepods/pod1\n",
        "sys/fs/cgroup/kubepods/pod1/memory.max": str(4 * GiB),
        "sys/fs/cgroup/kubepods/pod1/memory.current": str(4 * GiB),
        "sys/fs/cgroup/kubepods/pod1/memory.stat": f"anon {GiB}\nfile {3 * GiB}\ninactive_file {3 * GiB - 5}\nactive_file 5\n",
    })
    assert headroom(host) == 3 * GiB - 5


def test_a_parent_cgroups_limit_binds_an_unlimited_leaf(tmp_path):
    host = _tree(tmp_path, {
        "proc/self/cgroup": "0::/slurm/job42/step0\n",
        "sys/fs/cgroup/slurm/job42/step0/memory.max": "max",
        "sys/fs/cgroup/slurm/job42/step0/memory.current": str(GiB),
        "sys/fs/cgroup/slurm/job42/memory.max": str(600 * MiB + GiB),
        "sys/fs/cgroup/slurm/job42/memory.current": str(GiB + 100 * MiB),
        "sys/fs/cgroup/slurm/memory.max": "max",
        "sys/fs/cgroup/slurm/memory.current": str(5 * GiB),
    })
    assert headroom(host) == 500 * MiB


def test_cgroup_v1_headroom_and_unlimited(tmp_path):
    files = {
        "proc/self/cgroup": "9:name=systemd:/\n4:memory:/docker/abc\n0::/\n",
        "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": str(4 * GiB),
        "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes": str(GiB),
    }
    assert headroom(_tree(tmp_path / "a", files)) == 3 * GiB
    files["sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"] = "9223372036854771712"
    assert headroom(_tree(tmp_path / "b", files)) is None


def test_the_cgroup_that_binds_is_named_by_its_path_in_the_hierarchy_and_its_slurm_job(tmp_path):
    """The shm check lays a limit a Slurm job's cgroup sets on the job (its --mem): the job is read
    from the cgroup's path in the hierarchy, never from where the tree happens to be mounted."""
    root = tmp_path / "job_7" / "root"  # a recorded tree under a directory that reads as a job's
    host = _tree(root, {
        "proc/self/cgroup": "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
        "sys/fs/cgroup/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0/memory.max": "max",
        "sys/fs/cgroup/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0/memory.current": str(3 * GiB),
        "sys/fs/cgroup/system.slice/slurmstepd.scope/job_4242/memory.max": str(4 * GiB),
        "sys/fs/cgroup/system.slice/slurmstepd.scope/job_4242/memory.current": str(3 * GiB),
    })
    room, cgroup = memory.cgroup_limit(host)
    assert (room, cgroup, memory.slurm_job(cgroup)) == (GiB, Path("/system.slice/slurmstepd.scope/job_4242"), "4242")
    unit = _tree(tmp_path / "job_8" / "root", {
        "proc/self/cgroup": "0::/system.slice/preflight.service\n",
        "sys/fs/cgroup/system.slice/preflight.service/memory.max": str(4 * GiB),
        "sys/fs/cgroup/system.slice/preflight.service/memory.current": str(GiB),
    })
    room, cgroup = memory.cgroup_limit(unit)
    assert (room, memory.slurm_job(cgroup)) == (3 * GiB, None)
