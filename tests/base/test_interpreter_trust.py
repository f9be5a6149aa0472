"""Whether another user decides what a Python interpreter root runs does
(base/interpreter_trust.py): its files, its venv and `home`, the site directories it imports
from and their .pth files, a wrapper's #! interpreter and what its env line sets. Real files,
chowned to nobody where another user's are needed."""

import os
import sys
from pathlib import Path

import pytest

from conftest import needs_root
from preflight.base import interpreter_trust


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
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") is None
    os.chown(site, 65534, 65534)
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") == f"{site} is nobody's"
    os.chown(site, 0, 0)
    os.chown(venv / "pyvenv.cfg", 65534, 65534)
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") == f"{venv / 'pyvenv.cfg'} is nobody's"


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
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") is None
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = true\n")
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") == f"{theirs} is nobody's"



@needs_root
def test_the_user_site_of_another_users_home_counts(tmp_path, monkeypatch):
    # `sudo -E`: root keeps alice's HOME, and Python imports (and runs the .pth files of) her ~/.local.
    home = tmp_path / "alice"
    site = home / ".local" / "lib" / Path(os.path.realpath(sys.executable)).name / "site-packages"
    site.mkdir(parents=True)
    os.chown(site, 65534, 65534)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PYTHONNOUSERSITE", raising=False)
    why = interpreter_trust.interpreter_steerable(sys.executable)
    assert why is not None and "nobody" in why
    monkeypatch.setenv("PYTHONNOUSERSITE", "1")
    assert interpreter_trust.interpreter_steerable(sys.executable) is None


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
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") is None
    os.chown(stdlib, 65534, 65534)
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") == f"{stdlib} is nobody's"
    os.chown(stdlib, 0, 0)
    os.chown(base / "bin", 65534, 65534)
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") == f"{base / 'bin'} is nobody's"


@needs_root
def test_an_import_directory_others_may_add_to_is_steerable_though_sticky_or_root_s(tmp_path):
    # A sticky bit keeps other users from replacing root's entries, not from adding their own:
    # nobody's pfatk.pth in a 1777 site-packages ran as root in every worker. So did a .pth file of
    # theirs left in root's own 0755 site-packages.
    venv, site = root_venv(tmp_path)
    (site / "root.pth").write_text("/opt/lib\n")
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") is None
    site.chmod(0o1777)
    why = interpreter_trust.interpreter_steerable(venv / "bin" / "python")
    assert why == f"{site} is writable by every user, who may add a .pth file, a module or a pyvenv.cfg Python reads there"
    site.chmod(0o755)
    (site / "theirs.pth").write_text("import os\n")
    os.chown(site / "theirs.pth", 65534, 65534)
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") == f"{site / 'theirs.pth'} is nobody's"
    (site / "theirs.pth").unlink()
    (site / "sitecustomize.py").write_text("")
    (site / "sitecustomize.py").chmod(0o666)
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") == f"{site / 'sitecustomize.py'} is writable by every user"


@needs_root
def test_a_directory_others_may_add_a_pyvenv_cfg_to_beside_the_interpreter_is_steerable(tmp_path):
    # Python reads a pyvenv.cfg beside its executable or one level up, and takes its standard library
    # from the home it names: in a sticky bin/ every user may add one (nobody's home = their stdlib ran
    # as root), though no entry of root's there can be replaced.
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python3.11").write_bytes(b"")  # a copy, judged by its place, never run
    (prefix / "bin" / "python3.11").chmod(0o755)
    assert interpreter_trust.interpreter_steerable(prefix / "bin" / "python3.11") is None
    (prefix / "bin").chmod(0o1777)
    why = interpreter_trust.interpreter_steerable(prefix / "bin" / "python3.11")
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
    assert interpreter_trust.interpreter_steerable(wrapper) is None
    os.chown(theirs, 65534, 65534)
    assert interpreter_trust.interpreter_steerable(wrapper) == f"{theirs} is nobody's"
    wrapper.write_text("#!/usr/bin/env -S python3.11 -u\n")  # through env: the one PATH finds
    env_found = interpreter_trust.interpreter_steerable(wrapper)
    assert env_found is None or "nobody" not in env_found


def test_env_s_options_and_the_program_it_runs_are_read_as_env_reads_them():
    # `env -S -u FOO /x/python3` runs /x/python3: -u's value is no program (it was judged as FOO).
    for line, expected in (
        ("#!/usr/bin/env -S -u FOO /opt/x/python3 -u", ("/opt/x/python3", {})),
        ("#!/usr/bin/env -S -C / /opt/x/python3", ("/opt/x/python3", {})),
        ("#!/usr/bin/env -S PYTHONPATH=/srv/p /opt/x/python3", ("/opt/x/python3", {"PYTHONPATH": "/srv/p"})),
        ("#!/usr/bin/env -SPYTHONHOME=/h /opt/x/python3", ("/opt/x/python3", {"PYTHONHOME": "/h"})),
        ("#!/usr/bin/env --split-string=-i /opt/x/python3", ("/opt/x/python3", {})),
        ("#!/opt/x/python3 -E", ("/opt/x/python3", {})),
    ):
        assert interpreter_trust.shebang_of(line) == expected, line
    assert interpreter_trust.shebang_of('#!/usr/bin/env -S "/opt/x/python3" -u') == ("/opt/x/python3", {})  # quotes as the shell takes them


@needs_root
def test_what_a_wrapper_s_env_line_sets_for_python_is_judged(tmp_path):
    # `#!/usr/bin/env -S PYTHONPATH=<nobody's dir> python3` ran nobody's sitecustomize as root.
    theirs = tmp_path / "alice-lib"
    theirs.mkdir()
    wrapper = tmp_path / "root-bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/usr/bin/env -S PYTHONPATH={theirs} {sys.executable}\n")
    wrapper.chmod(0o755)
    assert interpreter_trust.interpreter_steerable(wrapper) is None
    os.chown(theirs, 65534, 65534)
    assert interpreter_trust.interpreter_steerable(wrapper) == f"{wrapper}'s #! line sets PYTHONPATH: {theirs} is nobody's"
    wrapper.write_text(f"#!/usr/bin/env -S LD_PRELOAD=./lib.so {sys.executable}\n")
    assert "a path from the working directory (./lib.so)" in interpreter_trust.interpreter_steerable(wrapper)
    # A library named bare is found in the loader's own directories; a variable env expands is not known here.
    for line in (f"LD_PRELOAD=libjemalloc.so.2 {sys.executable}", f"PYTHONPATH=${{HOME}}/lib {sys.executable}", f'"{sys.executable}" -u'):
        wrapper.write_text(f"#!/usr/bin/env -S {line}\n")
        assert interpreter_trust.interpreter_steerable(wrapper) is None, line
    # ${HOME} is expanded as env expands it: under `sudo -E` another user's home chose the modules.
    wrapper.write_text(f"#!/usr/bin/env -S PYTHONPATH=${{HOME}}/lib {sys.executable}\n")
    (theirs / "lib").mkdir()
    os.chown(theirs / "lib", 65534, 65534)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(theirs))
        assert interpreter_trust.interpreter_steerable(wrapper) == f"{wrapper}'s #! line sets PYTHONPATH: {theirs / 'lib'} is nobody's"
    # env finds the program on the PATH its line sets: theirs ran as root.
    (theirs / "python3").write_text("#!/bin/sh\n")
    (theirs / "python3").chmod(0o755)
    wrapper.write_text(f"#!/usr/bin/env -S PATH={theirs}:/usr/bin python3\n")
    assert interpreter_trust.interpreter_steerable(wrapper) == f"{wrapper}'s #! line sets PATH: {theirs} is nobody's"
    os.chown(theirs, 0, 0)
    theirs.chmod(0o1777)  # sticky: anyone may still add a python3 of theirs there
    assert "is writable by every user" in interpreter_trust.interpreter_steerable(wrapper)


@needs_root
def test_an_editable_install_of_another_user_s_checkout_is_steerable(tmp_path):
    # setuptools 64+ writes `import __editable___X_finder` in the .pth and the checkout's path in the
    # finder's MAPPING: `import mypkg` ran a uid-1000 user's code as root though no path line named it.
    venv, site = root_venv(tmp_path)
    checkout = tmp_path / "alice-checkout" / "mypkg"
    checkout.mkdir(parents=True)
    (site / "__editable__.mypkg-0.1.pth").write_text("import __editable___mypkg_0_1_finder; __editable___mypkg_0_1_finder.install()\n")
    (site / "__editable___mypkg_0_1_finder.py").write_text(f"import sys\nMAPPING: dict[str, str] = {{'mypkg': '{checkout}'}}\nNAMESPACES = {{}}\n")
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") is None
    os.chown(checkout.parent, 1000, 1000)
    why = interpreter_trust.interpreter_steerable(venv / "bin" / "python")
    assert why is not None and why.startswith(f"{site / '__editable___mypkg_0_1_finder.py'} imports from {checkout}: {checkout.parent} is ")
    # A finder no literal reads is unknown, never a traceback; one of another user's is theirs.
    for text in ("MAPPING = {{}}\n", "MAPPING = {[]: 1}\n", "MAPPING = " + "-" * 100000 + "1\n"):
        (site / "__editable___mypkg_0_1_finder.py").write_text(text)
        assert "what it imports is unknown" in interpreter_trust.interpreter_steerable(venv / "bin" / "python"), text[:20]
    os.chown(site / "__editable___mypkg_0_1_finder.py", 65534, 65534)
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") == f"{site / '__editable___mypkg_0_1_finder.py'} is nobody's"


@needs_root
def test_a_pth_path_line_naming_another_user_s_directory_is_steerable(tmp_path):
    # A root-owned .pth naming a directory of theirs (`pip install -e` of a user's checkout): `import torch`
    # then ran nobody's torch.py as root.
    venv, site = root_venv(tmp_path)
    checkout = tmp_path / "alice-checkout"
    checkout.mkdir()
    (site / "project.pth").write_text(f"# a comment\nimport os\n{checkout}\n")
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") is None
    os.chown(checkout, 65534, 65534)
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") == f"{site / 'project.pth'} puts {checkout} on the import path: {checkout} is nobody's"


@needs_root
def test_a_venv_s_home_is_read_in_any_case_as_python_reads_it(tmp_path):
    base = tmp_path / "alice-python" / "bin"
    base.mkdir(parents=True)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_bytes(Path(sys.executable).read_bytes()[:0])  # a copy's place; its bytes are not judged
    (venv / "pyvenv.cfg").write_text(f"HOME = {base}\n")
    os.chown(base, 65534, 65534)
    assert interpreter_trust.interpreter_steerable(venv / "bin" / "python") == f"{base} is nobody's"
