"""readers/torch_build.py: what the job's torch was built for, from its interpreter, else from torch/version.py."""

import importlib.metadata
import sys

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
