"""Whether another user could have steered a path (base/pathtrust.py): a program root runs,
or a directory on the way to it, that is theirs, writable by others, or reached through a
link they could re-aim."""

import os
import sys
from pathlib import Path

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
