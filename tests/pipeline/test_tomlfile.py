"""TOML files people write (preflight/pipeline/tomlfile.py): whatever the file, one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import needs_root
from preflight.base.errors import UsageError
from preflight.pipeline import tomlfile

PROFILES = Path(__file__).parents[2] / "preflight" / "pipeline" / "profiles"


@pytest.mark.parametrize("depth", [17, 300, 1000, 5000])
def test_nesting_past_any_real_file_is_one_line(tmp_path, depth):
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(UsageError, match=r"nests tables or arrays more than 16 deep; no config or profile goes past 4"):
        tomlfile.load(path, "config")
    path.write_text(f"[{'.'.join(['t'] * depth)}]\nx = 1\n")  # tables, one dotted header
    with pytest.raises(UsageError, match="nests tables or arrays more than 16 deep"):
        tomlfile.load(path, "profile")


def test_every_shipped_profile_is_well_within_the_depth():
    for path in PROFILES.glob("*.toml"):
        data, _ = tomlfile.load(path, "profile")
        assert tomlfile.depth(data) <= 4, path


def test_a_fifo_is_judged_by_what_was_opened_and_never_blocks(tmp_path):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="is not a regular file"):
        tomlfile.load(fifo, "config")


@needs_root
def test_as_root_a_file_another_user_could_change_is_refused(tmp_path):
    # A config sets the interpreter root runs and every floor: nobody's file, or root's in
    # nobody's directory, would let nobody steer the gate.
    conf = tmp_path / "config.toml"
    conf.write_text('python = "/usr/bin/python3"\n')
    assert tomlfile.load(conf, "config")[0] == {"python": "/usr/bin/python3"}
    os.chown(conf, 65534, 65534)
    with pytest.raises(UsageError) as e:
        tomlfile.load(conf, "config")
    assert str(e.value).startswith(f"config file {conf}: another user could change it ({conf} is nobody's); as root preflight reads only")
    os.chown(conf, 0, 0)
    os.chown(tmp_path, 65534, 65534)
    with pytest.raises(UsageError, match=f"profile file {conf}: another user could change it \\({tmp_path} is nobody's\\)"):
        tomlfile.load(conf, "profile")


def test_an_integer_of_thousands_of_digits_is_one_line(tmp_path):
    # tomllib raises a plain ValueError for it (Python's int() digit limit), not a TOMLDecodeError.
    conf = tmp_path / "config.toml"
    conf.write_text("[floors]\nshm_min_bytes = 1" + "0" * 5000 + "\n")
    with pytest.raises(UsageError, match=f"^config file {conf}: invalid TOML: "):
        tomlfile.load(conf, "config")


@needs_root
def test_as_root_a_file_only_root_s_group_may_write_is_read(tmp_path):
    conf = tmp_path / "config.toml"
    conf.write_text('profile = "cpu"\n')
    conf.chmod(0o664)  # root:root, as /etc/preflight files often are
    assert tomlfile.load(conf, "config")[0] == {"profile": "cpu"}
    os.chown(conf, 0, 65534)  # the group of nobody: its members could rewrite it
    with pytest.raises(UsageError, match="is writable by its group"):
        tomlfile.load(conf, "config")


@needs_root
def test_as_root_a_file_taken_away_or_swapped_once_read_is_judged_as_the_file_read(tmp_path, monkeypatch):
    # Another user keeps a config of theirs at a name root reads in a sticky shared directory and
    # removes it the moment root has read it (inotify's IN_CLOSE_NOWRITE): a path judged after the
    # read named nothing, which let their settings through (the python root then runs, included).
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    conf = shared / "config.toml"
    conf.write_text('python = "/tmp/evil-python"\n')
    os.chown(conf, 65534, 65534)
    read = tomlfile.capture.read_regular

    def read_then(action):
        def reader(fd, limit):
            data = read(fd, limit)
            action()
            return data
        return reader

    monkeypatch.setattr(tomlfile.capture, "read_regular", read_then(conf.unlink))
    with pytest.raises(UsageError, match=rf"another user could change it \({conf} is nobody's\)"):
        tomlfile.load(conf, "config")
    # Root's own file, swapped for another root's file while it was read: the name no longer says what was read.
    conf.write_text('python = "/usr/bin/python3"\n')
    other = shared / "other.toml"
    other.write_text('python = "/usr/bin/python3"\n')
    monkeypatch.setattr(tomlfile.capture, "read_regular", read_then(lambda: os.replace(other, conf)))
    with pytest.raises(UsageError, match=rf"another user could change it \({conf} was replaced while it was read\)"):
        tomlfile.load(conf, "config")
    monkeypatch.setattr(tomlfile.capture, "read_regular", read)
    assert tomlfile.load(conf, "config")[0] == {"python": "/usr/bin/python3"}
