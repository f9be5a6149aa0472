"""The burnin check: its judges on the facts a burn-in gathers (a wrong result,
throttling, new ECC errors and Xids, a sagging clock, an outlier GPU), the NVML
sampler against the fake pynvml, and the worker for real on the cpu profile's
gloo ranks through the CLI, healthy and with a rank whose results go wrong mid-burn."""

import json
import time
from pathlib import Path

import pytest

import fakes
from conftest import clean_env, load_worker, make_ctx, run_preflight

from preflight.checkkit import burnin_traces, burnin_xid
from preflight.checks import burnin
from preflight.base.actions import Action, Domain
from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.pipeline.load_expectations import BurninExpect, OutlierExpect
from preflight.readers.nvidia import nvml, nvml_facts
from preflight.readers.kernel import log_sources

NVML = Path(__file__).parents[1] / "fixtures" / "nvml"
EXPECT = BurninExpect(seconds=300, seconds_source="test", sizes_source="test", clock_floor_mhz=1590, clock_source="H100 SXM base clock")
BAND = OutlierExpect(warn=0.05, fail=0.10, source="test band")
T0 = 1_700_000_000.0
THERMAL = 0x40  # hw_thermal_slowdown
BRAKE = 0x80  # hw_power_brake_slowdown
CAP = 0x4  # sw_power_cap: a GPU at its power limit under full load, not a fault


def rank_report(rank: int, **kw) -> dict:
    base = {"rank": rank, "local_rank": rank, "world_size": 4, "host": "n1", "pid": 100 + rank, "python": "py", "stage": "done", "backend": "nccl",
            "device": "cuda", "pci_bus_id": f"00000000:{0x18 + rank:02x}:00.0", "planned_seconds": 300, "gemm_n": 8192, "gemms": 20,
            "copy_bytes": 1 << 30, "bursts": 3, "burst_at": [0.0, 0.1, 0.2], "gemm_seconds": [0.25, 0.25, 0.25], "copy_seconds": [0.001] * 3,
            "burn_started_at": T0, "burn_seconds": 300.0}
    return {**base, **kw}


def trace(rank: int, clock=1980, temp=70, power=650.0, reasons=(CAP,), ecc=(0, 0), n=10, top=1980) -> nvml_facts.GpuTrace:
    """``n`` samples over the burn, the reasons taking turns, one sample before the load (idle, which must not count)."""
    samples = [(T0 - 5, 345, 70.0, 35, 0x1)] + [(T0 + 30 * i, clock, power, temp, reasons[i % len(reasons)]) for i in range(n)]
    return nvml_facts.GpuTrace(index=rank, pci_bus_id=f"00000000:{0x18 + rank:02X}:00.0", samples=samples, ecc_before=ecc[0], ecc_after=ecc[1],
                         max_sm_clock_mhz=top)


def facts(reports: list[dict], traces: list[nvml_facts.GpuTrace], **kw) -> burnin.BurninFacts:
    f = burnin.BurninFacts(python="py", backend="nccl", nproc=len(reports), ended="exit 0", returncode=0, traces=traces, **kw)
    for r in reports:
        f.ranks.append(burnin.ranks.RankOutcome(rank=r["rank"], gpu=f"GPU {r['rank']}", report=burnin.RankReport.model_validate(r)))
    return f


def judged(f: burnin.BurninFacts, band=BAND) -> list:
    return burnin.judge(f, burnin.rank_figures(f), EXPECT, band)


def healthy(n=4, **changes) -> burnin.BurninFacts:
    """``changes``: rank -> trace keyword arguments for that rank's GPU."""
    return facts([rank_report(r) for r in range(n)], [trace(r, **changes.get(f"gpu{r}", {})) for r in range(n)])


def test_a_healthy_burn_passes_and_reports_its_traces():
    f = healthy()
    assert judged(f) == []
    figs = burnin.rank_figures(f)
    assert figs[0]["clock_min_mhz"] == 1980 and figs[0]["samples"] == 10  # the idle sample before the load is left out
    assert figs[0]["temperature_max_c"] == 70 and figs[0]["power_max_w"] == 650.0
    names = {m.name for m in burnin.measurements(f, figs, BAND)}
    assert {"burnin_sm_clock_min", "burnin_sm_clock_median", "burnin_temperature_max", "burnin_power_max", "burnin_gemm_throughput"} <= names
    # Each figure's shortfall against the node's median, with the FAIL band as its ceiling, as the other measuring checks write it.
    short = {(m.name, m.labels["gpu"]): m for m in burnin.measurements(f, figs, BAND) if m.name.endswith("_median_shortfall")}
    assert {n for n, _ in short} == {"burnin_gemm_throughput_median_shortfall", "burnin_copy_bandwidth_median_shortfall", "burnin_sm_clock_median_shortfall"}
    assert short[("burnin_sm_clock_median_shortfall", "0")].value == 0 and short[("burnin_sm_clock_median_shortfall", "0")].ceiling == 0.10


def test_the_series_for_the_report_page_are_the_samples_under_load_thinned():
    f = healthy(n=2)
    f.traces[1] = trace(1, n=1000)  # a long burn sampled often: thinned to at most SERIES_POINTS
    f.ranks[1].report.burn_seconds = 30.0 * 1000
    got = burnin.series(f)
    assert set(got) == {"GPU 0", "GPU 1"}
    assert got["GPU 0"]["t"][0] == 0 and len(got["GPU 0"]["t"]) == 10  # the idle sample before the burn is left out
    assert got["GPU 0"]["clock_hz"][0] == 1980e6 and got["GPU 0"]["temperature_c"][0] == 70 and got["GPU 0"]["power_w"][0] == 650.0
    assert 200 <= len(got["GPU 1"]["t"]) <= burnin_traces.SERIES_POINTS and got["GPU 1"]["t"] == sorted(got["GPU 1"]["t"])
    # A dip of one sample survives the thinning, and a rank that hung mid-burn keeps its trace up to its last burst.
    f.traces[1].samples[501] = (f.traces[1].samples[501][0], 700, 650.0, 70, CAP)
    f.ranks[1].report.burn_seconds = None
    f.ranks[1].report.burst_at = [0.0, 30.0 * 600]
    got = burnin.series(f)
    assert min(got["GPU 1"]["clock_hz"]) == 700e6 and 100 <= len(got["GPU 1"]["t"]) <= burnin_traces.SERIES_POINTS
    assert max(got["GPU 1"]["t"]) <= 30.0 * 600


def test_a_wrong_result_names_the_rank_the_burst_and_when():
    reports = [rank_report(0), rank_report(1, wrong=[{"burst": 39, "at_seconds": 2.02, "what": "gemm", "elements": 1, "first_index": 46697, "max_abs_diff": 1.0}],
                                           wrong_bursts=19)]
    found = judged(facts(reports, [trace(0), trace(1)]))
    assert [x.status for x in found] == [Status.FAIL]
    assert found[0].summary == "GPU 1 computes wrong results under load (from 2.02 s, burst 39)"
    assert "burst 39 (2.02 s into the burn-in)" in found[0].cause and "19 of 3 bursts" not in found[0].summary


def test_a_gpu_whose_reference_product_differs_from_its_peers_fails_though_it_agrees_with_itself():
    """A GPU that computes the same wrong bits every time passes each burst against its own
    reference: only the other GPUs' references can tell (identical GPUs give identical bits:
    cuBLAS "Results reproducibility")."""
    h100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "reference_checksum": "00001a2b3c4d"}
    reports = [rank_report(r, **h100) for r in range(4)]
    reports[2]["reference_checksum"] = "00001a2b3c4e"
    found = judged(facts(reports, [trace(r) for r in range(4)]))
    assert [(x.summary, x.status) for x in found] == [("GPU 2 computes a different GEMM result than its peers", Status.FAIL)]
    assert "GPU 2 00001a2b3c4e than the other 3 (checksum 00001a2b3c4d)" in found[0].cause and "dcgmi diag" in found[0].remedy
    # Two GPUs that disagree: which is wrong cannot be told, so both are named.
    two = [rank_report(0, **h100), rank_report(1, **{**h100, "reference_checksum": "00001a2b3c4e"})]
    assert [x.summary for x in judged(facts(two, [trace(0), trace(1)]))] == ["GPUs disagree on the same GEMM: GPU 0, GPU 1"]
    # Agreeing GPUs, GPUs of different models (another SM count: other bits, no fault) and CPU ranks say nothing.
    assert judged(facts([rank_report(r, **h100) for r in range(4)], [trace(r) for r in range(4)])) == []
    mixed = [rank_report(0, **h100), rank_report(1, gpu_name="NVIDIA H100 PCIe", sm_count=114, reference_checksum="00001a2b3c4e")]
    assert judged(facts(mixed, [trace(0), trace(1)])) == []
    # MIG instances of one board (one name here, other SM counts), or a worker that did not say its SM count: not compared.
    mig = [rank_report(0, **h100), rank_report(1, **{**h100, "sm_count": 42, "reference_checksum": "00001a2b3c4e"})]
    assert judged(facts(mig, [trace(0), trace(1)])) == []
    unsaid = [rank_report(r, **{**h100, "sm_count": None, "reference_checksum": f"00001a2b3c4{r}"}) for r in range(3)]
    assert judged(facts(unsaid, [trace(r) for r in range(3)])) == []
    cpu = [rank_report(r, device="cpu", gpu_name=None, reference_checksum=f"00000000000{r}") for r in range(2)]
    assert burnin.judge_reference(facts(cpu, [])) == []


def test_sustained_thermal_or_power_brake_throttling_fails_and_a_moment_of_it_does_not():
    f = healthy(gpu2={"reasons": (THERMAL, CAP)}, gpu3={"reasons": (BRAKE,) + (CAP,) * 19, "n": 20})
    found = judged(f, band=None)
    assert len(found) == 1 and found[0].summary == "GPU 2 throttled under sustained load (hw_thermal_slowdown)"
    assert "hw_thermal_slowdown in 50% of samples" in found[0].cause  # GPU 3's 5% brake is under the 10% allowed


def test_under_generic_a_card_held_at_its_thermal_target_passes_and_hardware_slowdown_still_fails():
    # A workstation card with a blower: SW thermal slowdown in every sample under load, as it is built to run; no clock floor.
    from preflight.pipeline import profiles

    generic = profiles.load(profiles.find("generic", None)).burnin
    sw_thermal = 0x20
    f = healthy(gpu1={"reasons": (sw_thermal,), "clock": 1100}, gpu2={"reasons": (sw_thermal,), "clock": 1100},
                gpu3={"reasons": (sw_thermal,), "clock": 1100}, gpu0={"reasons": (sw_thermal,), "clock": 1100})
    assert burnin.judge(f, burnin.rank_figures(f), generic, None) == []
    assert [x.summary for x in burnin.judge(f, burnin.rank_figures(f), EXPECT, None)][0] == "GPU 0 throttled under sustained load (sw_thermal_slowdown)"
    hot = healthy(gpu2={"reasons": (THERMAL, CAP)})
    assert [x.summary for x in burnin.judge(hot, burnin.rank_figures(hot), generic, None)] == ["GPU 2 throttled under sustained load (hw_thermal_slowdown)"]


def test_a_new_uncorrectable_ecc_error_fails():
    found = judged(healthy(gpu1={"ecc": (0, 2)}), band=None)
    assert [x.summary for x in found] == ["GPU 1: 2 new uncorrectable ECC error(s) during burn-in"]


def test_a_clock_that_sags_below_the_profiles_floor_fails():
    found = judged(healthy(n=2, gpu0={"clock": 1400}, gpu1={"clock": 1400}), band=None)
    assert [x.summary for x in found] == ["GPU 0: SM clock sags to 1400 MHz under load", "GPU 1: SM clock sags to 1400 MHz under load"]
    assert "under the 1590 MHz floor (H100 SXM base clock)" in found[0].cause


def test_the_shipped_floor_is_half_the_gpus_own_top_clock_and_passes_a_power_capped_gpu():
    """The GPU profiles' floor: HW slowdown and the power brake cut clocks by 2x or more (nvml.h),
    while a healthy GPU held at its power cap runs far above half its top clock."""
    shipped = BurninExpect(seconds=300, seconds_source="test", sizes_source="test", clock_floor_fraction=0.5, clock_source="nvml.h")
    # A healthy H100 PCIe at its power cap in a hot chassis: 1384 of 1755 MHz. A braked V100: 382 of 1530.
    capped = healthy(n=2, gpu0={"clock": 1384, "top": 1755}, gpu1={"clock": 1384, "top": 1755})
    assert burnin.judge(capped, burnin.rank_figures(capped), shipped, None) == []
    braked = healthy(n=2, gpu1={"clock": 382, "top": 1530})
    found = burnin.judge(braked, burnin.rank_figures(braked), shipped, None)
    assert [x.summary for x in found] == ["GPU 1: SM clock sags to 382 MHz under load"]
    assert "under the 765 MHz floor, 50% of its 1530 MHz top clock (nvml.h)" in found[0].cause
    # NVML did not say the top clock: no floor to judge against, so no verdict from it.
    unknown = healthy(n=1, gpu0={"clock": 382, "top": None})
    assert burnin.judge(unknown, burnin.rank_figures(unknown), shipped, None) == []


def test_a_floor_needs_its_source():
    with pytest.raises(ValueError, match="need clock_source"):
        BurninExpect(seconds=1, seconds_source="t", sizes_source="t", clock_floor_fraction=0.5)


def test_a_gpu_clocked_lower_than_its_peers_is_an_outlier_and_a_warmer_one_is_not():
    # 1700 MHz clears the floor; against peers at 1980 it is 14% down: past the 10% FAIL band.
    # GPU 1 runs 6 C warmer than its peers, as GPUs downstream in a chassis's airflow do: a healthy
    # node (a GPU too hot shows as thermal slowdown, judged above).
    found = judged(healthy(gpu3={"clock": 1700}, gpu1={"temp": 76}))
    assert [(x.summary, x.status) for x in found] == [("GPU 3 median SM clock under sustained load 1700 MHz, 14% under the node's median 1980 MHz", Status.FAIL)]
    assert "clears the absolute floor" in found[0].cause and "preflight run --level full --only burnin" in found[0].remedy
    assert judged(healthy(gpu3={"clock": 1700}), band=None) == []  # no [outliers] band: not judged
    lagging = healthy(gpu3={"clock": 1700})
    short = [m for m in burnin.measurements(lagging, burnin.rank_figures(lagging), BAND) if m.name == "burnin_sm_clock_median_shortfall" and m.labels["gpu"] == "3"]
    assert round(short[0].value, 3) == 0.141


def test_a_rank_that_died_before_its_burn_is_not_judged_by_its_idle_samples():
    f = healthy(n=2)
    f.ranks[1].report.burn_started_at = None
    figs = burnin.rank_figures(f)
    assert figs[1]["samples"] == 0 and figs[1]["clock_median_mhz"] is None


def test_a_burn_nvml_or_the_kernel_log_could_not_watch_warns_that_it_was_not_judged():
    f = healthy(n=1)
    f.nvml_note, f.xid_log = "NVML sampling failed: NVML did not answer", burnin_xid.XID_UNJUDGED + "kernel log unreadable: no dmesg"
    assert [(x.summary, x.status) for x in judged(f)] == [("burn-in ran unwatched by NVML: clocks, power, throttling and ECC not judged", Status.WARN),
                                                          ("Xids during burn-in not judged", Status.WARN)]
    f = healthy(n=1)
    f.nvml_note = burnin.NO_NVML  # the cpu profile: nothing to watch, nothing missed
    assert judged(f) == []


def test_a_new_xid_during_the_burn_fails():
    f = healthy(n=1)
    f.new_xids = [{"code": 79, "pci": "0000:18:00", "raw": "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."}]
    assert [x.summary for x in judged(f)] == ["new Xid during burn-in: Xid 79 on 0000:18:00"]


def test_a_new_xid_during_the_burn_takes_the_highest_catalog_action_and_at_least_a_drain():
    f = healthy(n=1)
    f.new_xids = [{"code": 13, "pci": "0000:18:00", "raw": "NVRM: Xid (PCI:0000:18:00): 13, Graphics SM Warp Exception"},
                  {"code": 79, "pci": "0000:18:00", "raw": "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."}]
    (found,) = judged(f)
    assert (found.next.action, found.next.domain) == (Action.REBOOT, Domain.NODE)
    assert found.next.source.startswith("NVIDIA Xid catalog (2026-11-22): Xid 79 RESTART_BM")
    f.new_xids = f.new_xids[:1]  # the known-good burn hit an application Xid: the GPU's fault, drained
    (found,) = judged(f)
    assert (found.status, found.next.action, found.next.domain) == (Status.FAIL, Action.DRAIN, Domain.NODE)
    assert found.next.source.startswith("NVIDIA Xid catalog (2026-11-22): Xid 13 RESTART_APP")


def test_an_xid_on_a_gpu_the_burn_did_not_load_warns_and_one_on_a_loaded_gpu_still_fails():
    # Two of a node's GPUs burned (0000:18:00, 0000:19:00); another GPU logs a node-domain Xid meanwhile.
    f = healthy(n=2)
    other = {"code": 48, "pci": "0000:c1:00", "raw": "NVRM: Xid (PCI:0000:c1:00): 48, pid=1234, DBE (double bit error) ECC error"}
    f.new_xids = [other]
    (found,) = judged(f)
    assert (found.status, found.summary) == (Status.WARN, "new Xid during burn-in on a GPU it did not load: Xid 48 on 0000:c1:00")
    assert found.cause.startswith("the burn-in loaded 0000:18:00, 0000:19:00; the kernel logged NVRM: Xid (PCI:0000:c1:00): 48")
    assert found.next.action == Action.WATCH
    f.new_xids = [other, {"code": 79, "pci": "0000:19:00", "raw": "NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus."}]
    assert [(x.status, x.summary) for x in judged(f)] == [(Status.WARN, "new Xid during burn-in on a GPU it did not load: Xid 48 on 0000:c1:00"),
                                                         (Status.FAIL, "new Xid during burn-in: Xid 79 on 0000:19:00")]


def test_an_xid_on_a_gpu_not_given_to_the_run_is_said_not_judged():
    """Was: a pod given 2 of 8 GPUs WARNed its full level on another pod's DBE (Xid 48) logged
    while it burned; the cuda check already leaves that GPU's Xids to the run that holds it."""
    f = healthy(n=2)
    other = {"code": 48, "pci": "0000:c1:00", "raw": "NVRM: Xid (PCI:0000:c1:00): 48, pid=1234, DBE (double bit error) ECC error"}
    f.new_xids = [other]
    assert burnin.judge(f, burnin.rank_figures(f), EXPECT, BAND, {"0000:c1:00", "0000:c2:00"}) == []
    assert burnin_xid.given_elsewhere(f.new_xids, burnin_xid.burned_gpus(f.ranks, f.buses), {"0000:c1:00"}) == [other]
    # One on a GPU the burn loaded still fails, whatever the others are.
    f.new_xids = [other, {"code": 79, "pci": "0000:19:00", "raw": "NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus."}]
    assert [(x.status, x.summary) for x in burnin.judge(f, burnin.rank_figures(f), EXPECT, BAND, {"0000:c1:00"})] == [
        (Status.FAIL, "new Xid during burn-in: Xid 79 on 0000:19:00")]


def test_another_jobs_own_xid_on_a_gpu_the_burn_did_not_load_is_no_finding():
    # Its bad address (13) and the reset that ends it (43) are that job's, as the cuda check tells them.
    f = healthy(n=2)
    f.new_xids = [{"code": 13, "pci": "0000:c1:00", "raw": "NVRM: Xid (PCI:0000:c1:00): 13, pid=4242, name=python, Graphics SM Warp Exception"},
                  {"code": 43, "pci": "0000:c1:00", "raw": "NVRM: Xid (PCI:0000:c1:00): 43, pid=4242, name=python, Ch 00000010"}]
    assert judged(f) == []
    f.new_xids[0]["pci"] = f.new_xids[1]["pci"] = "0000:19:00"  # on a GPU the known-good burn loaded: the GPU's fault
    (found,) = judged(f)
    assert found.status == Status.FAIL and found.next.action == Action.DRAIN


def test_which_gpus_burned_comes_from_the_ranks_else_the_inventory_and_unknown_judges_every_xid():
    f = facts([rank_report(0, pci_bus_id=None), rank_report(1, pci_bus_id=None)], [trace(0), trace(1)])
    other = {"code": 13, "pci": "0000:c1:00", "raw": "NVRM: Xid (PCI:0000:c1:00): 13, Graphics SM Warp Exception"}
    f.new_xids = [other]
    assert burnin_xid.burned_gpus(f.ranks, f.buses) is None  # an older torch says no bus id, and no inventory: every Xid is the burn's
    assert [x.status for x in judged(f)] == [Status.FAIL]
    f.buses = {0: "00000000:18:00.0", 1: "00000000:C1:00.0"}  # the cuda check's NVML inventory, by nvidia-smi index
    assert burnin_xid.burned_gpus(f.ranks, f.buses) == {"0000:18:00", "0000:c1:00"}
    assert [x.status for x in judged(f)] == [Status.FAIL]  # GPU 1 is the one that burned
    f.new_xids = [{**other, "pci": None, "raw": "NVRM: Xid 13"}]  # no GPU named: it may be a loaded one
    f.buses = {0: "00000000:18:00.0", 1: "00000000:19:00.0"}
    assert [x.status for x in judged(f)] == [Status.FAIL]


def test_an_xid_read_through_syslog_still_fails_but_asks_only_a_drain_for_a_person():
    # Through syslog(2) another user's message may imitate the driver's line: no reboot or RMA on its word.
    f = healthy(n=1)
    f.new_xids = [{"code": 79, "pci": "0000:18:00", "raw": "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."}]
    f.xid_note = log_sources.SYSLOG_NOTE
    (found,) = judged(f)
    assert (found.status, found.next.action, found.next.domain) == (Status.FAIL, Action.DRAIN, Domain.SOFTWARE)
    assert "read through syslog(2)" in found.next.source


def test_the_sampler_reads_clocks_power_temperature_reasons_and_ecc_from_nvml(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML_FACTS", str(NVML / "h100-sxm-8x-healthy.json"))
    sampler = nvml.Sampler(period=0.05, most=30)
    time.sleep(0.5)
    started = time.monotonic()
    traces = sampler.stop()
    assert time.monotonic() - started < 5  # closing stdin ends it at once, not at `most`
    assert len(traces) == 8 and len(traces[0].samples) >= 3
    stamp, clock, power, temp, reasons = traces[0].samples[-1]
    assert clock == 1980 and power == 650.0 and temp is not None and reasons is not None
    assert traces[0].ecc_before == traces[0].ecc_after == 0 and traces[0].max_sm_clock_mhz == 1980


# ---- for real on the cpu profile (gloo ranks), through the CLI -------------------------------------


def test_burnin_runs_on_the_cpu_profiles_ranks_and_says_there_is_no_nvml(tmp_path):
    # One rank: a healthy burn with no peer to be an outlier against. Two healthy ranks beside
    # other work read 62% apart (the cpu band FAILs past 60%); the median's verdicts are tested
    # on recorded facts above and in test_outliers_judge.py. One OpenMP thread, as torchrun gives each
    # of several ranks: a lone rank's two spinning threads on busy cores burned 11 bursts, not 35.
    env = {**clean_env(), "PREFLIGHT_LOCK_FILE": str(tmp_path / "lock"), "OMP_NUM_THREADS": "1"}
    p = run_preflight(["run", "--profile", "cpu", "--level", "full", "--only", "burnin", "--nproc-per-node", "1", "--json"], env=env)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)["checks"][0]
    assert result["status"] == "PASS" and "1 gloo rank(s) under load" in result["summary"]
    assert result["details"]["nvml"] == burnin.NO_NVML
    assert all(fig["bursts"] > 10 for fig in result["details"]["traces"].values())


def test_a_rank_whose_results_go_wrong_mid_burn_fails_the_full_level(tmp_path):
    env = {**clean_env(), "PREFLIGHT_LOCK_FILE": str(tmp_path / "lock"), "PREFLIGHT_WORKER_FAULT": "1:wrong=2@burnin"}
    p = run_preflight(["run", "--profile", "cpu", "--level", "full", "--only", "burnin", "--json"], env=env)
    assert p.returncode == 1, p.stderr
    result = json.loads(p.stdout)["checks"][0]
    wrong = result["details"]["ranks"][1]["report"]["wrong"][0]
    # The first wrong burst is named by when it came (2 s or later, as the fault asks: "2 s" itself where it came on the dot).
    assert result["status"] == "FAIL" and result["summary"].startswith(f"rank 1 computes wrong results under load (from {wrong['at_seconds']:g} s, burst {wrong['burst']})")
    assert wrong["at_seconds"] >= 2.0 and not result["details"]["ranks"][0]["report"]["wrong"]


def test_a_burn_longer_than_the_checks_deadline_is_shortened_and_says_so():
    # A site asking CoreWeave's 20 minutes of a check whose deadline is 10 minutes: the burn fits
    # the deadline (not a hang killed at 600 s) and the result says it ran shorter.
    assert burnin.burn_seconds(1200, 600) == 540 and burnin.burn_seconds(300, 600) == 300 and burnin.burn_seconds(3, 2) == 1.0
    f = healthy(n=1)
    f.shortened = "[burnin] seconds = 1200, but the check has 600 s in all"
    assert [(x.summary, x.status) for x in judged(f)] == [("burn-in shortened to fit the check's deadline", Status.WARN)]


def test_the_xid_reading_names_an_unreadable_journalctl_and_reads_dmesg(tmp_path):
    bin_dir = fakes.tool(tmp_path / "bin", "journalctl", prints=fakes.BAD_OUTPUT["binary"])
    fakes.tool(bin_dir, "dmesg", prints=Path(__file__).parents[1] / "fixtures" / "xid" / "no-gpu-event_dmesg_dev-machine-boot.txt")
    facts = burnin.BurninFacts(python="python", backend="nccl", nproc=1)
    events, where, _ = burnin_xid.xid_counts(Host(tmp_path / "root", environ={"PATH": str(bin_dir)}), facts)
    assert events == [] and where == "dmesg"
    assert facts.xid_unread["journalctl"] == "printed no kernel log line (garbage, or not a kernel log)"
    sources = burnin_xid.kernel_log_sources(where, facts.xid_unread)
    assert sources.details()["sources"] == {"kernel log": "dmesg"}
    assert {m.labels["tool"]: m.labels["fallback"] for m in sources.measurements()}["journalctl"] == "dmesg"


def test_a_ring_that_moved_past_the_burn_with_no_journal_warns_and_still_judges_what_it_holds(tmp_path):
    """Was: any user can fill the kernel ring (a failed mount in a user namespace logs its options),
    and a real Xid logged during the burn was then gone from /dev/kmsg by the second read: with no
    journal to fill in, the burn passed with no word of it. Now the gap in the records is said (a
    WARN), and an Xid the ring still holds FAILs as ever (a failing GPU is what floods the ring)."""
    kmsg = tmp_path / "root" / "dev" / "kmsg"
    kmsg.parent.mkdir(parents=True)
    ctx = make_ctx(host=Host(tmp_path / "root", environ={"PATH": str(tmp_path / "none")}))  # no journalctl, no dmesg
    facts = burnin.BurninFacts(python="python", backend="nccl", nproc=1)
    kmsg.write_text("".join(f"6,{n},{n * 1000},-;tmpfs: Bad value for 'size'\n" for n in range(1201, 1211)))
    before, where, span = burnin_xid.xid_counts(ctx.host, facts)
    assert span == (1201, 1210) and where == str(kmsg)
    xid79 = "3,5010,5010000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n"
    kmsg.write_text("".join(f"6,{n},{n * 1000},-;tmpfs: Bad value for 'size'\n" for n in range(5000, 5010)) + xid79)  # #1211-#4999 lost
    after, where, span_after = burnin_xid.xid_counts(ctx.host, facts)
    facts.xid_gap = burnin_xid.lost_meanwhile(span, span_after, where)
    facts.new_xids = burnin_xid.new_xids(before, after, True)
    assert "#1210" in facts.xid_gap and "#5000" in facts.xid_gap
    f = healthy(n=1)
    f.xid_gap, f.new_xids = facts.xid_gap, facts.new_xids
    assert [(x.status, x.summary) for x in judged(f)] == [(Status.FAIL, "new Xid during burn-in: Xid 79 on 0000:18:00"),
                                                         (Status.WARN, "Xids during burn-in not all seen")]
    # Nothing lost between the reads, or a journal that gave what the ring lost: judged as ever.
    assert burnin_xid.lost_meanwhile(span, (1201, 1300), where) is None and burnin_xid.lost_meanwhile(span, (1211, 1300), where) is None
    assert burnin_xid.lost_meanwhile(span, span_after, where + " + journalctl -k -b --no-pager -o json") is None


@pytest.mark.parametrize("capability, dtype", [((9, 0), "bfloat16"), ((8, 0), "bfloat16"), ((12, 1), "bfloat16"), ((7, 5), "float16"), ((7, 0), "float16"), (None, "float32")])
def test_the_burn_in_gemms_are_bf16_from_ampere_on_fp16_before_and_fp32_on_the_cpu(capability, dtype):
    assert load_worker("burnin").gemm_dtype(capability) == dtype
