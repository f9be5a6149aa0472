"""Whether another user could have steered a path (base/pathtrust.py): a program root runs,
or a directory on the way to it, that is theirs, writable by others, or reached through a
link they could re-aim."""

import os
import sys
from pathlib import Path

import pytest

from conftest import needs_root
from preflight.base import pathtrust


@needs_root
def test_a_venv_another_user_owns_is_steerable_though_its_python_links_out_of_it(tmp_path):
    # bin/python of a venv is a link to the system's interpreter: the venv (its site-packages,
    # which that Python imports as root) is what another user controls.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    assert pathtrust.steerable(venv / "bin" / "python") is None
    os.chown(venv, 65534, 65534)
    assert pathtrust.steerable(venv / "bin" / "python") == f"{venv} is nobody's"


@needs_root
def test_a_link_another_user_could_re_aim_is_steerable_though_it_reaches_root_s_files(tmp_path):
    # nobody's link in a sticky directory, to root's /usr/bin: the target is sound today, but its
    # owner can point it elsewhere between the check and any later use of the path.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    plink = shared / "plink"
    plink.symlink_to(Path(sys.executable).parent)
    python = plink / Path(sys.executable).name
    assert pathtrust.steerable(python) is None  # root's link: only root re-aims it
    os.chown(plink, 65534, 65534, follow_symlinks=False)
    assert pathtrust.steerable(python) == f"{plink} is a symlink another user could re-aim (it is nobody's)"
    assert pathtrust.steerable(plink) == f"{plink} is a symlink another user could re-aim (it is nobody's)"


@needs_root
def test_a_link_in_the_middle_of_a_chain_another_user_could_re_aim_is_steerable(tmp_path):
    # root's link, in root's directory, to another user's link to root's interpreter: whoever owns
    # the link in the middle can re-aim it between the look and the exec.
    theirs = tmp_path / "alice"
    theirs.mkdir()
    (theirs / "py").symlink_to(sys.executable)
    os.chown(theirs, 65534, 65534)
    os.lchown(theirs / "py", 65534, 65534)
    mine = tmp_path / "root-bin"
    mine.mkdir()
    (mine / "python").symlink_to(theirs / "py")
    why = pathtrust.steerable(mine / "python")
    assert why is not None and str(theirs) in why


def _acl(*entries: tuple[int, int, int]) -> bytes:
    import struct

    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


@needs_root
def test_a_file_an_acl_lets_another_user_write_is_steerable(tmp_path):
    # `setfacl -m u:nobody:rw config.toml`: the mode's group bits become the ACL's mask, and with
    # root's group they read as root's own say; the ACL's named entry is another user's.
    conf = tmp_path / "config.toml"
    conf.write_text("")
    conf.chmod(0o660)
    user_obj, group_obj, mask, other = (0x01, 6, 0xFFFFFFFF), (0x04, 4, 0xFFFFFFFF), (0x10, 6, 0xFFFFFFFF), (0x20, 4, 0xFFFFFFFF)
    try:
        os.setxattr(conf, "system.posix_acl_access", _acl(user_obj, (0x02, 6, 65534), group_obj, mask, other))
    except OSError as e:
        pytest.skip(f"this filesystem keeps no POSIX ACL ({e.strerror})")
    assert pathtrust.steerable(conf) == f"{conf} is writable by user nobody through an ACL"
    # A mask without write leaves the named user reading only.
    os.setxattr(conf, "system.posix_acl_access", _acl(user_obj, (0x02, 6, 65534), group_obj, (0x10, 4, 0xFFFFFFFF), other))
    assert pathtrust.steerable(conf) is None



@needs_root
def test_a_relative_link_reached_through_another_link_still_has_its_real_directory_judged(tmp_path):
    # tools -> real/a/b, real/a/b/python -> ../py: the ".." is real/a's, which every user may write.
    a = tmp_path / "real" / "a"
    (a / "b").mkdir(parents=True)
    (a / "py").symlink_to(sys.executable)
    (a / "b" / "python").symlink_to("../py")
    (tmp_path / "tools").symlink_to(a / "b")
    a.chmod(0o777)
    why = pathtrust.steerable(tmp_path / "tools" / "python")
    assert why == f"{a / 'py'} is a symlink another user could re-aim (other users can write its directory)"
