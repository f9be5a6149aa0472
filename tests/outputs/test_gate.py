"""`preflight run` around its checks: another run holding the lock, with and without
`--if-locked skip` (what the Slurm prolog runs). Real processes: the holder takes the
lock as every run does (conftest.lock_held), the run is `python -m preflight`."""

from __future__ import annotations

import json
import subprocess

from conftest import clean_env, lock_held, run_preflight

import fakes


def env_with(lock) -> dict[str, str]:
    return {**clean_env(), "PREFLIGHT_LOCK_FILE": str(lock)}


def test_skip_when_locked_exits_0_writes_nothing_and_says_who_holds_it(tmp_path):
    lock, report, textfile = tmp_path / "preflight.lock", tmp_path / "report.json", tmp_path / "textfile"
    report.write_text("the last verdict\n")
    textfile.mkdir()
    with lock_held(lock) as holder:
        p = run_preflight(["run", "--profile", "cpu", "--level", "quick", "--lock-timeout", "0.5", "--if-locked", "skip", "-q",
                           "--report", str(report), "--textfile-dir", str(textfile)], env=env_with(lock))
        assert p.returncode == 0, p.stderr
        # Said even with -q, in one line: nothing was judged, and the holder writes the verdict.
        assert p.stderr == (f"preflight: not run: another preflight run (pid {holder}) still holds {lock} after 0.5 s; "
                            "the last report stands, and that run writes its own verdict\n")
        assert report.read_text() == "the last verdict\n" and list(textfile.iterdir()) == []
        # Without it, the same wait ends as it always did: exit 2, naming the holder.
        p = run_preflight(["run", "--profile", "cpu", "--level", "quick", "--lock-timeout", "0.5", "--if-locked", "error",
                           "--report", str(report)], env=env_with(lock))
        assert p.returncode == 2 and f"another preflight run (pid {holder}) holds {lock}; waited 0.5 s" in p.stderr
        assert report.read_text() == "the last verdict\n"


def test_skip_when_locked_still_waits_and_runs_once_the_holder_lets_go(tmp_path):
    lock, report = tmp_path / "preflight.lock", tmp_path / "report.json"
    with lock_held(lock) as holder:
        run = subprocess.Popen([*fakes.PREFLIGHT, "run", "--profile", "cpu", "--level", "quick", "--lock-timeout", "120", "--if-locked", "skip",
                                "--report", str(report)], env=env_with(lock), stderr=subprocess.PIPE, text=True)
        try:
            for line in run.stderr:  # the run says it waits: now let the holder finish
                if line.startswith("preflight: waiting for"):
                    assert f"pid {holder}" in line
                    break
        except BaseException:
            run.kill()
            raise
    rest = run.communicate(timeout=120)[1]
    assert run.returncode == 0, rest
    assert "not run" not in rest and json.loads(report.read_text())["level"] == "quick"


def test_a_lock_that_cannot_be_opened_is_an_error_even_with_skip(tmp_path):
    (tmp_path / "file").write_text("")
    p = run_preflight(["run", "--profile", "cpu", "--level", "quick", "--if-locked", "skip", "--lock-file", str(tmp_path / "file" / "preflight.lock")])
    assert p.returncode == 2 and "is not a directory" in p.stderr and "not run" not in p.stderr


def test_if_locked_takes_error_or_skip_only(tmp_path):
    p = run_preflight(["run", "--profile", "cpu", "--if-locked", "wait", "--report", str(tmp_path / "r.json")])
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "--if-locked 'wait': say error (exit 2 when another run holds the lock) or skip" in p.stderr
    assert not (tmp_path / "r.json").exists()
