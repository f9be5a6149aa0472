"""What user nobody can plant for a run as root, through the CLI: links at the
lock, the report, the textfile (and the temporary names a writer might use),
the page and calibrate's output, in a directory like /tmp, each pointing at a
root-only 0600 file; links in the directory part of a path; a report nobody
wrote; a read-only descriptor held on an old lock. Every target stays
byte-for-byte as it was, with its mode; a run either refuses in one line
(exit 2, nothing written) or replaces the link itself."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import as_nobody, clean_env, needs_nobody, report_file, run_preflight

pytestmark = needs_nobody

SECRET = b"root's own, 0600: never to be written through a link\n"
RUN = ["run", "--profile", "cpu", "--only", "shm", "-q"]


def targets(tmp_path: Path, *names: str) -> dict[str, Path]:
    """Root-only files (in a 0700 directory of root's) for nobody's links to point at."""
    d = tmp_path / "root-only"
    d.mkdir(mode=0o700, exist_ok=True)
    made = {}
    for name in names:
        made[name] = d / name
        made[name].write_bytes(SECRET)
        made[name].chmod(0o600)
    return made


def untouched(*paths: Path) -> None:
    for p in paths:
        st = p.lstat()
        assert (p.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid) == (SECRET, 0o600, 0), p


def plant(link: Path, target: Path) -> None:
    done = as_nobody("ln", "-s", str(target), str(link))
    assert done.returncode == 0, done.stderr
    assert link.lstat().st_uid == 65534


def roots_file(path: Path) -> bool:
    st = path.lstat()
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0


def env_without_lock() -> dict[str, str]:
    return {k: v for k, v in clean_env().items() if k != "PREFLIGHT_LOCK_FILE"}


def one_line(done: subprocess.CompletedProcess, *words: str) -> str:
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("preflight: error: ") and "Traceback" not in done.stderr and done.stdout == ""
    for w in words:
        assert w in line, line
    return line


def test_links_nobody_planted_for_every_file_a_run_writes_leave_their_targets_untouched(sticky, tmp_path):
    t = targets(tmp_path, "lock", "report", "textfile", "temp", "page")
    plant(sticky / "preflight.lock", t["lock"])
    plant(sticky / "report.json", t["report"])
    plant(sticky / "preflight.prom", t["textfile"])
    temps = [".report.json.tmp", "report.json.tmp", ".preflight.prom.tmp", "preflight.prom.tmp", "preflight.prom.1.1"]
    for name in temps:
        plant(sticky / name, t["temp"])
    files = [*RUN, "--report", str(sticky / "report.json"), "--textfile-dir", str(sticky)]

    # The lock is never opened through a link: refused before anything runs, nothing written.
    refused = run_preflight([*files, "--lock-file", str(sticky / "preflight.lock")], env=env_without_lock())
    one_line(refused, f"lock file {sticky}/preflight.lock: is a symlink")
    assert "[PASS]" not in refused.stderr
    untouched(*t.values())
    assert all((sticky / n).is_symlink() for n in ("preflight.lock", "report.json", "preflight.prom", *temps))

    # With a lock of its own, the run replaces nobody's links at the report and the textfile,
    # never what they point at, and leaves the links at the temporary names alone.
    done = run_preflight([*files, "--lock-file", str(tmp_path / "preflight.lock")], env=env_without_lock())
    assert done.returncode == 0, done.stderr
    untouched(*t.values())
    assert roots_file(sticky / "report.json") and json.loads((sticky / "report.json").read_text())["verdict"] == "pass"
    assert roots_file(sticky / "preflight.prom") and "preflight_run_passed 1.0" in (sticky / "preflight.prom").read_text()
    assert stat.S_IMODE((sticky / "preflight.prom").stat().st_mode) == 0o644  # for node_exporter's own user
    assert all((sticky / n).is_symlink() for n in temps)
    assert sorted(os.listdir(sticky)) == sorted(["preflight.lock", "report.json", "preflight.prom", *temps])

    # The page, as `report --html` writes it.
    plant(sticky / "node.html", t["page"])
    page = run_preflight(["report", str(sticky / "report.json"), "--html", str(sticky / "node.html")])
    assert page.returncode == 0, page.stderr
    untouched(*t.values())
    assert roots_file(sticky / "node.html") and "<html" in (sticky / "node.html").read_text()


def test_a_link_nobody_planted_in_the_directory_part_of_a_path_is_refused_before_anything_runs(sticky, tmp_path):
    """nobody's /tmp/x -> a root-only directory: nothing is written there, under any flag."""
    t = targets(tmp_path, "report.json", "preflight.prom", "node.html", "floors.toml")
    plant(sticky / "x", tmp_path / "root-only")
    said = f"{sticky}/x is a symlink another user could have made (it is nobody's); preflight follows no such link as root: give the real path"
    for args, what in (
        ([*RUN, "--report", str(sticky / "x" / "report.json")], f"report {sticky}/x/report.json: "),
        ([*RUN, "--textfile-dir", str(sticky / "x")], f"textfile dir {sticky}/x (--textfile-dir, PREFLIGHT_TEXTFILE_DIR or config): "),
        (["report", str(tmp_path / "none.json"), "--html", str(sticky / "x" / "node.html")], f"--html {sticky}/x/node.html: "),
        (["calibrate", "--profile", "cpu", "-o", str(sticky / "x" / "floors.toml"), "--force"], f"--output {sticky}/x/floors.toml: "),
    ):
        done = run_preflight(args)
        one_line(done, what + said)
        assert "[PASS]" not in done.stderr and "calibrate: run" not in done.stderr, args
    untouched(*t.values())
    assert sorted(os.listdir(tmp_path / "root-only")) == sorted(t)


def test_calibrates_output_over_a_link_nobody_planted_is_refused_without_force(sticky, tmp_path):
    """With --force the floors replace the link as every file here does (the same writer,
    tests/base/test_safefile.py); a whole calibration is a minute and refuses a loaded machine."""
    t = targets(tmp_path, "floors")
    plant(sticky / "floors.toml", t["floors"])
    refused = run_preflight(["calibrate", "--profile", "cpu", "-o", str(sticky / "floors.toml")])
    one_line(refused, f"--output {sticky}/floors.toml: already exists; pass --force")
    untouched(t["floors"])


def test_a_report_nobody_wrote_lends_the_run_nothing(sticky, tmp_path):
    """A this-boot pass of every cpu check, written by nobody where root's report goes:
    a run of shm alone must not carry the rest as if it had measured them."""
    forged = report_file(tmp_path / "forged.json", "cpu-pass").read_text()
    assert as_nobody("sh", "-c", f"cat > {sticky}/report.json", input=forged).returncode == 0
    done = run_preflight([*RUN, "--report", str(sticky / "report.json")])
    assert done.returncode == 0, done.stderr
    written = json.loads((sticky / "report.json").read_text())
    assert [c["check"] for c in written["checks"]] == ["shm"] and roots_file(sticky / "report.json")

    # The same report as root's own file is this node's last run: carried, as it should be.
    (sticky / "report.json").write_text(forged)
    done = run_preflight([*RUN, "--report", str(sticky / "report.json")])
    assert done.returncode == 0, done.stderr
    assert [c["check"] for c in json.loads((sticky / "report.json").read_text())["checks"]] == ["shm", "nccl", "bandwidth", "train"]


def test_a_read_only_descriptor_nobody_holds_on_the_lock_cannot_stop_a_run(sticky):
    """An older preflight left the lock 0644 and nobody holds an flock on a read-only
    descriptor of it (every run then waited and exited 2). Now the run takes a fresh
    0600 file in its place; and nobody cannot open that one at all."""
    path = sticky / "preflight.lock"
    path.write_text("4242\n")
    path.chmod(0o644)
    holder = subprocess.Popen(["runuser", "-u", "nobody", "--", "flock", "--exclusive", str(path), "-c", "echo held; exec sleep 120"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline() == "held\n"
        done = run_preflight([*RUN, "--lock-file", str(path), "--lock-timeout", "3"], env=env_without_lock())
        assert done.returncode == 0, done.stderr
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and roots_file(path)
        tried = as_nobody("flock", "--nonblock", str(path), "true")
        assert tried.returncode != 0 and "Permission denied" in tried.stderr
    finally:
        os.killpg(holder.pid, 9)
        holder.wait()


def test_a_lock_file_nobody_made_first_is_refused_in_one_line(sticky):
    assert as_nobody("touch", str(sticky / "preflight.lock")).returncode == 0
    done = run_preflight([*RUN, "--lock-file", str(sticky / "preflight.lock")], env=env_without_lock())
    one_line(done, f"lock file {sticky}/preflight.lock: is nobody's, who could hold it and stop every run")


@pytest.mark.parametrize("where", ["lock", "report"])
def test_nothing_is_left_behind_by_a_refusal(sticky, tmp_path, where):
    """A refused path writes nothing anywhere: no report, no textfile, no probe file."""
    t = targets(tmp_path, "x")
    plant(sticky / "x", t["x"]) if where == "report" else plant(sticky / "preflight.lock", t["x"])
    args = [*RUN, "--textfile-dir", str(tmp_path), "--report", str(sticky / "x" / "r.json" if where == "report" else tmp_path / "r.json"),
            "--lock-file", str(sticky / "preflight.lock" if where == "lock" else tmp_path / "preflight.lock")]
    before = sorted(os.listdir(tmp_path))
    one_line(run_preflight(args, env=env_without_lock()))
    untouched(t["x"])
    assert sorted(os.listdir(tmp_path)) == before and len(os.listdir(sticky)) == 1
