"""Is ``--python`` a Python at all? Asked only once a worker under it said nothing.

Workers and torchrun run under the interpreter ``--python`` names. When one ends
without a word (``--python /bin/false`` exits 1 at once, a shell script prints
something else), "torchrun never started the ranks" would send a person hunting
in torch. So the checks that saw no word ask the interpreter to print its
version, with a deadline, and name it where it does not answer as a Python does.
A healthy run never pays for the question.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from preflight.base.findings import Finding, Status
from preflight.base.host import Host

ASK = ("-c", "import sys; print('python %d.%d' % sys.version_info[:2])")
TIMEOUT = 10.0  # a Python starts in well under a second, even on a loaded node
REMEDY = ("point --python (PREFLIGHT_PYTHON, or python in the config file) at the training environment's "
          "interpreter, e.g. /opt/venv/bin/python")


class Answer(BaseModel):
    """What the interpreter did when asked for its version."""

    returncode: int | None  # None: no answer within TIMEOUT
    output: str  # its first line of output, stdout before stderr
    version: str | None  # "3.11" where it answered as a Python does


def ask(python: str, host: Host | None = None) -> Answer:
    try:
        done = (host or Host()).run([python, *ASK], TIMEOUT)
    except OSError as e:
        return Answer(returncode=None, output=f"could not be started: {e.strerror or e}", version=None)
    said = (done.stdout.strip() or done.stderr.strip()).splitlines()
    first = said[0][:200] if said else ""
    m = re.fullmatch(r"python (\d+\.\d+)", done.stdout.strip())
    return Answer(returncode=None if done.timed_out else done.returncode, output=first, version=m[1] if m and done.returncode == 0 else None)


def judge(python: str, answer: Answer | None, what: str) -> Finding | None:
    """A FAIL naming ``python`` where it is no Python, with what it did; ``what`` says what ran
    under it and how that ended ("torchrun ended (exit 1) before any rank started")."""
    if answer is None or answer.version is not None:
        return None
    if answer.returncode is None:
        did = answer.output if answer.output.startswith("could not be started") else f"gave no answer within {TIMEOUT:g} s"
    else:
        did = f"exited {answer.returncode}" + (f", printing {answer.output!r}" if answer.output else " with no output")
    cause = f"asked to print its version (`{python} {ASK[0]} \"{ASK[1]}\"`), {python} {did}; {what}"
    return Finding(Status.FAIL, f"{python} is not a Python interpreter", cause, REMEDY)
