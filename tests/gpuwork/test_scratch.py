"""gpuwork/scratch.py: the launches' private directories, made, owned and swept."""

from __future__ import annotations

import os
import subprocess
import sys

from preflight.gpuwork import scratch


class Refused(Exception):
    def __init__(self, cause: str, remedy: str):
        super().__init__(cause)
        self.cause, self.remedy = cause, remedy


def test_a_live_directory_is_never_swept_and_a_dead_ones_is(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    mine, owner = scratch.make(Refused)
    assert mine.name.startswith(scratch.PREFIX) and not list(tmp_path.glob(scratch.NEW + "*"))
    assert scratch.sweep(tmp_path) == [] and mine.is_dir()  # locked from the moment it had its name
    # Another run's directory, its run since killed: its lock died with it.
    code = ("import os, sys; from preflight.gpuwork import scratch\n"
            "class E(Exception):\n    def __init__(self, *a): super().__init__(*a)\n"
            "d, _ = scratch.make(E); print(d, flush=True); os._exit(0)")
    dead = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.isdir(dead)
    assert scratch.sweep(tmp_path, keep=mine) == [os.path.basename(dead)]
    assert not os.path.exists(dead) and mine.is_dir()
    os.close(owner)


def test_a_name_another_user_puts_in_the_way_cannot_fail_a_launch(tmp_path, monkeypatch):
    # The directory's final name is drawn afresh, never derived from the one it was made under
    # (which every user sees): squatting every name the first one suggests changes nothing.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    real = scratch.tempfile.mkdtemp

    def squatted(prefix: str, dir: str) -> str:  # noqa: A002 - tempfile's own name
        made = real(prefix=prefix, dir=dir)
        (tmp_path / (scratch.PREFIX + os.path.basename(made).removeprefix(scratch.NEW))).write_text("in the way")
        return made

    monkeypatch.setattr(scratch.tempfile, "mkdtemp", squatted)
    made, owner = scratch.make(Refused)
    assert made.is_dir() and (made / scratch.OWNER).exists()
    os.close(owner)
