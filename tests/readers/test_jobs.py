"""The Slurm jobs running on a node, from /proc: a recorded tree of a real Slurm with two
jobs (tests/fixtures/proc), titles as slurmstepd writes them, and a real process that
titles itself as a slurmstepd does."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from pathlib import Path

from preflight.base.host import Host
from preflight.readers.system import jobs

TWO_JOBS = Path(__file__).parents[1] / "fixtures" / "proc" / "slurm-22.05-two-jobs"


def test_the_jobs_of_a_real_node_are_read_from_their_slurmstepd_titles():
    # Job 1's batch step; job 2's batch step and its srun step 2.0: two jobs, each once.
    assert jobs.running(Host(root=TWO_JOBS)) == ["1", "2"]


def test_the_job_a_prolog_serves_is_not_another():
    assert jobs.others(Host(root=TWO_JOBS, environ={"SLURM_JOB_ID": "2"})) == ["1"]
    assert jobs.others(Host(root=TWO_JOBS, environ={"SLURM_JOB_ID": "3"})) == ["1", "2"]
    assert jobs.others(Host(root=TWO_JOBS, environ={})) == ["1", "2"]  # outside any job: every job is another's


def test_only_a_titled_slurmstepd_names_a_job():
    assert jobs.job_of("slurmstepd\n", b"slurmstepd: [41.extern]\x00") == "41"
    assert jobs.job_of("slurmstepd\n", b"slurmstepd: [41.interactive]\x00\x00\x00") == "41"
    # Still starting (not titled yet), or another program borrowing the words.
    assert jobs.job_of("slurmstepd\n", b"/usr/sbin/slurmstepd\x00") is None
    assert jobs.job_of("bash\n", b"slurmstepd: [41.batch]\x00") is None
    assert jobs.job_of("slurmstepd\n", b"slurmstepd: [x.batch]\x00") is None


def test_no_proc_no_jobs(tmp_path):
    assert jobs.running(Host(root=tmp_path)) == []


def test_a_live_process_titled_as_a_slurmstepd_is_seen_and_gone_when_it_ends(tmp_path):
    # The kernel names a process after the file it runs (comm); the title is its argv, as slurmstepd writes it.
    stepd = tmp_path / "slurmstepd"
    shutil.copy("/bin/sleep", stepd)
    job = "987654321"  # far from any job id a test cluster on this machine hands out
    p = subprocess.Popen(["bash", "-c", f'exec -a "slurmstepd: [{job}.batch]" {stepd} 300'])
    try:
        deadline = time.monotonic() + 30
        while job not in jobs.running(Host()):
            assert time.monotonic() < deadline, "the titled process never showed in /proc"
            time.sleep(0.05)
        assert job not in jobs.others(Host(environ={"SLURM_JOB_ID": job}))
    finally:
        p.kill()
        p.wait()
    assert job not in jobs.running(Host())


def test_a_process_another_user_titles_as_a_slurmstepd_names_no_job():
    # Any user can write that title over a process of theirs (and so hide a full /dev/shm
    # from the shm check); only slurmd, as root, starts a real one.
    where = Path(tempfile.mkdtemp(dir="/tmp"))  # nobody must reach it: pytest's own tmp is root's alone
    try:
        where.chmod(0o755)
        stepd = where / "slurmstepd"
        shutil.copy("/bin/sleep", stepd)
        stepd.chmod(0o755)
        job = "987654322"
        p = subprocess.Popen(["runuser", "-u", "nobody", "--", "bash", "-c", f'exec -a "slurmstepd: [{job}.batch]" {stepd} 300'],
                             start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while not any(c.startswith(f"slurmstepd: [{job}.".encode()) for c in _cmdlines()):
                assert time.monotonic() < deadline, "the titled process never showed in /proc"
                time.sleep(0.05)
            assert job not in jobs.running(Host())
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    finally:
        shutil.rmtree(where)


def _cmdlines() -> list[bytes]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f.read())
        except OSError:
            pass
    return out


def test_roots_slurmd_says_this_is_a_slurm_node_and_another_users_does_not():
    # In a PID namespace of its own, as a pod sees only its own processes: a slurmd (a copy of
    # sleep, which the kernel names after its file) started by root, then by user nobody.
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("runuser"):
        import pytest

        pytest.skip("needs root, unshare and runuser")
    import sys

    d = Path(tempfile.mkdtemp(prefix="preflight-slurmd-", dir="/tmp"))
    try:
        d.chmod(0o755)
        shutil.copy("/bin/sleep", d / "slurmd")
        (d / "slurmd").chmod(0o755)
        code = "from preflight.base.host import Host; from preflight.readers.system import jobs; print(jobs.slurmd_here(Host()))"
        seen = {}
        # "elsewhere": root's slurmd in a mount namespace of its own, as a container given the
        # host's PIDs (hostPID) sees the host's slurmd or another pod's: not this container's node.
        for who, start in (("none", ""), ("root", f"{d}/slurmd 60 & "), ("nobody", f"runuser -u nobody -- {d}/slurmd 60 & "),
                           ("elsewhere", f"unshare --mount {d}/slurmd 60 & ")):
            # Wait for the copy to run under its name (comm), then ask; at most 30 s.
            wait = "i=0; until grep -qsx slurmd /proc/[0-9]*/comm || [ $i -ge 600 ]; do sleep 0.05; i=$((i+1)); done; " if start else ""
            script = f"{start}{wait}{sys.executable} -c '{code}'; kill $! 2>/dev/null; true"
            done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script], capture_output=True, text=True,
                                  timeout=60, start_new_session=True)
            seen[who] = done.stdout.strip()
        assert seen == {"none": "False", "root": "True", "nobody": "False", "elsewhere": "False"}, seen
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_step_manager_step_of_slurm_24_05_names_its_job():
    # Slurm 24.05+ (src/slurmd/slurmstepd/slurmstepd.c, _set_job_log_prefix): the stepd that is the
    # job's step manager (--stepmgr, SlurmctldParameters=enable_stepmgr) titles itself "[%s stepmgr]".
    assert jobs.job_of("slurmstepd\n", b"slurmstepd: [41.extern stepmgr]\x00") == "41"
    assert jobs.job_of("slurmstepd\n", b"slurmstepd: [41.0 stepmgr]\x00\x00") == "41"
