"""The one writer of files root writes at a path a person gave: atomic, proven
before anything runs, and never through a link another user (nobody, for real)
could have planted."""

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import as_nobody, needs_nobody, needs_root
from preflight.base import pathtrust, safefile
from preflight.base.errors import UsageError

SECRET = b"root's own, 0600\n"


def secret(path: Path) -> Path:
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def unchanged(path: Path) -> bool:
    st = path.lstat()
    return path.read_bytes() == SECRET and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0


def test_atomic_write_replaces_and_is_world_readable(tmp_path):
    path = tmp_path / "report.json"
    safefile.write_atomic(path, "one")
    safefile.write_atomic(path, "two")
    assert path.read_text() == "two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["report.json"]


def test_the_mode_asked_for_is_the_mode_written_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        safefile.write_atomic(tmp_path / "preflight.prom", b"x 1\n", 0o644)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "preflight.prom").stat().st_mode) == 0o644


def test_a_failed_write_leaves_the_previous_file_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    safefile.write_atomic(path, "previous")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        safefile.write_atomic(path, "new")
    assert path.read_text() == "previous"
    assert os.listdir(tmp_path) == ["report.json"]


def test_path_checks_happen_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match=r"^report x: directory .*nope does not exist; create it \(mkdir -p .*nope\)"):
        safefile.check(tmp_path / "nope" / "r.json", "report x")
    with pytest.raises(UsageError, match=r"^report x: is a directory; give a file path such as .*/report.json$"):
        safefile.check(tmp_path, "report x")
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=r"^report x: .*/file is not a directory"):
        safefile.check(tmp_path / "file" / "r.json", "report x")
    assert safefile.check(tmp_path / "r.json", "report x") == tmp_path / "r.json"
    assert sorted(os.listdir(tmp_path)) == ["file"]  # the probe cleans up after itself


@needs_root
def test_a_read_only_directory_is_refused_even_for_root(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    code = f"from pathlib import Path; from preflight.base.safefile import check; check(Path({str(ro / 'r.json')!r}), 'report')"
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {shlex.quote(str(ro))} && exec {sys.executable} -c {shlex.quote(code)}"],
        capture_output=True, text=True, timeout=60,
    )
    assert "cannot write in" in p.stderr and "Read-only file system" in p.stderr


def test_a_device_or_pipe_is_never_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match=r"is not a regular file"):
        safefile.check(fifo, "report")
    with pytest.raises(UsageError, match=r"is not a regular file"):
        safefile.check(Path("/dev/null"), "report")
    assert Path("/dev/null").is_char_device()


def test_a_link_no_other_user_could_have_made_is_followed(tmp_path):
    """Root's own link in root's own directory: an admin's choice, written through."""
    (tmp_path / "real").mkdir()
    link = tmp_path / "report.json"
    link.symlink_to(tmp_path / "real" / "report.json")
    (tmp_path / "via").symlink_to(tmp_path / "real")
    safefile.check(link, "report")
    safefile.write_atomic(link, "new")
    assert link.is_symlink() and (tmp_path / "real" / "report.json").read_text() == "new"
    safefile.write_atomic(tmp_path / "via" / "other.json", "there")
    assert (tmp_path / "real" / "other.json").read_text() == "there"


def test_root_s_link_in_a_directory_others_can_write_is_not_followed(tmp_path):
    """Anyone could have swapped it a moment ago: it is replaced, its target untouched."""
    target = secret(tmp_path / "secret")
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    (d / "report.json").symlink_to(target)
    safefile.write_atomic(d / "report.json", "report")
    assert unchanged(target)
    assert not (d / "report.json").is_symlink() and (d / "report.json").read_text() == "report"


@needs_nobody
def test_a_link_nobody_planted_at_the_name_is_replaced_never_followed(sticky, tmp_path):
    target = secret(tmp_path / "secret")
    assert as_nobody("ln", "-s", str(target), str(sticky / "report.json")).returncode == 0
    assert safefile.check(sticky / "report.json", "report") == sticky / "report.json"
    safefile.write_atomic(sticky / "report.json", "the report\n")
    assert unchanged(target)
    st = (sticky / "report.json").lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and (sticky / "report.json").read_text() == "the report\n"


@needs_nobody
def test_a_link_nobody_planted_in_the_directory_part_is_refused(sticky, tmp_path):
    """nobody's /tmp/x -> /etc: `--report /tmp/x/passwd` must not replace /etc/passwd."""
    root_only = tmp_path / "etc"
    root_only.mkdir(mode=0o700)
    target = secret(root_only / "passwd")
    assert as_nobody("ln", "-s", str(root_only), str(sticky / "x")).returncode == 0
    with pytest.raises(UsageError) as refused:
        safefile.check(sticky / "x" / "passwd", f"report {sticky}/x/passwd")
    said = str(refused.value)
    assert "\n" not in said and said == (f"report {sticky}/x/passwd: {sticky}/x is a symlink another user could have made (it is nobody's); "
                                         "preflight follows no such link as root: give the real path")
    with pytest.raises(pathtrust.Untrusted):  # and the writer, whatever was checked before
        safefile.write_atomic(sticky / "x" / "passwd", "replaced")
    assert unchanged(target) and os.listdir(root_only) == ["passwd"]


@needs_nobody
def test_temp_names_nobody_planted_are_never_opened(sticky, tmp_path):
    """The temporary file is a new name of our own, created exclusively: a link
    planted at any name a writer might pick is left alone."""
    target = secret(tmp_path / "secret")
    names = ["preflight.prom.tmp", ".preflight.prom.tmp", f"preflight.prom.{os.getpid()}.{__import__('threading').get_ident()}",
             ".report.json.tmp", "report.json.tmp"]
    for name in names:
        assert as_nobody("ln", "-s", str(target), str(sticky / name)).returncode == 0
    safefile.write_atomic(sticky / "preflight.prom", "x 1\n")
    assert unchanged(target)
    assert sorted(os.listdir(sticky)) == sorted([*names, "preflight.prom"])


@needs_nobody
def test_only_a_file_no_other_user_could_have_written_is_read_back(sticky, tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text("root's")
    assert safefile.read_own(mine) == b"root's"
    assert as_nobody("sh", "-c", f"echo forged > {sticky}/theirs.json").returncode == 0
    assert safefile.read_own(sticky / "theirs.json") is None
    assert as_nobody("ln", "-s", str(mine), str(sticky / "link.json")).returncode == 0
    assert safefile.read_own(sticky / "link.json") is None
    (sticky / "root.json").write_text("root's, in a sticky directory")
    assert safefile.read_own(sticky / "root.json") == b"root's, in a sticky directory"
    assert safefile.read_own(tmp_path / "missing.json") is None


def test_remove_unlinks_the_name_and_never_goes_through_another_users_link(tmp_path):
    target = tmp_path / "dir"
    target.mkdir()
    (target / "f").write_text("x")
    safefile.remove(target / "f")
    assert not (target / "f").exists()
    with pytest.raises(FileNotFoundError):
        safefile.remove(target / "f")
    # Through a link another user made in a sticky directory: refused, the file left alone.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (target / "f").write_text("x")
    (shared / "via").symlink_to(target)
    os.lchown(shared / "via", 65534, 65534)
    with pytest.raises(pathtrust.Untrusted):
        safefile.remove(shared / "via" / "f")
    assert (target / "f").read_text() == "x"


def test_a_staged_file_takes_its_place_only_when_committed(tmp_path):
    # gate.py stages the textfile and commits it once the report is on disk: a run killed
    # between the two leaves the last run's textfile, never one the report does not back.
    target = tmp_path / "preflight.prom"
    target.write_text("last run\n")
    staged = safefile.stage(target, "this run\n")
    assert target.read_text() == "last run\n"
    staged.commit()
    assert target.read_text() == "this run\n" and [p.name for p in tmp_path.iterdir()] == ["preflight.prom"]
    safefile.stage(target, "discarded\n").discard()
    assert target.read_text() == "this run\n" and [p.name for p in tmp_path.iterdir()] == ["preflight.prom"]
