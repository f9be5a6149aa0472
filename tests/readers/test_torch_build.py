"""readers/torch_build.py: what the job's torch was built for, from its interpreter, else from torch/version.py."""

import importlib.metadata
import subprocess
import sys

import pytest
from cuda_facts import python_script

from preflight.base.host import Host
from preflight.readers import torch_build


def test_torch_s_version_file_answers_without_importing_torch(tmp_path):
    read, path = torch_build.torch_version_file(Host(), sys.executable, 10)
    assert (read.torch, read.error) == (importlib.metadata.version("torch"), None) and path.endswith("torch/version.py")
    assert read.cuda is None if "+cpu" in read.torch else read.cuda
    site = tmp_path / "site" / "torch"
    site.mkdir(parents=True)
    (site / "version.py").write_text("from typing import Optional\n__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n")
    other = python_script(tmp_path, f'case "$2" in *find_spec*) echo "{site}"; exit 0;; esac\nprintf "\\033[31mgarbage\\n"; exit 0\n')
    assert "printed 'garbage', not its answer (exit 0)" in torch_build.ask_torch(Host(), other, 10).error
    assert torch_build.torch_version_file(Host(), other, 10) == (torch_build.TorchCuda(torch="2.11.0+cu130", cuda="13.0"), str(site / "version.py"))


@pytest.mark.parametrize("script", ["ASK_TORCH", "FIND_TORCH"])
def test_every_child_asked_about_torch_dies_with_the_agent(script):
    # PR_GET_PDEATHSIG (2) after the script's own preamble; the import itself is cut off.
    text = getattr(torch_build, script).rsplit("\n", 1)[0] + "\n"
    probe = text + "import ctypes; s = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(s), 0, 0, 0); print('deathsig', s.value)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd="/")
    assert "deathsig 9" in done.stdout, done.stderr
