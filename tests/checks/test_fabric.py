"""The fabric check: the judge on recorded facts (FakeNvml files, the HGX H100
sysfs tree), the gatherer through the NVML child's fake and a `systemctl` on a
PATH of its own, and one CLI run."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import fakes
import pytest
from conftest import run_preflight
from preflight.checkkit import settle
from preflight.checks import fabric

from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.pipeline import profiles, shape
from preflight.pipeline.check import Context
from preflight.pipeline.settings import Settings
from preflight.readers.nvidia import nvml, nvml_facts
from preflight.readers.nvidia.nvml import FakeNvml

FIXTURES = Path(__file__).parents[1] / "fixtures"
NVML, TREE = FIXTURES / "nvml", FIXTURES / "sysfs" / "hgx-h100"
FAIL, WARN, PASS, SKIP = Status.FAIL, Status.WARN, Status.PASS, Status.SKIP
RUNNING = fabric.Manager(state="running", how="systemd unit nvidia-fabricmanager active")
STOPPED = fabric.Manager(state="stopped", how="systemd unit nvidia-fabricmanager is failed")


def resolved(name: str) -> profiles.ResolvedProfile:
    path = profiles.BUILTIN_DIR / f"{name}.toml"
    return profiles.resolve(profiles.load(path), path, {}, f"--profile {name}")


H100, A100 = resolved("h100-sxm"), resolved("a100-sxm4-80gb")


def hgx(tmp_path: Path, switches: int = 4, fm_pid: int | None = None) -> Path:
    """The recorded HGX H100 tree (one NVSwitch at 05:00.0) with ``switches`` NVSwitch
    bridges at the bus numbers after it, and an nv-fabricmanager process if asked."""
    root = tmp_path / "root"
    shutil.copytree(TREE, root, symlinks=True)
    devices = root / "sys/bus/pci/devices"
    for n in range(switches, 4):
        shutil.rmtree(devices / f"0000:{5 + n:02x}:00.0", ignore_errors=True)
    for n in range(1, switches):
        d = devices / f"0000:{5 + n:02x}:00.0"
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x068000\n")
    if fm_pid is not None:
        (root / f"proc/{fm_pid}").mkdir(parents=True)
        (root / f"proc/{fm_pid}/comm").write_text("nv-fabricmanage\n")
        (root / f"proc/{fm_pid}/status").write_text("Name:\tnv-fabricmanage\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n")
        (root / f"proc/{fm_pid}/exe").symlink_to("/bin/sh")  # a file root owns and only root may write
    return root


def node(root: Path, inv) -> shape.NodeShape:
    return shape.gather(Host(root), inv)


def judged(nvml_file: str, manager=RUNNING, switches: int = 4, profile=H100, tmp_path: Path | None = None):
    inv = FakeNvml(NVML / nvml_file)
    n = node(hgx(tmp_path, switches), inv) if tmp_path else shape.NodeShape(gpus=8, gpus_from="t", fabric="nvswitch", pci_gpus=[str(i) for i in range(8)], nvswitches=switches)
    parts, unjudged, _ = fabric.judge(fabric.FabricFacts(manager=manager, inventory=inv), n, profile.fabric)
    return [f for found in parts.values() for f in found], unjudged


# ---- judging: pass, fail, not applicable ---------------------------------------------


def test_a_healthy_hgx_h100_passes_every_part(tmp_path):
    found, unjudged = judged("h100-sxm-8x-fabric-completed.json", tmp_path=tmp_path)
    assert found == [] and unjudged == {}


def test_a_stopped_fabric_manager_fails_with_the_cuda_error_and_the_fix():
    # A100: no GPU fabric state vouches for the switches, so systemd's "failed" decides.
    (f,) = judged("a100-sxm4-8x-firmware.json", manager=STOPPED, profile=A100, switches=6)[0]
    assert (f.status, f.summary) == (FAIL, "nvidia-fabricmanager is not running")
    assert "system not yet initialized" in f.cause and "is failed" in f.cause
    assert "systemctl enable --now nvidia-fabricmanager" in f.remedy and "driver's (" in f.remedy


def test_a_manager_still_starting_says_so():
    starting = fabric.Manager(state="stopped", how="systemd unit nvidia-fabricmanager is activating", systemd="activating")
    found, _ = judged("a100-sxm4-8x-firmware.json", manager=starting, profile=A100, switches=6)
    assert [(g.status, g.summary) for g in found] == [(FAIL, "nvidia-fabricmanager is still starting")]
    assert "still starting" in found[0].cause and "run again" in found[0].remedy


def test_a_shared_nvswitch_vm_passes_on_the_gpus_completed_registration():
    # The host runs the manager: here the unit is inactive and no process shows, but every GPU registered.
    unseen = fabric.Manager(state="stopped", how="systemd unit nvidia-fabricmanager is inactive", systemd="inactive")
    inv = FakeNvml(NVML / "h100-sxm-8x-fabric-completed.json")
    vm = shape.NodeShape(gpus=8, gpus_from="t", fabric="nvswitch", pci_gpus=[str(i) for i in range(8)], nvswitches=0)
    parts, unjudged, notes = fabric.judge(fabric.FabricFacts(manager=unseen, inventory=inv), vm, H100.fabric)
    assert [f for found in parts.values() for f in found] == []
    assert "registration completed" in notes["manager"] and "is inactive" in notes["manager"] and "manager" not in unjudged
    # Bare metal with the switches on the bus: the completed registration vouches just the same.
    found, _ = judged("h100-sxm-8x-fabric-completed.json", manager=unseen)
    assert found == []


def test_no_nvswitch_on_the_bus_leaves_the_manager_unjudged():
    # A VM whose host keeps the switches, on a GPU without NVML fabric state: nothing here to judge.
    unseen = fabric.Manager(state="stopped", how="systemd unit nvidia-fabricmanager is inactive", systemd="inactive")
    found, unjudged = judged("a100-sxm4-8x-firmware.json", manager=unseen, profile=A100, switches=0)
    assert found == [] and "no NVSwitch on this PCI bus" in unjudged["manager"]


def test_gpus_never_registered_fail_as_one_finding_naming_them():
    found, _ = judged("h100-sxm-8x-fabric-not-started.json", manager=STOPPED)
    assert [(f.status, f.summary) for f in found] == [
        (FAIL, "GPU 0-7: fabric registration not started"), (FAIL, "nvidia-fabricmanager is not running")]
    assert "NOT_STARTED, not COMPLETED" in found[0].cause and "system not yet initialized" in found[0].cause


def test_one_gpu_still_registering_is_named_with_its_address():
    (f,) = judged("h100-sxm-gpu5-fabric-in-progress.json")[0]
    assert (f.status, f.summary) == (FAIL, "GPU 5: fabric registration still in progress")
    assert "0000:c3:00.0" in f.cause and "wait for it and run again" in f.remedy


def test_a_completed_registration_that_failed_names_nvml_s_status():
    inv = FakeNvml(NVML / "h100-sxm-8x-fabric-completed.json")
    g = inv.gpus[2].model_copy(update={"fabric": nvml_facts.GpuFabric(state="completed", status="Insufficient Resources")})
    inv = inv.model_copy(update={"gpus": [*inv.gpus[:2], g, *inv.gpus[3:]]})
    found, _ = fabric.judge_gpus(inv)
    assert [(f.status, f.summary) for f in found] == [(FAIL, "GPU 2: fabric registration failed (Insufficient Resources)")]
    assert "nvidia-smi -r" in found[0].remedy


def test_a_missing_nvswitch_fails_with_the_count_and_its_source(tmp_path):
    found, _ = judged("h100-sxm-8x-fabric-completed.json", tmp_path=tmp_path, switches=3)
    assert [(f.status, f.summary) for f in found] == [(FAIL, "3 of 4 NVSwitches on the PCI bus")]
    assert "four third-generation NVSwitches" in found[0].cause and "lspci -d 10de:" in found[0].remedy


def test_switches_hidden_from_a_vm_or_part_of_the_board_are_not_judged():
    found, unjudged = judged("h100-sxm-8x-fabric-completed.json", switches=0)
    assert found == [] and "shared NVSwitch virtualization" in unjudged["nvswitches"]
    four = shape.NodeShape(gpus=4, gpus_from="t", fabric="nvswitch", pci_gpus=["a", "b", "c", "d"], nvswitches=2)
    assert "this PCI bus shows 4 GPUs" in fabric.judge_switches(four, H100.fabric)[1]


def test_a100_is_judged_without_the_gpu_fabric_state_it_predates(tmp_path):
    found, unjudged = judged("a100-sxm4-8x-firmware.json", profile=A100, switches=6)
    assert found == [] and "predates NVML's GPU fabric state" in unjudged["gpus"]
    # An HGX A100 in a container cannot see the manager and its GPUs report no fabric state: that part
    # is not judged (a WARN would sound on every healthy one); the cuda check catches a stopped manager.
    found, unjudged = judged("a100-sxm4-8x-firmware.json", profile=A100, switches=6, manager=fabric.Manager(state="unknown", how="no systemd"))
    assert found == [] and "the cuda check catches a stopped manager" in unjudged["manager"]


def test_an_unknown_manager_passes_where_every_gpu_reports_a_completed_registration():
    found, _ = judged("h100-sxm-8x-fabric-completed.json", manager=fabric.Manager(state="unknown", how="no systemd"))
    assert found == []


def test_a_driver_without_the_fabric_call_leaves_that_part_unjudged():
    found, unjudged = judged("h100-sxm-8x-healthy.json")
    assert found == [] and "nvmlDeviceGetGpuFabricInfo" in unjudged["gpus"]


# ---- applies: the nodes without NVSwitch ---------------------------------------------


def ctx_for(profile, node_shape, **settings) -> Context:
    return Context(profile=profile, settings=Settings(**settings), host=Host(), deadline=time.monotonic() + 30, shape=node_shape)


@pytest.mark.parametrize("fabric_of, words", [("single", "one GPU"), ("pcie", "joined by PCIe only"), ("nvlink", "joined by NVLink bridges")])
def test_nodes_without_nvswitch_skip_saying_how_their_gpus_are_joined(fabric_of, words):
    n = shape.NodeShape(gpus=1 if fabric_of == "single" else 8, gpus_from="t", fabric=fabric_of, fabric_from="NVML")
    assert words in fabric.Fabric().applies(ctx_for(H100, n))


def test_a_node_that_gives_the_run_no_gpu_skips_saying_so_not_one_gpu():
    gpus_from = "nothing: the PCI bus lists no NVIDIA GPU and /dev has no nvidia device node, and NVML is silent"
    n = shape.NodeShape(gpus=0, gpus_from=gpus_from, fabric=shape.fabric_of(None, 0, 0)[0], fabric_from=shape.fabric_of(None, 0, 0)[1])
    assert fabric.Fabric().applies(ctx_for(H100, n)) == f"this node gives the run no GPU ({gpus_from}): no NVSwitch, no fabric manager"
    assert n.fabric_from == "no GPU: nothing to join"


def test_pcie_profiles_and_cpu_skip_with_the_reason():
    n = shape.NodeShape(gpus=2, gpus_from="t", fabric="pcie")
    assert "not built on an NVSwitch board" in fabric.Fabric().applies(ctx_for(resolved("h100-pcie"), n))
    assert fabric.Fabric().applies(ctx_for(resolved("cpu"), None)) == "profile cpu has no GPUs: no NVSwitch fabric"


# ---- gathering: systemd, the process, the NVML child -----------------------------------


def test_systemd_s_word_decides_where_it_answers(tmp_path):
    root = hgx(tmp_path)
    active = Host(root, environ={"PATH": str(fakes.systemctl(tmp_path / "a", "active"))})
    assert fabric.manager_state(active).state == "running"
    failed = Host(root, environ={"PATH": str(fakes.systemctl(tmp_path / "f", "failed", exit_code=3))})
    assert fabric.manager_state(failed) == fabric.Manager(state="stopped", how="systemd unit nvidia-fabricmanager is failed", systemd="failed")


def test_a_daemon_started_outside_systemd_counts_as_running(tmp_path):
    h = Host(hgx(tmp_path, fm_pid=2939), environ={"PATH": str(fakes.systemctl(tmp_path / "b", "inactive", exit_code=3))})
    m = fabric.manager_state(h)
    assert m.state == "running" and "pid 2939" in m.how


def test_a_unit_that_failed_at_boot_beside_roots_daemon_started_by_hand_counts_as_running(tmp_path):
    # The recorded process is root's (uid 0) from a root-owned executable: is_daemon vouches for it.
    h = Host(hgx(tmp_path, fm_pid=2939), environ={"PATH": str(fakes.systemctl(tmp_path / "b", "failed", exit_code=3))})
    m = fabric.manager_state(h)
    assert m.state == "running" and "pid 2939" in m.how and m.systemd == "failed"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser to start another user's process")
def test_a_failed_unit_stays_stopped_beside_another_users_process_of_that_name(tmp_path):
    rename = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'nv-fabricmanager', 0, 0, 0); time.sleep(120)"
    with _named(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", rename]):
        h = Host(environ={"PATH": str(fakes.systemctl(tmp_path / "b", "failed", exit_code=3))})
        assert fabric.manager_state(h) == fabric.Manager(state="stopped", how="systemd unit nvidia-fabricmanager is failed", systemd="failed")


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser to start another user's process")


@contextlib.contextmanager
def _named(argv: list[str]):
    """A real process whose comm reads nv-fabricmanage, ended with its process group."""
    p = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            named = [pid for pid in _family(p.pid) if _comm(pid) == fabric.COMM]  # runuser may run it as its child
            if named:
                break
            assert p.poll() is None, "the stand-in process ended before it took the name"
            time.sleep(0.05)
        else:
            pytest.fail("the stand-in process never took the name")
        yield named[0]
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _family(pid: int) -> list[int]:
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        children = []
    return [pid] + [d for c in children for d in _family(c)]


@ROOT_ONLY
def test_a_process_another_user_named_nv_fabricmanager_is_not_the_daemon():
    # PR_SET_NAME from a root-owned interpreter: only its real uid tells it from root's daemon.
    rename = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'nv-fabricmanager', 0, 0, 0); time.sleep(120)"
    with _named(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", rename]) as pid:
        assert not fabric.is_daemon(Path(f"/proc/{pid}"))
        assert fabric.process(Host()) != pid


@ROOT_ONLY
def test_root_s_process_counts_only_from_a_file_no_one_else_may_write(tmp_path):
    exe = tmp_path / "nv-fabricmanager"
    shutil.copy("/bin/sleep", exe)
    exe.chmod(0o757)  # anyone may put their program here
    with _named([str(exe), "120"]) as pid:
        assert not fabric.is_daemon(Path(f"/proc/{pid}"))
    exe.chmod(0o755)
    with _named([str(exe), "120"]) as pid:
        assert fabric.is_daemon(Path(f"/proc/{pid}"))


def test_without_systemd_and_no_process_in_sight_the_state_is_unknown(tmp_path):
    no_systemd = fakes.systemctl(tmp_path / "c", message="System has not been booted with systemd as init system (PID 1). Can't operate.")
    m = fabric.manager_state(Host(hgx(tmp_path), environ={"PATH": str(no_systemd)}))
    assert m.state == "unknown" and "booted with systemd" in m.how


def test_a_systemctl_that_cannot_run_leaves_the_state_unknown(tmp_path):
    d = tmp_path / "x"
    d.mkdir()
    (d / "systemctl").write_text("#!/nonexistent/interpreter\n")
    (d / "systemctl").chmod(0o755)
    m = fabric.manager_state(Host(hgx(tmp_path), environ={"PATH": str(d)}))
    assert m.state == "unknown" and "systemctl could not run" in m.how


def test_a_hanging_systemctl_is_cut_at_its_deadline(tmp_path):
    h = Host(hgx(tmp_path), environ={"PATH": str(fakes.systemctl(tmp_path / "h", hang=True))})
    started = time.monotonic()
    m = fabric.manager_state(h, timeout=0.5)
    assert time.monotonic() - started < 5 and m.state == "unknown" and "did not answer within 0.5 s" in m.how


def test_nvml_s_fabric_state_arrives_through_the_nvml_child(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML_FACTS", str(NVML / "h100-sxm-gpu5-fabric-in-progress.json"))
    inv = nvml.inventory()
    assert inv.gpus[5].fabric == nvml_facts.GpuFabric(state="in_progress") and inv.gpus[0].fabric == nvml_facts.GpuFabric(state="completed")
    assert inv.gpus[0].inforom_image == "G520.0200.00.05" and inv.gpus[0].unanswered == {}
    monkeypatch.setenv("FAKE_NVML_FACTS", str(NVML / "a100-sxm4-8x-firmware.json"))
    assert nvml.inventory().gpus[0].fabric is None  # A100: "not supported"


def test_the_fake_nvml_fills_the_fabric_struct_only_through_a_pointer(tmp_path, monkeypatch):
    # The C call writes through its argument: a Structure passed by value leaves the
    # caller's copy zero (every GPU "not supported") on a real driver, so the fake refuses it.
    import ctypes
    import importlib.util
    monkeypatch.setenv("FAKE_NVML_FACTS", str(NVML / "h100-sxm-8x-fabric-completed.json"))
    spec = importlib.util.spec_from_file_location("fake_pynvml", fakes.install_fake_pynvml(tmp_path / "nvml") / "pynvml.py")
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    info = fake.c_nvmlGpuFabricInfo_t()
    with pytest.raises(TypeError, match="by value"):
        fake.nvmlDeviceGetGpuFabricInfo(0, info)
    fake.nvmlDeviceGetGpuFabricInfo(0, ctypes.byref(info))
    assert info.state == 3
    other = fake.c_nvmlGpuFabricInfo_t()
    fake.nvmlDeviceGetGpuFabricInfo(1, ctypes.pointer(other))
    assert other.state == 3


def test_a_failed_registration_s_status_is_nvml_s_error_string(tmp_path, monkeypatch):
    facts = json.loads((NVML / "h100-sxm-8x-fabric-completed.json").read_text())
    facts["gpus"][3]["fabric"] = {"state": "completed", "status": "Insufficient Resources"}
    (tmp_path / "f.json").write_text(json.dumps(facts))
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML_FACTS", str(tmp_path / "f.json"))
    assert nvml.inventory().gpus[3].fabric == nvml_facts.GpuFabric(state="completed", status="Insufficient Resources")


# ---- the CLI ------------------------------------------------------------------------


def test_preflight_run_only_fabric_judges_the_fake_node(tmp_path):
    report = tmp_path / "r.json"
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "fabric", "--report", str(report),
                       "--nvml-fake", str(NVML / "h100-sxm-gpu5-fabric-in-progress.json")])
    assert p.returncode == 1, p.stderr
    (r,) = json.loads(report.read_text())["checks"]
    assert r["check"] == "fabric" and r["status"] == "FAIL" and r["details"]["parts"]["gpus"] == "FAIL"
    assert "GPU 5: fabric registration still in progress" in r["summary"] + r["cause"]


# ---- systemctl's output unreadable: the node is not at fault ------------------------------------------


def run_check(tmp_path: Path, systemctl_dir: Path, nvml_file: str, **root_kw) -> tuple:
    inv = FakeNvml(NVML / nvml_file)
    root = hgx(tmp_path, **root_kw)
    ctx = Context(profile=H100, settings=Settings(nvml_fake=NVML / nvml_file), host=Host(root, environ={"PATH": str(systemctl_dir)}),
                  deadline=time.monotonic() + 30, shape=node(root, inv))
    started = time.monotonic()
    r = fabric.Fabric().run(ctx)
    return r, time.monotonic() - started


BAD = [pytest.param(dict(prints=out), id=kind) for kind, out in fakes.BAD_OUTPUT.items()] + [
    pytest.param(dict(prints=b"", exit_code=1), id="exit-1-silent"), pytest.param(dict(hang=True), id="hang")]


@pytest.mark.parametrize("bad", BAD)
def test_systemctl_unreadable_with_every_gpu_registered_passes_on_nvml_s_word_and_says_so(tmp_path, bad):
    r, took = run_check(tmp_path, fakes.tool(tmp_path / "bin", "systemctl", **bad), "h100-sxm-8x-fabric-completed.json")
    assert took < fabric.SYSTEMCTL_TIMEOUT + 5  # the stand-in's deadline, and the kill's grace
    assert r.details["parts"]["manager"] == Status.PASS and r.details["parts"]["gpus"] == Status.PASS
    assert [p for p, s in r.details["parts"].items() if s != Status.PASS] == ["source"]  # only the fake facts' FAIL
    assert r.details["sources"] == {"fabric manager": "NVML (every GPU's fabric registration completed)"}
    assert list(r.details["unread"]) == ["systemctl is-active nvidia-fabricmanager"]
    [m] = [m for m in r.measurements if m.name == "tool_unreadable"]
    assert m.labels == {"tool": "systemctl is-active nvidia-fabricmanager", "fallback": "NVML (every GPU's fabric registration completed)"}
    assert any("systemctl is-active nvidia-fabricmanager" in line and "not the node's fault" in line for line in r.lines)


@pytest.mark.parametrize("bad", BAD[:3])
def test_systemctl_unreadable_the_process_answers(tmp_path, bad):
    r, _ = run_check(tmp_path, fakes.tool(tmp_path / "bin", "systemctl", **bad), "h100-sxm-8x-fabric-not-started.json", fm_pid=2939)
    assert r.details["manager"]["state"] == "running" and r.details["sources"] == {"fabric manager": "/proc (nv-fabricmanager process)"}
    assert r.details["parts"]["manager"] == Status.PASS  # the GPUs' own registration is judged apart


def test_garbage_is_quoted_not_taken_for_systemd_s_word(tmp_path):
    m = fabric.manager_state(Host(hgx(tmp_path), environ={"PATH": str(fakes.tool(tmp_path / "b", "systemctl", prints=b"\x1b[1mbanana\x1b[0m\n"))}))
    assert m.state == "unknown" and m.unread == "printed 'banana', not a unit state (exit 0)"
    assert "printed 'banana'" in m.how


def test_systemd_s_own_words_are_no_reader_s_trouble(tmp_path):
    for word, code in (("inactive", 3), ("unknown", 3), ("active", 0)):
        m = fabric.manager_state(Host(hgx(tmp_path / word), environ={"PATH": str(fakes.systemctl(tmp_path / word / "b", word, exit_code=code))}))
        assert m.unread is None, word


# ---- a node still settling: registration in progress as the boot gate starts ----------------


def settling(tmp_path: Path, monkeypatch, later: str) -> tuple:
    """The run's reading shows GPU 5 registering (as at 0.5 s after the manager went active);
    NVML read again answers ``later``."""
    monkeypatch.setattr(settle.nvml_settle, "EVERY_SECONDS", 0.0)
    first = FakeNvml(NVML / "h100-sxm-gpu5-fabric-in-progress.json")
    fakes.nvml_readings(monkeypatch, first, FakeNvml(NVML / later))
    root = hgx(tmp_path)
    ctx = Context(profile=H100, settings=Settings(), host=Host(root, environ={"PATH": str(fakes.systemctl(tmp_path / "bin", "active"))}),
                  deadline=time.monotonic() + 30, shape=node(root, first))
    return ctx, fabric.Fabric().run(ctx)


def test_a_registration_that_completes_within_the_wait_passes_and_later_checks_judge_the_settled_reading(tmp_path, monkeypatch):
    ctx, r = settling(tmp_path, monkeypatch, "h100-sxm-8x-fabric-completed.json")
    assert r.status == PASS and "fabric registration completed on all 8 GPUs" in r.summary, (r.summary, r.cause)
    assert "read NVML 1 more time(s)" in r.details["settle"] and "every GPU's registration done" in r.details["settle"]
    assert ctx.inventory().gpus[5].fabric.state == "completed"


def test_a_registration_still_in_progress_after_the_wait_fails_saying_how_long_it_waited(tmp_path, monkeypatch):
    monkeypatch.setattr(settle, "LIMIT_SECONDS", 0.05)
    ctx, r = settling(tmp_path, monkeypatch, "h100-sxm-gpu5-fabric-in-progress.json")
    assert (r.status, r.summary) == (FAIL, "GPU 5: fabric registration still in progress")
    assert "GPU 5 still in progress" in r.details["settle"]


def test_a_hanging_systemctl_late_in_the_checks_time_is_cut_before_its_deadline(tmp_path):
    """systemctl's 5 s are bounded by what is left of the check (a settle wait may have used the
    rest): the runner gets fabric's own verdict, NVML's word standing in, never "did not finish"."""
    from preflight.pipeline import runner

    nvml_file = "h100-sxm-8x-fabric-completed.json"
    root = hgx(tmp_path)
    ctx = Context(profile=H100, settings=Settings(nvml_fake=NVML / nvml_file), host=Host(root, environ={"PATH": str(fakes.systemctl(tmp_path / "h", hang=True))}),
                  deadline=time.monotonic() + 30, shape=node(root, FakeNvml(NVML / nvml_file)))
    r = runner.run_check(fabric.Fabric(), ctx, 5.0)
    assert "did not finish" not in r.summary, r.summary
    assert r.details["parts"]["manager"] == Status.PASS and list(r.details["unread"]) == ["systemctl is-active nvidia-fabricmanager"]


def test_systemctl_with_no_time_left_is_not_started_and_said_unread(tmp_path):
    h = Host(hgx(tmp_path), environ={"PATH": str(fakes.systemctl(tmp_path / "h", hang=True))})
    facts = fabric.gather(h, FakeNvml(NVML / "h100-sxm-8x-fabric-completed.json"), deadline=time.monotonic() + 1)
    assert facts.manager.state == "unknown" and facts.manager.unread.startswith("not run:")
