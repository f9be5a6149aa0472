"""The cuda_init worker run and its report: which of NVML's GPUs each CUDA
device is, the PCIe links read only while the worker loads them, and the
worker run by hand."""

import json
import subprocess
import sys

import pytest
import cuda_facts
from cuda_facts import NVML, facts, loaded_reading, python_script

from preflight.gpuwork import cuda_init as cuda, launch_output
from preflight.readers.nvidia.nvml import FakeNvml


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
        'while [ ! -e "$3/$7" ]; do sleep 0.02; done\n'
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


# ---- the shared launch: each rank probes its own GPU ------------------------------------

def _worker():
    import importlib.util

    sys.path.insert(0, str(cuda.launch.WORKERS_DIR))  # the worker imports _rank from beside it, as torchrun runs it
    spec = importlib.util.spec_from_file_location("cuda_init_worker", cuda.launch.WORKERS_DIR / "cuda_init.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rank, ranks, count, devices", [
    (0, 1, 8, list(range(8))),  # a process of its own: every GPU
    (3, 8, 8, [3]),  # one rank per GPU: its own and no other's
    (1, 4, 8, [1, 5]),  # fewer ranks than GPUs: the ones no rank uses are shared out
    (3, 4, 2, []),  # a rank with no GPU of its own touches none
])
def test_a_rank_probes_only_the_gpus_it_owns(rank, ranks, count, devices):
    assert _worker().owned(rank, ranks, count) == devices


def _split(report: dict, ranks: int) -> dict[int, dict]:
    """healthy-8x.json as eight ranks write it, each having probed its own device."""
    return {k: {**report, "devices": [d for d in report["devices"] if d["index"] % ranks == k], "probed": list(range(k, 8, ranks))} for k in range(ranks)}


def test_the_ranks_reports_read_as_one_probe_of_every_gpu():
    whole = json.loads((cuda_facts.INIT / "healthy-8x.json").read_text())
    merged = cuda.InitReport.model_validate(cuda.merge(_split(whole, 8)))
    assert [d.index for d in merged.devices] == list(range(8)) and [d.rank for d in merged.devices] == list(range(8))
    assert merged.probed == {k: [k] for k in range(8)}
    assert merged.stage == "done" and merged.load_end == "stop" and merged.current is None
    assert merged.model_dump(exclude={"devices", "probed"}) == cuda.InitReport.model_validate(whole).model_dump(exclude={"devices", "probed"})


def test_a_rank_hung_on_its_gpu_is_named_and_so_is_its_gpu():
    from preflight.checks import cuda as check

    whole = json.loads((cuda_facts.INIT / "healthy-8x.json").read_text())
    reports = _split(whole, 8)
    reports[3] = {**reports[3], "stage": "devices", "current": 3, "devices": [], "load_end": None, "seconds": None}
    merged = cuda.InitReport.model_validate(cuda.merge(reports))
    assert merged.stage == "devices" and merged.current == 3 and merged.load_end == "stop"
    f = facts("h100-sxm-8x-healthy.json")
    outcome = f.init.model_copy(update={"report": merged, "timed_out": True, "returncode": None, "ended": "killed at the deadline after 55 s"})
    [finding] = check.judge_init(outcome, f.inventory)
    assert finding.summary == "CUDA init hung on GPU 3 (0000:61:00.0)"


def _mid_probe(ranks: tuple[int, ...]) -> dict[int, dict]:
    """healthy-8x.json as eight ranks write it, the given ones stopped while probing their own GPU."""
    reports = _split(json.loads((cuda_facts.INIT / "healthy-8x.json").read_text()), 8)
    for k in ranks:
        reports[k] = {**reports[k], "stage": "devices", "current": k, "devices": [], "load_end": None, "seconds": None}
    return reports


def _judged(merged: dict, **ended) -> str:
    from preflight.checks import cuda as check

    f = facts("h100-sxm-8x-healthy.json")
    outcome = f.init.model_copy(update={"report": cuda.InitReport.model_validate(merged), **ended})
    [finding] = check.judge_init(outcome, f.inventory)
    return finding.summary


def test_a_rank_that_crashed_names_its_gpu_not_the_one_torchrun_stopped_mid_probe():
    # Every rank probes at once: rank 3 segfaults on GPU 3 and torchrun sends the others
    # SIGTERM, rank 0 still in its probe of GPU 0. torchrun's own summary says which died of its own.
    log = (cuda_facts.INIT / "torchrun-4-ranks-rank3-sigsegv.txt").read_text().splitlines()
    exits, root = launch_output.torchrun_exits(log), launch_output.torchrun_root_cause(log)
    assert exits == {0: -15, 1: -15, 2: -15, 3: -11} and root == 3
    merged = cuda.merge(_mid_probe((0, 3)), exits, root)
    assert merged["unfinished"] == [3] and merged["current"] == 3
    assert _judged(merged, returncode=1, ended="exit 1") == "CUDA init died on GPU 3 (0000:61:00.0)"
    # Without the root cause line, the rank that was not sent its end is still the one.
    assert cuda.merge(_mid_probe((0, 3)), exits)["unfinished"] == [3]


def test_a_crash_no_rank_owns_names_every_gpu_still_being_probed():
    # torchrun said nothing (killed with the launch): no rank is known to have died of its own.
    merged = cuda.merge(_mid_probe((0, 3)), {})
    assert merged["unfinished"] == [0, 3] and merged["current"] is None
    assert _judged(merged, returncode=1, ended="exit 1") == "CUDA init died on GPU 0 (0000:1b:00.0) and GPU 3 (0000:61:00.0)"


def test_a_crash_outside_every_probe_names_no_gpu_a_stopped_rank_was_probing():
    reports = _mid_probe((0,))
    merged = cuda.merge(reports, {0: -15, 1: -15, 2: -15, 3: -11}, 3)  # rank 3 died past its probe
    assert merged["unfinished"] == [] and merged["current"] is None


def test_two_ranks_hung_on_their_gpus_are_both_named():
    # At the deadline the agent kills the launch: every rank ends by its SIGKILL.
    merged = cuda.merge(_mid_probe((0, 3)), {k: -9 for k in range(8)})
    assert merged["unfinished"] == [0, 3]
    assert _judged(merged, timed_out=True, returncode=None, ended="killed at the deadline after 55 s") == (
        "CUDA init hung on GPU 0 (0000:1b:00.0) and GPU 3 (0000:61:00.0)")


def test_the_links_are_read_only_once_every_rank_is_copying():
    assert not cuda.loading([{"stage": "load"}, {"stage": "devices"}])
    assert not cuda.loading([{"stage": "load"}, None])
    assert cuda.loading([{"stage": "load"}, {"stage": "load"}])
    assert cuda.loading([{"stage": "load"}, {"stage": "done"}])  # a rank with no GPU of its own
    assert not cuda.loading([{"stage": "done"}, {"stage": "done"}])


def test_in_a_shared_launch_every_rank_runs_the_cuda_stage_itself():
    # Real gloo ranks on CPU torch: each stops at "CPU-only build", but each wrote its own
    # report, so none sat idle while another made contexts on every GPU.
    from preflight.gpuwork.world import Worlds

    worlds = Worlds()
    try:
        outcome, _ = cuda.run_init(sys.executable, timeout=120, read_links=False, worlds=worlds, nproc=2)
    finally:
        worlds.close()
    assert outcome.report is not None and outcome.report.error_kind == "cpu_build"
    assert outcome.report.probed == {0: None, 1: None}
