"""The NVML seam: with the child it runs (nvml_query.py), the only code that
talks to nvidia-ml-py (`import pynvml`).

It exposes only the facts checks use (an ``Inventory``, modelled in nvml_facts.py),
turns NVML's errors into a cause and a remedy a person can act on, and offers ``FakeNvml``: the
same facts read from a JSON file, for tests and demos on machines without a
GPU. NVML runs in a child process (preflight/readers/nvidia/nvml_query.py) with a deadline:
on a wedged driver nvmlInit can block forever, and the agent must not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from preflight.base.findings import Finding, Status
from preflight.base.errors import UsageError
from preflight.readers import capture
from preflight.readers.nvidia import nvml_child
from preflight.readers.nvidia.nvml_facts import GpuTrace, Inventory, PcieLink

# The remedies live beside the code that picks them, in the child.
from preflight.readers.nvidia.nvml_query import BROKEN, MISMATCH, NO_ACCESS, NO_DRIVER  # noqa: F401

if TYPE_CHECKING:
    from preflight.base.host import Started


class NvmlUnavailable(Exception):
    def __init__(self, cause: str, remedy: str):
        super().__init__(cause)
        self.cause = cause
        self.remedy = remedy


FAKE_LIMIT = 16 << 20  # bytes of a --nvml-fake file: a node's facts are a few KiB


def _beyond_nvml(data: Any, where: str = "") -> str | None:
    """Where a fake file holds what NVML never reports: an integer past 64 bits (NVML's widest),
    a string past 4 KiB. Such a value would break the checks' arithmetic, not judge a node."""
    if isinstance(data, bool):
        return None
    if isinstance(data, int) and not -(1 << 63) <= data < 1 << 64:
        return f"field {where or 'the top level'}: an integer beyond 64 bits"
    if isinstance(data, float) and data != data or isinstance(data, float) and abs(data) == float("inf"):
        return f"field {where or 'the top level'}: not a finite number"
    if isinstance(data, str) and len(data) > 4096:
        return f"field {where or 'the top level'}: a string of {len(data)} characters"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if why := _beyond_nvml(value, f"{where}.{key}" if where else str(key)):
            return why
    return None


def FakeNvml(path: Path) -> Inventory:  # noqa: N802 - reads like the class it stands in for
    """The facts of a recorded or invented node, from a JSON file (``--nvml-fake``)."""
    try:
        text = capture.read_file(path, FAKE_LIMIT + 1)  # a FIFO would hang the run, /dev/zero fill its memory
    except OSError as e:
        raise UsageError(f"--nvml-fake {path}: cannot read it ({e.strerror or e}); pass an existing JSON file") from None
    if text is None:
        raise UsageError(f"--nvml-fake {path}: not a regular file; pass a JSON file")
    if len(text) > FAKE_LIMIT:
        raise UsageError(f"--nvml-fake {path}: larger than {FAKE_LIMIT >> 20} MiB; a node's facts are a few KiB")
    try:
        data = json.loads(text)
    except ValueError as e:  # UnicodeDecodeError too
        raise UsageError(f"--nvml-fake {path}: not valid JSON: {e}") from None
    except RecursionError:
        raise UsageError(f"--nvml-fake {path}: not valid JSON: nested too deep") from None
    if why := _beyond_nvml(data):
        raise UsageError(f"--nvml-fake {path}: {why}; NVML gives no such value")
    if isinstance(data, dict):
        data["source"] = f"fake {path}"  # whatever the file says: fake facts must never pass for NVML's
    try:
        return Inventory.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the top level"
        raise UsageError(f"--nvml-fake {path}: field {where}: {err['msg']}") from None


def inventory(fake: Path | None = None, timeout: float = 20.0, started: Started | None = None) -> Inventory:
    """Every GPU's facts, from NVML in a child process (or from the fake file).
    ``started``: that child, begun earlier (``Shared.begin``)."""
    if fake is not None:
        return FakeNvml(fake)
    answer = _answer(started or _start("inventory"), timeout)
    try:
        return Inventory.model_validate(answer)
    except ValidationError as e:  # our own child disagreeing with our model: a bug, say so plainly
        raise NvmlUnavailable(f"NVML answered facts preflight cannot read: {e.errors()[0]['msg']}", BROKEN) from None


class Shared:
    """One run's inventory: read at the first ask, then the same facts (or the same
    failure) for every later one. Each read costs a child and its 0.4 s window of clock
    readings, and checks that judge one node must judge one reading of it. A failure is
    kept too: NVML that did not answer at detection is not asked again for each check's
    whole deadline, and each check still gets its cause. ``begin`` starts the child ahead
    of the first ask, so the run's other work goes on while NVML answers. ``forget`` drops
    the reading where the node may have changed since (another run held it meanwhile).
    ``facts``: a reading already made (a report built from recorded facts, or one a check
    waited for); ``given`` says so, and nothing reads this node's NVML again to replace it.
    Whoever begins a reading closes it (``close``), read or not: no child outlives the run."""

    def __init__(self, fake: Path | None = None, facts: Inventory | None = None, started: Started | None = None):
        """``started``: the inventory's child begun before the run knew its settings (nvml_child.early),
        taken as this reading's own: read at the first ask, or ended by ``close`` unread."""
        self.fake = fake
        self.given = facts is not None
        self._got: Inventory | NvmlUnavailable | None = facts
        self._started: Started | None = started
        if fake is not None and started is not None:
            started.stop()  # a fake file is read where it is asked for, never this node's NVML
            self._started = None

    def begin(self) -> None:
        """Start NVML's child now, where nothing is read yet (a fake file is read at ``get``)."""
        if self._got is None and self._started is None and self.fake is None:
            try:
                self._started = _start("inventory")
            except OSError:
                pass  # ``get`` starts it again and says why it cannot

    @property
    def pending(self) -> bool:
        """Whether a child begun is still to be read."""
        return self._started is not None

    def get(self, timeout: float = 20.0) -> Inventory:
        if self._got is None:
            started, self._started = self._started, None
            try:
                self._got = inventory(self.fake, timeout, started)
            except NvmlUnavailable as e:
                self._got = e
        if isinstance(self._got, NvmlUnavailable):
            raise NvmlUnavailable(self._got.cause, self._got.remedy)
        return self._got

    def forget(self) -> None:
        self.close()
        self._got = None

    def close(self) -> None:
        """End a child begun and not yet read."""
        started, self._started = self._started, None
        if started is not None:
            started.stop()


def pcie_links(timeout: float = 10.0) -> dict[str, PcieLink]:
    """PCIe link state now, by PCI bus id: read while a worker loads the links."""
    try:
        return {bus: PcieLink.model_validate(link) for bus, link in _ask("pcie", timeout).items()}
    except (ValidationError, AttributeError) as e:
        raise NvmlUnavailable(f"NVML answered a PCIe reading preflight cannot read: {e}", BROKEN) from None


def _ask(what: str, timeout: float) -> Any:
    return _answer(_start(what), timeout)


def _start(what: str) -> Started:
    """nvml_query's child for ``what``, started: its answer is read by ``_answer``."""
    return nvml_child.start(what)


def _answer(started: Started, timeout: float) -> Any:
    done = started.finish(timeout)
    if done.timed_out:
        raise NvmlUnavailable(f"NVML did not answer within {timeout:g} s: the driver is wedged", BROKEN)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise NvmlUnavailable(f"the NVML query died (exit {done.returncode}): {tail}", BROKEN) from None
    if "failed" in answer:
        raise NvmlUnavailable(answer["failed"]["cause"], answer["failed"]["remedy"])
    return answer["facts"]


class Sampler:
    """NVML sampled in a child while a load runs: ``start``, then ``stop`` once the load is
    over (it closes the child's stdin) for every GPU's trace. The child stops itself after
    ``most`` seconds, and ``stop`` kills it past its own deadline."""

    def __init__(self, period: float, most: float):
        import subprocess

        from preflight.base import tether

        self.most = most
        # Tethered as every tool is (forked by the agent's spawner thread, the parent-death signal
        # set before the exec): a sampler stuck in a wedged driver dies with the agent, whichever
        # thread of it asked, and from its first instruction on, not only once its imports are done.
        self.proc = tether.popen_tool([sys.executable, "-m", "preflight.readers.nvidia.nvml_query", "sample", f"{period:g}", f"{most:g}"], cwd="/",
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def stop(self, timeout: float = 20.0) -> list[GpuTrace]:
        import subprocess

        try:
            out, err = self.proc.communicate("", timeout=timeout)  # "" closes stdin: the load is over
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise NvmlUnavailable(f"NVML sampling did not end within {timeout:g} s of the load's end: the driver is wedged", BROKEN) from None
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = (err.strip().splitlines() or ["no output"])[-1]
            raise NvmlUnavailable(f"the NVML sampler died (exit {self.proc.returncode}): {tail}", BROKEN) from None
        if "failed" in answer:
            raise NvmlUnavailable(answer["failed"]["cause"], answer["failed"]["remedy"])
        try:
            return [GpuTrace.model_validate(g) for g in answer["facts"]["gpus"]]
        except (ValidationError, KeyError, TypeError) as e:
            raise NvmlUnavailable(f"NVML answered samples preflight cannot read: {e}", BROKEN) from None


def busy(inv: Inventory) -> str | None:
    """Why the GPUs are not free for a recheck (a job holds them), or None.

    A GPU NVML cannot ask about counts as busy: the recheck must never slow a
    running job, and skipping costs only a later recheck."""
    held = []
    for g in inv.gpus:
        if g.processes is None:
            held.append(f"GPU {g.index} (NVML cannot list its processes)")
        elif g.processes:
            pids = ", ".join(str(p.pid) for p in g.processes[:4]) + (" ..." if len(g.processes) > 4 else "")
            held.append(f"GPU {g.index} (pid {pids})")
    return "a job holds " + "; ".join(held) if held else None


def fake_finding(source: str) -> Finding:
    """Fail closed: a run on facts from --nvml-fake has not vouched for this node."""
    return Finding(Status.FAIL, "NVML facts are FAKE", f"the NVML facts came from {source}, not from this node's driver",
                   "drop --nvml-fake / PREFLIGHT_NVML_FAKE for a real verdict")
