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


def root_venv(tmp_path: Path) -> tuple[Path, Path]:
    """Root's venv over this interpreter, as `python -m venv` lays one out: (the venv, its site-packages)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    return venv, site


@needs_root
def test_an_interpreter_whose_site_packages_another_user_owns_is_steerable(tmp_path):
    # Root's bin/python and pyvenv.cfg, another user's site-packages: a .pth there runs at start-up, as root.
    venv, site = root_venv(tmp_path)
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") is None
    os.chown(site, 65534, 65534)
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") == f"{site} is nobody's"
    os.chown(site, 0, 0)
    os.chown(venv / "pyvenv.cfg", 65534, 65534)
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") == f"{venv / 'pyvenv.cfg'} is nobody's"


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


@needs_root
def test_the_base_interpreters_site_packages_count_only_where_the_venv_includes_them(tmp_path):
    base = tmp_path / "base"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python3.11").write_bytes(b"")  # judged by its place, never run
    theirs = base / "lib" / "python3.11" / "site-packages"
    theirs.mkdir(parents=True)
    os.chown(theirs, 65534, 65534)
    (base / "lib" / "python3.12" / "site-packages").mkdir(parents=True)  # another version's: never imported
    os.chown(base / "lib" / "python3.12" / "site-packages", 65534, 65534)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(base / "bin" / "python3.11")
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = false\n")
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") is None
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = true\n")
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") == f"{theirs} is nobody's"



@needs_root
def test_the_user_site_of_another_users_home_counts(tmp_path, monkeypatch):
    # `sudo -E`: root keeps alice's HOME, and Python imports (and runs the .pth files of) her ~/.local.
    home = tmp_path / "alice"
    site = home / ".local" / "lib" / Path(os.path.realpath(sys.executable)).name / "site-packages"
    site.mkdir(parents=True)
    os.chown(site, 65534, 65534)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PYTHONNOUSERSITE", raising=False)
    why = pathtrust.interpreter_steerable(sys.executable)
    assert why is not None and "nobody" in why
    monkeypatch.setenv("PYTHONNOUSERSITE", "1")
    assert pathtrust.interpreter_steerable(sys.executable) is None


@needs_root
def test_a_venv_of_copies_has_the_standard_library_of_its_home_judged(tmp_path):
    # `python -m venv --copies`: bin/python is a file of root's, no link leads out of the venv, yet
    # Python takes its standard library (os.py, a sitecustomize.py) from pyvenv.cfg's home's prefix:
    # where another user owns that, they decide what root runs at start-up.
    base = tmp_path / "base"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python3.11").write_bytes(b"")
    stdlib = base / "lib" / "python3.11"
    stdlib.mkdir(parents=True)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_bytes(b"")  # a copy, judged by its place, never run
    (venv / "bin" / "python").chmod(0o755)
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = false\n")
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") is None
    os.chown(stdlib, 65534, 65534)
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") == f"{stdlib} is nobody's"
    os.chown(stdlib, 0, 0)
    os.chown(base / "bin", 65534, 65534)
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") == f"{base / 'bin'} is nobody's"


@needs_root
def test_an_import_directory_others_may_add_to_is_steerable_though_sticky_or_root_s(tmp_path):
    # A sticky bit keeps other users from replacing root's entries, not from adding their own:
    # nobody's pfatk.pth in a 1777 site-packages ran as root in every worker. So did a .pth file of
    # theirs left in root's own 0755 site-packages.
    venv, site = root_venv(tmp_path)
    (site / "root.pth").write_text("/opt/lib\n")
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") is None
    site.chmod(0o1777)
    why = pathtrust.interpreter_steerable(venv / "bin" / "python")
    assert why == f"{site} is writable by every user, who may add a .pth file, a module or a pyvenv.cfg Python reads there"
    site.chmod(0o755)
    (site / "theirs.pth").write_text("import os\n")
    os.chown(site / "theirs.pth", 65534, 65534)
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") == f"{site / 'theirs.pth'} is nobody's"
    (site / "theirs.pth").unlink()
    (site / "sitecustomize.py").write_text("")
    (site / "sitecustomize.py").chmod(0o666)
    assert pathtrust.interpreter_steerable(venv / "bin" / "python") == f"{site / 'sitecustomize.py'} is writable by every user"


@needs_root
def test_a_directory_others_may_add_a_pyvenv_cfg_to_beside_the_interpreter_is_steerable(tmp_path):
    # Python reads a pyvenv.cfg beside its executable or one level up, and takes its standard library
    # from the home it names: in a sticky bin/ every user may add one (nobody's home = their stdlib ran
    # as root), though no entry of root's there can be replaced.
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python3.11").write_bytes(b"")  # a copy, judged by its place, never run
    (prefix / "bin" / "python3.11").chmod(0o755)
    assert pathtrust.interpreter_steerable(prefix / "bin" / "python3.11") is None
    (prefix / "bin").chmod(0o1777)
    why = pathtrust.interpreter_steerable(prefix / "bin" / "python3.11")
    assert why == f"{prefix / 'bin'} is writable by every user, who may add a .pth file, a module or a pyvenv.cfg Python reads there"


@needs_root
def test_a_wrapper_script_is_judged_by_the_interpreter_its_shebang_names(tmp_path):
    # --python a root-owned script whose #! line names another user's interpreter: the kernel runs
    # theirs (nobody's sitecustomize.py ran as root), though the script itself is root's.
    theirs = tmp_path / "alice" / "bin"
    theirs.mkdir(parents=True)
    (theirs / "python3.11").write_bytes(b"")
    (theirs / "python3.11").chmod(0o755)
    wrapper = tmp_path / "root-bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!{theirs / 'python3.11'}\n")
    wrapper.chmod(0o755)
    assert pathtrust.interpreter_steerable(wrapper) is None
    os.chown(theirs, 65534, 65534)
    assert pathtrust.interpreter_steerable(wrapper) == f"{theirs} is nobody's"
    wrapper.write_text("#!/usr/bin/env -S python3.11 -u\n")  # through env: the one PATH finds
    env_found = pathtrust.interpreter_steerable(wrapper)
    assert env_found is None or "nobody" not in env_found
