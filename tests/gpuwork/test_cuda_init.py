"""The cuda_init worker run and its report: which of NVML's GPUs each CUDA
device is, the PCIe links read only while the worker loads them, and the
worker run by hand."""

import json
import subprocess
import sys

import pytest
from cuda_facts import NVML, facts, loaded_reading, python_script

from preflight.gpuwork import cuda_init as cuda
from preflight.readers.nvml import FakeNvml


def test_uuids_match_nvml_s_whatever_order_cuda_counts_in():
    f = facts("h100-sxm-8x-healthy.json", init="no-pci-bus-id-8x")
    r = f.init.report
    backwards = r.model_copy(update={"uuids": r.uuids[::-1], "cuda_device_order": None})
    gpus, _ = cuda.nvml_gpus(backwards, f.inventory)
    assert [g.index for g in gpus] == [7, 6, 5, 4, 3, 2, 1, 0]


def test_a_reading_nvml_could_not_take_leaves_the_generation_unjudged_saying_why():
    f = facts("h100-sxm-8x-healthy.json")
    f.init.links_unread = "NVML could not read the links under load: NVML did not answer within 10 s: the driver is wedged"
    assert cuda.loaded_links(f.init, None, f.inventory) == (None, f.init.links_unread)
    assert cuda.loaded_links(f.init, loaded_reading(f.inventory), f.inventory)[1] is None


@pytest.mark.parametrize("load_end, judged_under_load", [("stop", True), ("time", False)])
def test_pcie_is_read_while_the_worker_loads_and_only_then_kept(tmp_path, monkeypatch, load_end, judged_under_load):
    # A stand-in worker: says it is loading, waits for the agent's stop file,
    # then reports whether the stop file (or its own clock) ended the load.
    import fakes

    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML_FACTS", str(NVML / "h100-sxm-pcie-x8.json"))
    python = python_script(tmp_path, (
        'printf \'{"python": "x", "stage": "load"}\' > "$3/.tmp" && mv "$3/.tmp" "$3/rank0.json"\n'
        'while [ ! -e "$7" ]; do sleep 0.02; done\n'
        # It loaded two GPUs only (as under CUDA_VISIBLE_DEVICES=0,2).
        f'printf \'{{"python": "x", "stage": "done", "load_end": "{load_end}", "pci_bus_ids": ["00000000:1b:00.0", "00000000:52:00.0"]}}\' > "$3/.tmp" && mv "$3/.tmp" "$3/rank0.json"\n'
    ))
    outcome, readings = cuda.run_init(python, timeout=30, read_links=True)
    assert outcome.report and outcome.report.stage == "done"
    loaded, why = cuda.loaded_links(outcome, readings, FakeNvml(NVML / "h100-sxm-pcie-x8.json"))
    if judged_under_load:
        # Only the loaded GPUs' readings are kept: the idle six would read Gen1.
        assert loaded is not None and sorted(loaded) == ["00000000:1B:00.0", "00000000:52:00.0"]
        assert loaded["00000000:52:00.0"].width == 8 and why is None
    else:
        assert loaded is None  # the load had ended before the reading: idle numbers are not judged
        assert why == "the worker's load ended before NVML read the links (an idle link reads Gen1)"


def test_the_worker_runs_by_hand_and_prints_its_report():
    done = subprocess.run([sys.executable, str(cuda.launch.WORKERS_DIR / "cuda_init.py")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert json.loads(done.stdout)["error_kind"] == "cpu_build"
