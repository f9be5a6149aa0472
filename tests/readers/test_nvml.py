"""The NVML seam: the real adapter against a fake `pynvml` in a child process
(causes, remedies, deadline, every fact), and FakeNvml from JSON files."""

import json
import subprocess
import sys
import time
from pathlib import Path

import fakes
import psutil
import pytest

from preflight.readers.nvidia import nvml, nvml_facts, nvml_inventory
from preflight.base.errors import UsageError
from preflight.readers.nvidia.nvml import FakeNvml, NvmlUnavailable

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvml"
ALL = sorted(FIXTURES.glob("*.json"))


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    """Point the NVML child at the fake pynvml: ``fake_nvml(mode, facts_file)``."""
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))

    def use(mode: str = "", facts: Path | None = None) -> None:
        monkeypatch.setenv("FAKE_NVML", mode)
        if facts is not None:
            monkeypatch.setenv("FAKE_NVML_FACTS", str(facts))

    return use


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_the_adapter_reads_every_fact_the_fake_file_holds(fake_nvml, path):
    # The same facts two ways: through pynvml calls, and straight from JSON.
    fake_nvml(facts=path)
    assert nvml.inventory().model_dump(exclude={"source"}) == FakeNvml(path).model_dump(exclude={"source"})


def test_the_ecc_mode_a_card_ships_with_is_read_where_nvml_says_it(fake_nvml, tmp_path):
    # A workstation card: ECC off, as it ships; the first GPU's driver says nothing of its default.
    data = json.loads((FIXTURES / "l40s-2x.json").read_text())
    data["gpus"][0].update(ecc_mode=False, ecc_default=None)
    data["gpus"][1].update(ecc_mode=False, ecc_default=False)
    (tmp_path / "workstation.json").write_text(json.dumps(data))
    fake_nvml(facts=tmp_path / "workstation.json")
    assert [(g.ecc_mode, g.ecc_default) for g in nvml.inventory().gpus] == [(False, None), (False, False)]


def test_whether_each_gpu_may_read_the_others_memory_is_read_as_nvml_says_it(fake_nvml, tmp_path):
    # Two GeForce cards: `nvidia-smi topo -p2p r` prints GNS between them (noonghunna/club-3090#1130).
    data = json.loads((FIXTURES / "l40s-2x.json").read_text())
    buses = [g["pci_bus_id"] for g in data["gpus"]]
    data["gpus"][0]["p2p_read"] = {buses[1]: "gpu_not_supported"}
    data["gpus"][1]["p2p_read"] = {buses[0]: "gpu_not_supported"}
    (tmp_path / "consumer.json").write_text(json.dumps(data))
    fake_nvml(facts=tmp_path / "consumer.json")
    assert [g.p2p_read for g in nvml.inventory().gpus] == [{buses[1]: "gpu_not_supported"}, {buses[0]: "gpu_not_supported"}]
    fake_nvml(facts=FIXTURES / "l40s-2x.json")  # a driver that does not say: unknown, not a failed query
    assert [(g.p2p_read, g.unanswered) for g in nvml.inventory().gpus] == [(None, {}), (None, {})]


def test_a_gpu_lost_mid_query_is_named_by_its_pci_address(fake_nvml):
    fake_nvml(facts=FIXTURES / "h100-sxm-gpu-lost.json")
    inv = nvml.inventory()
    assert [g.index for g in inv.gpus] == [0, 1, 2, 3, 5, 6, 7]
    assert inv.lost == [nvml_facts.LostGpu(index=4, pci_bus_id="00000000:9D:00.0", error="GPU is lost")]


def test_a_gpu_nvml_refuses_this_process_is_not_given_to_the_run_never_lost(fake_nvml):
    # A Slurm job's device cgroup (ConstrainDevices): NVML counts all 8, hands over the 2 given.
    fake_nvml(facts=FIXTURES / "h100-sxm-8x-slurm-2-given.json")
    inv = nvml.inventory()
    assert [g.index for g in inv.gpus] == [0, 1] and inv.lost == []
    assert [(g.index, g.error) for g in inv.refused] == [(i, "Insufficient Permissions") for i in range(2, 8)]


def test_the_burn_ins_sampler_watches_the_gpus_given_and_passes_over_those_nvml_refuses(fake_nvml):
    # The same Slurm job: the sampler asked for every handle NVML counts and died on GPU 2's
    # NO_PERMISSION ("NVML failed: Insufficient Permissions"), so the burn-in of a healthy node
    # ran unwatched and said so. The inventory already reads such a GPU as not this run's.
    fake_nvml(facts=FIXTURES / "h100-sxm-8x-slurm-2-given.json")
    sampler = nvml.Sampler(period=0.05, most=30)
    time.sleep(0.3)
    traces = sampler.stop()
    assert [(t.index, t.pci_bus_id) for t in traces] == [(g.index, g.pci_bus_id) for g in FakeNvml(
        FIXTURES / "h100-sxm-8x-slurm-2-given.json").gpus]
    assert all(t.samples and t.ecc_before == 0 for t in traces)


def test_a_corrupted_inforom_is_read_where_nvml_says_so(fake_nvml, tmp_path):
    # nvmlDeviceValidateInforom answers NVML_ERROR_CORRUPTED_INFOROM where the InfoROM's checksums
    # fail (nvidia-smi's "WARNING: infoROM is corrupted at gpu ..."); a driver that cannot say: unknown.
    data = json.loads((FIXTURES / "h100-sxm-8x-healthy.json").read_text())
    for g in data["gpus"]:
        g["inforom_valid"] = g["index"] != 3
    data["gpus"][5]["inforom_valid"] = None
    (tmp_path / "inforom.json").write_text(json.dumps(data))
    fake_nvml(facts=tmp_path / "inforom.json")
    inv = nvml.inventory()
    assert [g.inforom_valid for g in inv.gpus] == [True, True, True, False, True, None, True, True]
    assert all(g.unanswered == {} for g in inv.gpus)  # a finding of its own, never a failed query


def test_no_permission_is_told_by_nvidia_ml_pys_class_or_by_its_code():
    from types import SimpleNamespace

    from preflight.readers.nvidia.nvml_inventory import no_permission

    class NVMLError(Exception):  # nvidia-ml-py's errors carry NVML's code in ``value``
        def __init__(self, value):
            self.value = value

    assert no_permission(SimpleNamespace(NVML_ERROR_NO_PERMISSION=4), NVMLError(4))
    assert not no_permission(SimpleNamespace(NVML_ERROR_NO_PERMISSION=4), NVMLError(15))  # NVML_ERROR_GPU_IS_LOST: lost


def test_device_ids_and_versions_are_decoded(fake_nvml):
    fake_nvml(facts=FIXTURES / "h100-sxm-8x-healthy.json")
    inv = nvml.inventory()
    assert inv.driver_version == "550.54.15" and inv.cuda_driver_version == "12.4"
    assert inv.gpus[0].pci_device_id == "0x2330" and inv.gpus[0].pci_bus_id == "00000000:1B:00.0"
    assert nvml.pcie_links()["00000000:1B:00.0"] == nvml_facts.PcieLink(gen=5, width=16, gen_max=5, width_max=16)


@pytest.mark.parametrize(
    "mode, cause, remedy",
    [
        ("nodriver", "no NVIDIA driver", "--profile cpu for a dry run"),
        ("noperm", "no permission on /dev/nvidia*", "give its user access"),
        ("mismatch", "driver/library version mismatch", "reboot the node"),
        ("crash", "the NVML query died", "reset the GPU"),
    ],
)
def test_each_failure_has_its_own_cause_and_remedy(fake_nvml, mode, cause, remedy):
    fake_nvml(mode)
    with pytest.raises(NvmlUnavailable) as e:
        nvml.inventory()
    assert cause in e.value.cause and remedy in e.value.remedy
    if mode != "nodriver":
        assert "--profile cpu" not in e.value.remedy  # never steer a broken GPU node to a dry run


def test_a_wedged_driver_cannot_hang_the_agent(fake_nvml):
    fake_nvml("hang")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    with pytest.raises(NvmlUnavailable, match=r"NVML did not answer within 1 s: the driver is wedged"):
        nvml.inventory(timeout=1.0)
    assert time.monotonic() - start < 5
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before



def test_a_reading_begun_ahead_is_the_one_read_and_one_never_read_leaves_no_child(fake_nvml, monkeypatch):
    asked = []
    start = nvml._start
    monkeypatch.setattr(nvml, "_start", lambda what: asked.append(what) or start(what))
    fake_nvml("", FIXTURES / "h100-sxm-8x-healthy.json")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    shared = nvml.Shared()
    shared.begin()
    shared.begin()  # once
    assert shared.pending and asked == ["inventory"]
    assert len(shared.get().gpus) == 8 and not shared.pending and asked == ["inventory"]
    fake_nvml("hang")  # a wedged driver: the run ends before anything reads it
    shared.forget()
    shared.begin()
    assert shared.pending
    shared.close()
    assert not shared.pending and {p.pid for p in psutil.Process().children(recursive=True)} <= before
    nvml.Shared(Path("/x.json")).begin()  # a fake file is read where it is asked for: no child
    assert asked == ["inventory", "inventory"]


def test_a_reading_begun_ahead_dies_with_an_agent_killed_before_it_read_it(fake_nvml, tmp_path):
    fake_nvml("hang")  # a wedged driver: the child would wait for ever
    agent = subprocess.Popen([sys.executable, "-c", "import os, signal, sys\nfrom preflight.readers.nvidia import nvml\nr = nvml.Shared()\nr.begin()\n"
                              "print(r._started.proc.pid, flush=True)\nsys.stdin.readline()\nos.kill(os.getpid(), signal.SIGKILL)\n"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    child = int(agent.stdout.readline())
    time.sleep(1)
    assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE  # begun, and waiting on the wedged driver
    agent.stdin.write("\n")
    agent.stdin.flush()
    agent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_sampler_dies_with_an_agent_killed_the_moment_it_started_it(fake_nvml):
    # The agent is SIGKILLed before the sampler's interpreter has imported anything: a signal the
    # child set for itself after its imports would come too late, and a wedged driver would hold it.
    fake_nvml("hang")
    agent = subprocess.Popen([sys.executable, "-c", "import os, signal\nfrom preflight.readers.nvidia import nvml\n"
                              "s = nvml.Sampler(0.1, 600)\nprint(s.proc.pid, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"],
                             stdout=subprocess.PIPE, text=True)
    child = int(agent.stdout.readline())
    agent.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_shared_reading_asks_nvml_once_and_gives_every_caller_the_same_facts_or_failure(fake_nvml, monkeypatch):
    asked = []
    start = nvml._start
    monkeypatch.setattr(nvml, "_start", lambda what: asked.append(what) or start(what))
    fake_nvml("nodriver")
    shared = nvml.Shared()
    for _ in range(3):
        with pytest.raises(NvmlUnavailable) as e:
            shared.get()
        assert "no NVIDIA driver" in e.value.cause and "--profile cpu" in e.value.remedy
    assert asked == ["inventory"]
    fake_nvml("", FIXTURES / "h100-sxm-8x-healthy.json")  # the driver loaded since: only a new reading sees it
    shared.forget()
    first = shared.get()
    assert len(first.gpus) == 8 and shared.get() is first and asked == ["inventory", "inventory"]
    recorded = FakeNvml(FIXTURES / "h200-1x-vm.json")
    assert nvml.Shared(facts=recorded).get() is recorded and len(asked) == 2  # a reading already made starts no child

def test_a_pynvml_in_the_working_directory_is_never_imported(tmp_path, monkeypatch):
    # Running preflight as root from a directory someone else controls must not run their code.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pynvml.py").write_text("raise SystemExit('imported from the working directory')\n")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    try:
        inv = nvml.inventory()
    except NvmlUnavailable as e:
        assert "working directory" not in e.cause
    else:
        assert isinstance(inv.gpus, list)


def test_fake_file_is_marked_as_fake():
    assert FakeNvml(FIXTURES / "h100-sxm-8x-healthy.json").source.startswith("fake ")


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ('{"gpus": []}', "field driver_version: Field required"),
        (json.dumps({"driver_version": "550", "gpus": [{"index": 0}]}), "field gpus.0.name: Field required"),
        (json.dumps({"driver_version": "550", "gpus": [], "gpu": []}), "field gpu: Extra inputs are not permitted"),
    ],
)
def test_a_malformed_fake_file_names_the_field(tmp_path, content, message):
    path = tmp_path / "fake.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=message) as e:
        FakeNvml(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_typo_in_a_fact_is_an_error_not_a_healthy_gpu(tmp_path):
    data = json.loads((FIXTURES / "h100-sxm-8x-healthy.json").read_text())
    data["gpus"][3]["ecc_uncorectable_volatile"] = 5
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"field gpus\.3\.ecc_uncorectable_volatile"):
        FakeNvml(path)


def test_a_missing_fake_file_says_so(tmp_path):
    with pytest.raises(UsageError, match=r"--nvml-fake .*missing.json: cannot read it"):
        FakeNvml(tmp_path / "missing.json")


def test_busy_names_each_gpu_a_job_holds_and_its_pids():
    busy = nvml.busy(FakeNvml(FIXTURES / "h100-sxm-8x-busy.json"))
    assert busy == "a job holds GPU 3 (pid 48213); GPU 5 (pid 48215)"
    assert nvml.busy(FakeNvml(FIXTURES / "h100-sxm-8x-idle.json")) is None


def test_a_gpu_whose_processes_nvml_cannot_list_counts_as_busy():
    # Better to skip a recheck than to run one beside a job NVML could not see.
    busy = nvml.busy(FakeNvml(FIXTURES / "h100-sxm-8x-healthy.json"))
    assert busy.startswith("a job holds GPU 0 (NVML cannot list its processes)")


def test_the_adapter_reads_the_compute_processes(fake_nvml):
    fake_nvml(facts=FIXTURES / "h100-sxm-8x-busy.json")
    gpus = nvml.inventory().gpus
    assert [p.model_dump() for p in gpus[3].processes] == [{"pid": 48213, "used_memory_bytes": 71234560000}]
    assert gpus[5].processes[0].used_memory_bytes is None and gpus[0].processes == []


# ---- what the child makes of NVLink, clocks and calls the driver cannot answer ----


def test_a_gpu_whose_every_nvlink_is_inactive_has_no_partner_not_links_down(fake_nvml):
    # A lone SXM GPU in a VM, or a PCIe card without bridges: all 18 links answer "inactive".
    fake_nvml(facts=FIXTURES / "h100-sxm-1x-no-nvlink-peer.json")
    (g,) = nvml.inventory().gpus
    assert (g.nvlinks_active, g.nvlinks_down, g.nvlink_remote) == (0, [], None)


def test_with_one_link_up_the_inactive_ones_are_down_and_the_far_ends_counted(fake_nvml):
    fake_nvml(facts=FIXTURES / "h100-sxm-nvswitch-link-down.json")
    gpus = nvml.inventory().gpus
    assert (gpus[3].nvlinks_active, gpus[3].nvlinks_down, gpus[3].nvlink_remote) == (17, [5], {"switch": 17})
    assert gpus[0].nvlink_remote == {"switch": 18}


def test_links_past_the_count_the_driver_says_are_present_are_no_links_down(fake_nvml, tmp_path):
    """A board that keeps fewer links than its die (an export part's 8 of 18, NVSwitch to every
    peer): NVML_FI_DEV_NVLINK_LINK_COUNT says 8, so links 8-17 answering "inactive" are none of
    its own, where they had read as ten links down on every GPU. Within the count, one down stays."""
    data = json.loads((FIXTURES / "h100-sxm-8x-healthy.json").read_text())
    for i, g in enumerate(data["gpus"]):
        g.update(nvlinks_active=8, nvlinks_down=list(range(8, 18)), nvlink_remote={"switch": 8}, nvlink_count=8)
    data["gpus"][5].update(nvlinks_active=7, nvlinks_down=[3, *range(8, 18)], nvlink_remote={"switch": 7})
    (tmp_path / "facts.json").write_text(json.dumps(data))
    fake_nvml(facts=tmp_path / "facts.json")  # the fake serves 18 states, links 8-17 inactive, and the count
    gpus = nvml.inventory().gpus
    assert [(g.nvlinks_active, g.nvlinks_down) for g in gpus] == [(8, [])] * 5 + [(7, [3])] + [(8, [])] * 2
    assert all(g.unanswered == {} for g in gpus)
    for g in data["gpus"]:
        del g["nvlink_count"]  # a driver that does not say: every link NVML names is asked, as before
    (tmp_path / "facts.json").write_text(json.dumps(data))
    assert nvml.inventory().gpus[0].nvlinks_down == list(range(8, 18))


def test_an_nvidia_ml_py_without_the_remote_type_call_leaves_it_unknown(fake_nvml, tmp_path):
    data = json.loads((FIXTURES / "h100-sxm-8x-healthy.json").read_text())
    for g in data["gpus"]:
        g.pop("nvlink_remote", None)
    (tmp_path / "facts.json").write_text(json.dumps(data))
    fake_nvml(facts=tmp_path / "facts.json")  # the fake then has no nvmlDeviceGetNvLinkRemoteDeviceType
    g = nvml.inventory().gpus[0]
    assert (g.nvlinks_active, g.nvlink_remote) == (18, None)


def test_hw_slowdown_in_one_reading_is_transient_not_persistent(fake_nvml):
    fake_nvml(facts=FIXTURES / "h100-sxm-hw-slowdown-transient.json")
    start = time.monotonic()
    gpus = nvml.inventory().gpus
    assert (gpus[6].clocks_events, gpus[6].clocks_events_transient) == (["gpu_idle"], ["hw_slowdown"])
    assert (gpus[0].clocks_events, gpus[0].clocks_events_transient) == (["gpu_idle"], [])
    assert time.monotonic() - start < 5  # one 0.4 s window for all eight GPUs, not one per GPU


def test_hw_slowdown_in_every_reading_stays_persistent(fake_nvml):
    fake_nvml(facts=FIXTURES / "h100-sxm-hw-slowdown.json")
    g = nvml.inventory().gpus[6]
    assert (g.clocks_events, g.clocks_events_transient) == (["hw_slowdown"], [])


def test_facts_of_one_reading_read_every_event_as_persistent():
    g = FakeNvml(FIXTURES / "h100-sxm-hw-slowdown.json").gpus[6]  # written before the window existed
    assert (g.clocks_events, g.clocks_events_transient) == (["hw_slowdown"], [])


def test_a_call_the_driver_lacks_in_its_versioned_form_is_unanswered_not_a_dead_child(fake_nvml):
    # nvidia-ml-py raises NVMLLibraryMismatchError (no NVMLError) where an older
    # driver lacks the _v3 entry point its nvmlDeviceGetComputeRunningProcesses asks for.
    fake_nvml("versioned:nvmlDeviceGetComputeRunningProcesses,nvmlDeviceGetComputeRunningProcesses_v2", FIXTURES / "h100-sxm-8x-idle.json")
    gpus = nvml.inventory().gpus
    assert len(gpus) == 8 and all(g.processes is None for g in gpus)
    assert "this driver lacks the versioned call" in gpus[0].unanswered["nvmlDeviceGetComputeRunningProcesses_v2"]
    assert gpus[0].ecc_uncorrectable_volatile == 0  # the other facts are all there


def test_an_older_driver_lists_its_processes_through_the_v2_call(fake_nvml):
    # Without it every GPU would read as busy (processes unknown) and the recheck timer would never run.
    fake_nvml("versioned:nvmlDeviceGetComputeRunningProcesses", FIXTURES / "h100-sxm-8x-idle.json")
    gpus = nvml.inventory().gpus
    assert all(g.processes == [] for g in gpus) and gpus[0].unanswered == {}
    assert nvml.busy(nvml.inventory()) is None


def test_an_unexpected_error_in_one_query_is_unanswered_and_the_rest_stands(fake_nvml):
    fake_nvml("oops:nvmlDeviceGetTemperature", FIXTURES / "h100-sxm-8x-healthy.json")
    gpus = nvml.inventory().gpus
    assert len(gpus) == 8 and gpus[2].temperature_c is None
    assert gpus[2].unanswered == {"nvmlDeviceGetTemperature": "ValueError: invalid literal for int() with base 10: 'N/A'"}


def test_an_unexpected_error_outside_the_optional_queries_is_still_one_clear_answer(fake_nvml):
    fake_nvml("oops:nvmlDeviceGetName", FIXTURES / "h100-sxm-8x-healthy.json")
    with pytest.raises(NvmlUnavailable) as e:
        nvml.inventory()
    assert e.value.cause.startswith("the NVML query failed unexpectedly: ValueError") and "reset the GPU" in e.value.remedy


def test_where_each_gpu_sits_and_which_gpus_its_links_reach_are_read(fake_nvml, tmp_path):
    # Two PCIe GPUs joined by an NVLink bridge of 12 links (H100 NVL), each placed on its NUMA node.
    data = json.loads((FIXTURES / "h100-sxm-8x-affinity.json").read_text())
    data["gpus"] = data["gpus"][:2]
    buses = [g["pci_bus_id"] for g in data["gpus"]]
    for i, g in enumerate(data["gpus"]):
        g.update(nvlinks_active=12, nvlink_remote={"gpu": 12}, nvlink_peers={buses[1 - i]: 12}, gpu_numa_id=None)
    (tmp_path / "facts.json").write_text(json.dumps(data))
    fake_nvml(facts=tmp_path / "facts.json")
    a, b = nvml.inventory().gpus
    assert (a.cpu_affinity, a.numa_affinity, a.nvlink_peers) == ("0-55,112-167", [0], {"00000000:43:00.0": 12})
    assert b.nvlink_peers == {"00000000:1B:00.0": 12} and b.unanswered == {}


def test_placement_nvml_cannot_give_is_unknown_and_no_health_finding(fake_nvml):
    fake_nvml("oops:nvmlDeviceGetCpuAffinityWithinScope,nvmlDeviceGetMemoryAffinity", FIXTURES / "h100-sxm-8x-affinity.json")
    g = nvml.inventory().gpus[0]
    assert (g.cpu_affinity, g.numa_affinity, g.unanswered) == (None, None, {})


def test_the_recovery_action_is_read_per_gpu_as_a_field_value(fake_nvml):
    # The fake nvidia-ml-py has no NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (as one older than the field): the child asks for 230.
    fake_nvml(facts=FIXTURES / "h100-sxm-gpu2-recovery-reset.json")
    gpus = nvml.inventory().gpus
    assert [g.recovery_action for g in gpus] == ["none", "none", "gpu_reset", "none", "none", "none", "none", "none"]
    assert all(g.unanswered == {} for g in gpus)


def test_a_driver_older_than_the_recovery_field_leaves_it_unknown_and_records_nothing(fake_nvml):
    fake_nvml(facts=FIXTURES / "h100-sxm-8x-healthy.json")  # driver 550: the field came with 565
    gpus = nvml.inventory().gpus
    assert [g.recovery_action for g in gpus] == [None] * 8 and all(g.unanswered == {} for g in gpus)


def test_a_recovery_field_nvml_does_not_answer_is_unanswered_and_the_rest_stands(fake_nvml):
    fake_nvml(facts=FIXTURES / "h100-sxm-gpu3-recovery-unanswered.json")
    gpus = nvml.inventory().gpus
    assert gpus[3].recovery_action is None and gpus[3].unanswered == {nvml_inventory.RECOVERY_ASK: "Unknown Error"}
    assert gpus[3].ecc_uncorrectable_volatile == 0 and gpus[2].recovery_action == "none"


def test_a_recovery_code_newer_than_preflight_is_said_not_guessed(fake_nvml, tmp_path):
    data = json.loads((FIXTURES / "h100-sxm-gpu2-recovery-reset.json").read_text())
    data["gpus"][2]["recovery_code"] = 9  # read by the fake nvidia-ml-py only: a code no nvml.h this code knows has
    (tmp_path / "facts.json").write_text(json.dumps(data))
    fake_nvml(facts=tmp_path / "facts.json")
    g = nvml.inventory().gpus[2]
    assert g.recovery_action is None and g.unanswered == {nvml_inventory.RECOVERY_ASK: "recovery action 9, which this preflight does not know"}


@pytest.mark.parametrize("driver, meant", [("580.159.04", "bus_reset"), ("590.48.01", "bus_reset"), ("595.10", "recover_imex_domain"), ("615.71", "recover_imex_domain")])
def test_recovery_code_5_is_read_as_the_driver_s_generation_means_it(fake_nvml, tmp_path, driver, meant):
    """5 was GPU_RESET_BUS in the nvidia-ml-py of drivers before 595, RECOVER_IMEX_DOMAIN from 595 on."""
    data = json.loads((FIXTURES / "h100-sxm-gpu2-recovery-reset.json").read_text())
    data["driver_version"] = driver
    data["gpus"][2]["recovery_code"] = 5
    (tmp_path / "facts.json").write_text(json.dumps(data))
    fake_nvml(facts=tmp_path / "facts.json")
    g = nvml.inventory().gpus[2]
    assert g.recovery_action == meant and g.unanswered == {}


def test_a_field_value_call_that_raises_is_unanswered_under_the_field(fake_nvml):
    fake_nvml("oops:nvmlDeviceGetFieldValues", FIXTURES / "h100-sxm-gpu2-recovery-reset.json")
    gpus = nvml.inventory().gpus
    assert len(gpus) == 8 and all(g.recovery_action is None for g in gpus)
    assert gpus[0].unanswered == {nvml_inventory.RECOVERY_ASK: "ValueError: invalid literal for int() with base 10: 'N/A'"}


# ---- a --nvml-fake file that is no node's facts ---------------------------------------------------


def test_a_fake_file_that_would_hang_or_fill_memory_is_refused_at_once(tmp_path):
    import os
    import threading

    from preflight.base.errors import UsageError

    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    for name in ("fifo.json", "zero.json"):
        box: dict = {}

        def read(name=name):
            try:
                nvml.FakeNvml(tmp_path / name)
            except UsageError as e:
                box["said"] = str(e)

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive() and box["said"] == f"--nvml-fake {tmp_path / name}: not a regular file; pass a JSON file"


@pytest.mark.parametrize("text, said", [
    (b"\xff\xfe{}", "not valid JSON"),
    (b"[" * 100000, "not valid JSON"),
    (b'{"driver_version": "580", "gpus": [], "x": 1' + b"0" * 400 + b"}", "field x: an integer beyond 64 bits; NVML gives no such value"),
    (b'{"driver_version": "' + b"5" * 5000 + b'", "gpus": []}', "field driver_version: a string of 5000 characters; NVML gives no such value"),
])
def test_a_fake_file_no_driver_could_write_is_one_line_never_a_traceback(tmp_path, text, said):
    from preflight.base.errors import UsageError

    path = tmp_path / "fake.json"
    path.write_bytes(text)
    with pytest.raises(UsageError) as e:
        nvml.FakeNvml(path)
    assert str(e.value).startswith(f"--nvml-fake {path}: ") and said in str(e.value) and "\n" not in str(e.value)
