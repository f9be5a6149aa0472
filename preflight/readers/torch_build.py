"""What the job's interpreter's torch was built for: torch.__version__ and torch.version.cuda.

Asked of the interpreter itself in a child with a deadline (importing torch is the
truth: the torch that imports is the one the job runs). Where that child cannot
answer (it hangs on a cold network filesystem, or prints something else), the
installed torch/version.py says the same without importing torch.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

from pydantic import BaseModel

from preflight.base.host import Host, read_stripped

TORCH_TIMEOUT = 60.0  # importing torch from a cold page cache on a network filesystem takes tens of seconds
# Dies with the agent (PR_SET_PDEATHSIG): a torch import can take seconds, an interpreter's start on a
# cold network filesystem as long, and nothing outlives a killed run.
DIES_WITH_AGENT = "import ctypes\ntry: ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\nexcept Exception: pass\n"
ASK_TORCH = DIES_WITH_AGENT + "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda}))"


class TorchCuda(BaseModel):
    torch: str | None = None
    cuda: str | None = None  # torch.version.cuda; None: a CPU build
    error: str | None = None  # why the interpreter did not say


def ask_torch(host: Host, python: str, timeout: float) -> TorchCuda:
    """torch.version.cuda of the job's interpreter, in a child with a deadline."""
    try:
        done = host.run([python, "-c", ASK_TORCH], timeout, cwd="/")  # cwd "/": no stray torch.py beside the caller
    except OSError as e:
        return TorchCuda(error=f"cannot run {python}: {e.strerror or e}")
    if done.timed_out:
        return TorchCuda(error=f"{python} did not import torch within {timeout:g} s")
    # The answer is the last line that parses: a sitecustomize or a library may print around it.
    for line in reversed(done.stdout.strip().splitlines()):
        try:
            said = json.loads(line)
            return TorchCuda(torch=str(said["torch"]), cuda=said["cuda"] and str(said["cuda"]))
        except (ValueError, KeyError, TypeError):
            continue
    tail = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    if not done.stderr.strip() and done.stdout.strip():
        tail = f"printed {tail[:60]!r}, not its answer (exit {done.returncode})"
    return TorchCuda(error=f"{python} could not say torch.version.cuda: {tail}")


# torch/version.py, as torch's build writes it: "__version__ = '2.11.0+cu130'", "cuda: Optional[str] = '13.0'".
_TORCH_VERSION = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.M)
_TORCH_CUDA = re.compile(r"^cuda(?:\s*:[^=\n]*)?\s*=\s*(?:['\"]([^'\"]*)['\"]|None)\s*$", re.M)
FIND_TORCH = DIES_WITH_AGENT + "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0] if s else '')"


def torch_version_file(host: Host, python: str, timeout: float) -> tuple[TorchCuda, str | None]:
    """torch.version.cuda read from the installed torch/version.py without importing torch (no
    CUDA, no seconds of import), and the file it came from; for another interpreter, only
    its import machinery is asked where torch lies."""
    if python == sys.executable:
        spec = importlib.util.find_spec("torch")
        where = (spec.submodule_search_locations or [None])[0] if spec else None
    else:
        try:
            done = host.run([python, "-c", FIND_TORCH], timeout, cwd="/")
        except OSError as e:
            return TorchCuda(error=f"cannot run {python}: {e.strerror or e}"), None
        lines = [line for line in done.stdout.splitlines() if line.startswith("/")]
        where = lines[-1] if done.returncode == 0 and lines else None
    if not where:
        return TorchCuda(error=f"{python} finds no torch package"), None
    path = Path(where) / "version.py"
    text = read_stripped(path)
    version, cuda = _TORCH_VERSION.search(text or ""), _TORCH_CUDA.search(text or "")
    if not version or not cuda:
        return TorchCuda(error=f"{path} " + ("unreadable" if text is None else "names no torch and CUDA version")), None
    return TorchCuda(torch=version.group(1), cuda=cuda.group(1) or None), str(path)
