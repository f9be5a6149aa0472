"""/dev/shm's mount from recorded mountinfo captures (tests/fixtures/mountinfo), and a
segment written for real: on this machine's /dev/shm and on a small private tmpfs."""

import os
import shlex
import subprocess
from pathlib import Path

from conftest import FIXTURES, needs_root

import fakes
from preflight.readers.system import shm_mount

MiB = 2**20


def mounts(name):
    return shm_mount.parse_mountinfo((FIXTURES / "mountinfo" / name).read_text())


def test_stacked_mounts_the_last_one_wins():
    ms = mounts("host_stacked-dev-shm.txt")
    assert sum(m.mount_point == "/dev/shm" for m in ms) == 2
    m = shm_mount.mount_of("/dev/shm", ms)
    assert (m.fstype, m.options[-1]) == ("tmpfs", "size=24684084k")
    assert m is [x for x in ms if x.mount_point == "/dev/shm"][-1]
    assert shm_mount.mount_of("/etc/hosts", ms).mount_point == "/"


def test_64m_tmpfs_capture():
    m = shm_mount.mount_of("/dev/shm", mounts("unshare_64m-tmpfs.txt"))
    assert m.fstype == "tmpfs" and "size=65536k" in m.options


def test_bind_mounted_disk_and_escaped_spaces():
    ms = mounts("unshare_bind-disk_ro-space.txt")
    assert (shm_mount.mount_of("/dev/shm", ms).fstype, shm_mount.mount_of("/dev/shm", ms).source) == ("ext4", "/dev/vda")
    spaced = shm_mount.mount_of("/tmp/with space/file", ms)
    assert spaced.mount_point == "/tmp/with space" and "ro" in spaced.options


def test_touch_segment_stops_at_its_deadline():
    import time as _time

    error, seconds = shm_mount.touch_segment(Path("/dev/shm"), 64 * MiB, deadline=_time.monotonic())
    assert error == "stopped after 0 B: out of time" and seconds < 5


@needs_root
def test_touch_segment_reports_enospc_instead_of_sigbus():
    # A small private tmpfs: the write must fail with ENOSPC, and the process
    # that asked must survive to say so (an mmap'd write would die of SIGBUS).
    code = (
        "from pathlib import Path; from preflight.readers.system.shm_mount import touch_segment; "
        "print(touch_segment(Path('/dev/shm'), 128 << 20)[0]); import os; print(os.listdir('/dev/shm'))"
    )
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {shlex.quote(fakes.PREFLIGHT[0])} -c {shlex.quote(code)}"],
        capture_output=True, text=True, timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["could not reserve and write 128 MiB: No space left on device", "[]"]


def test_largest_files_say_their_owners_and_passwd_names_them(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 65536)
    (tmp_path / "small").write_bytes(b"x")
    os.chown(tmp_path / "big", 65534, 65534)
    (tmp_path / "sub").mkdir()  # a directory is no segment
    files = shm_mount.largest_files(tmp_path)
    assert [(f.name, f.uid) for f in files] == [("big", 65534), ("small", os.getuid())]
    assert files[0].bytes >= 65536
    passwd = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n# a comment\nbroken-line\n"
    assert shm_mount.local_users(passwd) == {0: "root", 65534: "nobody"}
    assert shm_mount.local_users("e\x1b[2Jvil:x:7:7::/:/bin/sh\n") == {7: "e\\x1b[2Jvil"}  # a name fit for a terminal
