"""Recorded facts of the cuda check (tests/fixtures/nvml, tests/fixtures/cuda_init)
and a stand-in for the interpreter its worker runs under, shared by
tests/checks/test_cuda.py and tests/gpuwork/test_cuda_init.py."""

import stat
from pathlib import Path

from preflight.checks import cuda
from preflight.gpuwork import interpreter
from preflight.gpuwork.cuda_init import InitOutcome, InitReport
from preflight.readers.nvidia.nvml import FakeNvml
from preflight.readers.nvidia.nvml_facts import PcieLink

FIXTURES = Path(__file__).parent / "fixtures"
NVML = FIXTURES / "nvml"
INIT = FIXTURES / "cuda_init"


def facts(nvml_file: str, init: str | None = "healthy-8x", **kw) -> cuda.CudaFacts:
    outcome = None
    if init is not None:
        report = InitReport.model_validate_json((INIT / f"{init}.json").read_text())
        outcome = InitOutcome(python=report.python, ended="exit 0", returncode=0, timed_out=False, seconds=4.6, report=report)
    # Recorded facts, judged as if NVML had said them (tests/checks/test_cuda.py judges a fake *run* too).
    inventory = FakeNvml(NVML / nvml_file).model_copy(update={"source": "NVML"})
    return cuda.CudaFacts(inventory=inventory, kernel_log="/dev/kmsg", init=outcome, **kw)


def loaded_reading(inv, slow: int | None = None, gen: int = 3) -> dict[str, PcieLink]:
    """NVML's reading of every GPU's link while the worker copied: Gen5 x16, GPU ``slow`` at ``gen``."""
    return {g.pci_bus_id: PcieLink(gen=gen if g.index == slow else 5, width=16, gen_max=5, width_max=16) for g in inv.gpus}


def python_script(tmp_path: Path, body: str) -> str:
    """An executable that stands in for the training environment's python: asked for its
    version (preflight/gpuwork/interpreter.py) it answers as a Python does; else it runs ``body``."""
    path = tmp_path / "python"
    path.write_text(f'#!/bin/sh\nif [ "$1 $2" = "{" ".join(interpreter.ASK)}" ]; then echo "python 3.12"; exit 0; fi\n' + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)
