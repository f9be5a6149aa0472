"""The firmware check: the judge on recorded facts (FakeNvml files with the
VBIOS and InfoROM lines of real `nvidia-smi -q` output), the gatherer with
/proc/driver/nvidia/version in a recorded root and interpreters that answer,
fail or hang, and one CLI run."""

import json
import os
import subprocess
import time
from pathlib import Path

import fakes
import pytest
from conftest import needs_root, run_preflight
from cuda_facts import python_script
from preflight.checks import firmware

from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.pipeline import profiles
from preflight.pipeline.check import Context
from preflight.pipeline.settings import Settings
from preflight.readers.nvidia import nvml
from preflight.readers.nvidia.nvml import FakeNvml

NVML = Path(__file__).parents[1] / "fixtures" / "nvml"
NVSWITCH = Path(__file__).parents[1] / "fixtures" / "nvswitch"
BOARDS = Path(__file__).parents[1] / "fixtures" / "firmware"
FAIL, WARN, SKIP = Status.FAIL, Status.WARN, Status.SKIP
TORCH_124 = firmware.TorchCuda(torch="2.4.1+cu124", cuda="12.4")


def facts(name: str, torch=TORCH_124, kernel: str | None = "550.54.15", boards: str | None = "hgx-h100-one-board") -> firmware.FirmwareFacts:
    """The NVML facts of ``name``, with each GPU's board read from the recorded tree ``boards``
    (tests/fixtures/firmware; None: no tree, so no board is known)."""
    inventory = FakeNvml(NVML / name)
    known, unread = firmware.boards(Host(BOARDS / boards if boards else BOARDS / "none"), inventory)
    return firmware.FirmwareFacts(inventory=inventory, kernel_driver=kernel, torch=torch, boards=known, boards_unread=unread)


def judged(f: firmware.FirmwareFacts, **pins):
    parts, unjudged, _ = firmware.judge(f, **pins)
    return [x for found in parts.values() for x in found], unjudged


# ---- judging: pass, fail, not applicable ---------------------------------------------


def test_one_vbios_and_inforom_and_a_matching_driver_pass():
    assert judged(facts("h100-sxm-8x-fabric-completed.json")) == ([], {})


def test_the_odd_vbios_is_named_with_the_majority_s_version():
    (f,), _ = judged(facts("h100-sxm-gpu6-vbios-odd.json"))
    assert (f.status, f.summary) == (FAIL, "GPU 6 on another VBIOS than the other 7")
    assert "GPU 6 96.00.74.00.0D; the other 7 GPUs run VBIOS 96.00.A5.00.01" in f.cause and "nvfwupd" in f.remedy


def test_a_site_pin_fails_every_gpu_off_it_even_when_they_agree():
    found, _ = judged(facts("h100-sxm-8x-fabric-completed.json"), vbios_pin="96.00.A5.00.03")
    assert [(f.status, f.summary) for f in found] == [(FAIL, "VBIOS not the site's 96.00.A5.00.03 on GPU 0-7")]
    assert "vbios_version" in found[0].cause and "found GPU 0-7 96.00.A5.00.01" in found[0].cause
    assert judged(facts("h100-sxm-8x-fabric-completed.json"), vbios_pin="96.00.A5.00.01", inforom_pin="G520.0200.00.05") == ([], {})


def test_nvswitches_on_one_bios_pass_and_the_one_left_behind_is_named():
    f = facts("h100-sxm-8x-fabric-completed.json")
    f.nvswitch_bios, _ = firmware.nvswitch_bios(Host(NVSWITCH / "hgx-h100-one-bios"))
    assert judged(f) == ([], {})
    f.nvswitch_bios, _ = firmware.nvswitch_bios(Host(NVSWITCH / "hgx-h100-switch-07-odd"))
    (x,), _ = judged(f)
    assert (x.status, x.summary) == (FAIL, "NVSwitch 0000:07:00.0 on another NVSwitch BIOS than the other 3")
    assert "NVSwitch 0000:07:00.0 96.10.55.00.01; the other 3 NVSwitches run NVSwitch BIOS 96.10.6D.00.01" in x.cause and "nvfwupd" in x.remedy


def test_an_nvswitch_whose_bios_the_driver_cannot_say_warns_and_no_nvswitch_is_not_applicable(tmp_path):
    assert firmware.nvswitch_bios(Host(NVSWITCH / "hgx-h100-bios-na"))[0]["0000:06:00.0"] is None
    f = facts("h100-sxm-8x-fabric-completed.json")
    f.nvswitch_bios, _ = firmware.nvswitch_bios(Host(NVSWITCH / "hgx-h100-bios-na"))
    (x,), _ = judged(f)
    assert (x.status, x.summary) == (WARN, "NVSwitch 0000:06:00.0: NVSwitch BIOS version unknown")
    # A PCIe node: no NVSwitch driver directory. Not a part at all, so no "not judged" line either.
    f.nvswitch_bios, f.nvswitch_absent = firmware.nvswitch_bios(Host(tmp_path))
    assert f.nvswitch_bios == {} and "absent" in f.nvswitch_absent
    parts, unjudged, _ = firmware.judge(f)
    assert "nvswitch" not in parts and "nvswitch" not in unjudged


def rtx4090_pair(tmp_path: Path, vbios: tuple[str, str]) -> Path:
    """Two GeForce RTX 4090 (one NVML name, one PCI device id) at l40s-2x.json's slots, on ``vbios``."""
    data = json.loads((NVML / "l40s-2x.json").read_text())
    for g, v in zip(data["gpus"], vbios):
        g.update(name="NVIDIA GeForce RTX 4090", pci_device_id="0x2684", vbios=v, memory_total_bytes=25757220864, power_limit_w=450.0,
                 power_default_limit_w=450.0)
    path = tmp_path / "rtx4090-2x.json"
    path.write_text(json.dumps(data))
    return path


def test_two_boards_of_one_model_on_their_makers_own_vbios_pass_and_say_so(tmp_path):
    """Two healthy RTX 4090 of two boards (the PCI subsystem ids in sysfs differ), each on the
    VBIOS its maker ships: no finding; the versions are said, board by board, in details and lines."""
    fake = rtx4090_pair(tmp_path, ("95.02.18.80.87", "95.02.18.80.5F"))
    ctx = Context(profile=H100, settings=Settings(nvml_fake=fake, level="quick"), host=Host(BOARDS / "rtx4090-two-boards"),
                  deadline=time.monotonic() + 30)
    r = firmware.Firmware().run(ctx)
    assert r.details["parts"]["vbios"] == Status.PASS and [p for p, s in r.details["parts"].items() if s != Status.PASS] == ["source"]
    note = ("GPU 0 (board 1043:889d) on 95.02.18.80.87; GPU 1 (board 1043:88e2) on 95.02.18.80.5F: compared within a board "
            "(PCI subsystem ids, sysfs), since each board's maker ships its own VBIOS build for it; no board runs two")
    assert r.details["notes"]["vbios"] == note and f"vbios: {note}" in r.lines
    assert r.details["gpus"]["1"]["board"] == "1043:88e2" and r.details["sources"]["GPU boards"].startswith("/sys/bus/pci/devices/")
    # Four PCIe cards of two OEM lots: the lots' boards differ, so their VBIOS may.
    lots = {0: "95.02.3C.00.A1", 1: "95.02.3C.00.A1", 2: "95.02.3C.00.A1", 3: "95.02.18.80.87"}
    boards = {0: "10de:16c1", 1: "10de:16c1", 2: "10de:16c1", 3: "10de:16c0"}
    assert firmware.judge_uniform("VBIOS", lots, None, "vbios_version", boards=boards) == ([], None)


def test_gpus_on_two_vbios_whose_boards_cannot_be_read_warn_never_fail():
    """Without the subsystem ids a GPU left behind and two makers' boards look alike: a WARN that
    names the GPUs, says why the boards are unknown and how to tell them apart; never a FAIL (a
    healthy node of two board partners' cards must not be drained)."""
    (f,), _ = judged(facts("h100-sxm-gpu6-vbios-odd.json", boards=None))
    assert (f.status, f.summary) == (WARN, "GPU 6 on another VBIOS than the other 7")
    assert "GPU 6 96.00.74.00.0D; the other 7 GPUs run VBIOS 96.00.A5.00.01" in f.cause
    assert ("which board each GPU is could not be read (GPU 0: /sys/bus/pci/devices/0000:1b:00.0/vendor unreadable, "
            "and 7 more GPUs (details.boards_unread))") in f.cause
    assert "lspci -nn -v -s" in f.remedy and "drain" not in f.remedy
    found, _ = firmware.judge_uniform("VBIOS", {0: "95.02.18.80.87", 1: "95.02.18.80.5F"}, None, "vbios_version")
    assert [(x.status, x.summary) for x in found] == [(WARN, "GPUs on 2 VBIOS versions")]


def test_missing_nvml_answers_skip_that_part_with_the_reason():
    # h100-sxm-8x-healthy.json was recorded without InfoROM images.
    found, unjudged = judged(facts("h100-sxm-8x-healthy.json"))
    assert found == [] and unjudged == {"inforom": "NVML gives no InfoROM image version for any GPU"}


def test_a_kernel_module_other_than_the_library_fails():
    (f,), _ = judged(facts("h100-sxm-8x-fabric-completed.json", kernel="535.216.03"))
    assert f.summary == "driver library 550.54.15, kernel module 535.216.03" and "without a reboot" in f.cause


def test_a_torch_of_a_newer_cuda_major_fails_and_a_newer_minor_passes_under_minor_version_compatibility():
    (f,), _ = judged(facts("h100-sxm-8x-fabric-completed.json", torch=firmware.TorchCuda(torch="2.9.0+cu130", cuda="13.0")))
    assert (f.status, f.summary) == (FAIL, "torch needs CUDA 13.0, the driver supports 12.4")
    assert "driver version is insufficient" in f.cause
    # A cu128 wheel on a 12.4 driver is how PyTorch's wheels run: no alarm, the rule recorded.
    parts, unjudged, notes = firmware.judge(facts("h100-sxm-8x-fabric-completed.json", torch=firmware.TorchCuda(torch="2.7.1+cu128", cuda="12.8")))
    assert [x for found in parts.values() for x in found] == [] and unjudged == {}
    assert "CUDA 12.8" in notes["cuda"] and "CUDA 12.4" in notes["cuda"] and "minor-version compatibility" in notes["cuda"]


def test_a_cpu_torch_or_a_silent_interpreter_leaves_the_cuda_part_unjudged():
    _, unjudged = judged(facts("h100-sxm-8x-fabric-completed.json", torch=firmware.TorchCuda(torch="2.13.0+cpu")))
    assert "CPU build" in unjudged["cuda"]
    _, unjudged = judged(facts("h100-sxm-8x-fabric-completed.json", torch=firmware.TorchCuda(error="no torch")))
    assert unjudged == {"cuda": "no torch"}


def test_the_a100_capture_s_firmware_passes():
    assert judged(facts("a100-sxm4-8x-firmware.json", kernel="555.42.02", torch=firmware.TorchCuda(torch="2.4", cuda="12.4"))) == ([], {})


def test_profiles_without_gpus_skip():
    path = profiles.BUILTIN_DIR / "cpu.toml"
    cpu = profiles.resolve(profiles.load(path), path, {}, "--profile cpu")
    ctx = Context(profile=cpu, settings=Settings(), host=Host(), deadline=time.monotonic() + 30)
    assert firmware.Firmware().applies(ctx) == "profile cpu has no GPUs: no GPU firmware to compare"


# ---- gathering ---------------------------------------------------------------------


def test_the_kernel_module_s_version_is_read_in_both_flavours(tmp_path):
    for text, want in ((fakes.NVIDIA_OPEN_VERSION, "570.195.03"), (fakes.NVIDIA_PROPRIETARY_VERSION, "535.216.03")):
        root = fakes.rdma_host(tmp_path / want, nvidia_version=text)
        assert firmware.kernel_driver(Host(root)) == (want, None)
    assert "unreadable" in firmware.kernel_driver(Host(tmp_path / "nothing"))[1]


def test_torch_s_cuda_comes_from_the_job_s_interpreter(tmp_path):
    python = python_script(tmp_path, 'echo \'{"torch": "2.7.1+cu128", "cuda": "12.8"}\'\n')
    assert firmware.ask_torch(Host(), python, 10) == firmware.TorchCuda(torch="2.7.1+cu128", cuda="12.8")


def test_an_interpreter_without_torch_or_that_hangs_says_why(tmp_path):
    broken = python_script(tmp_path, "echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1\n")
    assert "No module named 'torch'" in firmware.ask_torch(Host(), broken, 10).error
    (tmp_path / "h").mkdir()
    hangs = python_script(tmp_path / "h", "sleep 600\n")
    started = time.monotonic()
    assert firmware.ask_torch(Host(), hangs, 0.5).error.endswith("did not import torch within 0.5 s")
    assert time.monotonic() - started < 5
    assert "cannot run" in firmware.ask_torch(Host(), str(tmp_path / "nope"), 1).error


def test_vbios_and_inforom_arrive_through_the_nvml_child(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML_FACTS", str(NVML / "h100-sxm-gpu6-vbios-odd.json"))
    inv = nvml.inventory()
    assert [g.vbios for g in inv.gpus].count("96.00.74.00.0D") == 1 and inv.gpus[6].vbios == "96.00.74.00.0D"
    assert {g.inforom_image for g in inv.gpus} == {"G520.0200.00.05"}
    monkeypatch.setenv("FAKE_NVML_FACTS", str(NVML / "h100-sxm-8x-healthy.json"))
    assert nvml.inventory().gpus[0].inforom_image is None  # recorded without it: "not supported"


# ---- the CLI ------------------------------------------------------------------------


def test_preflight_run_only_firmware_names_the_odd_gpu(tmp_path):
    report = tmp_path / "r.json"
    python = python_script(tmp_path, 'echo \'{"torch": "2.4.1+cu124", "cuda": "12.4"}\'\n')
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "firmware", "--report", str(report), "--python", python,
                       "--nvml-fake", str(NVML / "h100-sxm-gpu6-vbios-odd.json")])
    assert p.returncode == 1, p.stderr
    (r,) = json.loads(report.read_text())["checks"]
    # The fake facts' bus ids name no GPU of this machine, so no GPU's board is known: the odd
    # VBIOS is a WARN (it was a FAIL, judged without the boards; the run still FAILs on the fake
    # facts). With the board's sysfs in place it FAILs: the next test.
    assert r["status"] == "FAIL" and r["details"]["parts"]["vbios"] == "WARN" and r["details"]["parts"]["cuda"] == "PASS"
    assert "GPU 6 96.00.74.00.0D" in r["cause"] and r["details"]["torch"]["cuda"] == "12.4"


@needs_root
def test_preflight_run_only_firmware_fails_the_odd_gpu_of_one_board(tmp_path):
    """The HGX H100 board's PCI ids (tests/fixtures/firmware/hgx-h100-one-board) mounted over
    /sys/bus/pci/devices in a private mount namespace: eight GPUs of one board, GPU 6 on another VBIOS."""
    report = tmp_path / "r.json"
    python = python_script(tmp_path, 'echo \'{"torch": "2.4.1+cu124", "cuda": "12.4"}\'\n')
    cmd = (f"mount --bind {BOARDS / 'hgx-h100-one-board/sys/bus/pci/devices'} /sys/bus/pci/devices && exec {' '.join(fakes.PREFLIGHT)} run "
           f"--profile h100-sxm --only firmware --report {report} --python {python} --lock-file {tmp_path / 'lock'} "
           f"--nvml-fake {NVML / 'h100-sxm-gpu6-vbios-odd.json'}")
    p = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    (r,) = json.loads(report.read_text())["checks"]
    assert r["details"]["parts"]["vbios"] == "FAIL" and r["summary"].startswith("GPU 6 on another VBIOS than the other 7"), r["summary"]
    assert r["details"]["gpus"]["6"]["board"] == "10de:16c1"


def test_firmware_takes_torch_from_the_runs_ranks_rather_than_import_it_again(tmp_path):
    # nccl needs ranks, so the run starts them as it begins; firmware waits for their word on
    # torch (their import held 3 s, as on a GPU node) instead of importing it in a child of its own.
    import torch

    report = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_") or k == "PREFLIGHT_LOCK_FILE"}
    env["PREFLIGHT_WORKER_FAULT"] = "*:slow=3s@import"
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "firmware,nccl", "--keep-going", "--nproc-per-node", "1", "--report", str(report),
                       "--nvml-fake", str(NVML / "h100-sxm-8x-healthy.json")], env=env, timeout=180)
    assert p.returncode == 1, p.stderr  # fake NVML facts never pass
    r = json.loads(report.read_text())["checks"][0]
    assert r["check"] == "firmware" and r["details"]["torch"] == {"torch": torch.__version__, "cuda": torch.version.cuda, "error": None}
    assert r["details"]["sources"]["torch.version.cuda"].endswith("(the ranks' own import, 1 of 1)")
    # With no launch in the run (firmware alone), it asks the interpreter itself, as before.
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "firmware", "--report", str(report), "--nvml-fake", str(NVML / "h100-sxm-8x-healthy.json")])
    r = json.loads(report.read_text())["checks"][0]
    assert r["details"]["sources"]["torch.version.cuda"].endswith("(import torch)")


def test_a_bad_pin_in_the_config_is_one_line_and_exit_2(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('vbios_version = "96.00"\n')
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "firmware", "--config", str(config)])
    assert p.returncode == 2 and "vbios_version" in p.stderr and len(p.stderr.strip().splitlines()) == 1


@needs_root
def test_preflight_run_only_firmware_names_the_nvswitch_left_behind(tmp_path):
    """The driver's /proc tree of an HGX board with one switch on an older BIOS, mounted over
    /proc/driver in a private mount namespace."""
    report = tmp_path / "r.json"
    python = python_script(tmp_path, 'echo \'{"torch": "2.4.1+cu124", "cuda": "12.4"}\'\n')
    cmd = (f"mount --bind {NVSWITCH / 'hgx-h100-switch-07-odd/proc/driver'} /proc/driver && exec {' '.join(fakes.PREFLIGHT)} run --profile h100-sxm "
           f"--only firmware --report {report} --python {python} --lock-file {tmp_path / 'lock'} --nvml-fake {NVML / 'h100-sxm-8x-fabric-completed.json'}")
    p = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    (r,) = json.loads(report.read_text())["checks"]
    assert r["details"]["parts"]["nvswitch"] == "FAIL" and r["details"]["nvswitch_bios"]["0000:07:00.0"] == "96.10.55.00.01"
    # (+1 more: NVML facts from --nvml-fake fail closed)
    assert r["summary"].startswith("NVSwitch 0000:07:00.0 on another NVSwitch BIOS than the other 3") and "96.10.6D.00.01" in r["cause"]


# ---- a source that cannot be read: the other answers, and the check says which ----------------------------------

H100 = profiles.resolve(profiles.load(profiles.BUILTIN_DIR / "h100-sxm.toml"), profiles.BUILTIN_DIR / "h100-sxm.toml", {}, "--profile h100-sxm")
BANNER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"


def node_root(tmp_path: Path, proc: bytes | None, module: str | None = "550.54.15\n") -> Path:
    root = tmp_path / "root"
    if proc is not None:
        (root / "proc/driver/nvidia").mkdir(parents=True)
        (root / "proc/driver/nvidia/version").write_bytes(proc)
    if module is not None:
        (root / "sys/module/nvidia").mkdir(parents=True)
        (root / "sys/module/nvidia/version").write_text(module)
    return root


@pytest.mark.parametrize("proc", [None, b"", fakes.BAD_OUTPUT["garbage"], fakes.BAD_OUTPUT["binary"]], ids=["absent", "empty", "garbage", "binary"])
def test_an_unreadable_proc_version_leaves_the_module_s_own_version_to_answer(tmp_path, proc):
    version, why, source, unread = firmware.kernel_driver_sources(Host(node_root(tmp_path, proc)))
    assert (version, why, source) == ("550.54.15", None, "/sys/module/nvidia/version")
    assert list(unread) == ["/proc/driver/nvidia/version"]


def test_both_versions_unreadable_say_each_why(tmp_path):
    version, why, source, unread = firmware.kernel_driver_sources(Host(node_root(tmp_path, b"junk", module="\x7fELF\n")))
    assert version is None and source is None and set(unread) == {"/proc/driver/nvidia/version", "/sys/module/nvidia/version"}
    assert why == "/proc/driver/nvidia/version names no kernel module version; /sys/module/nvidia/version holds '\\x7fELF', not a version"


def test_the_proc_banner_still_answers_first(tmp_path):
    assert firmware.kernel_driver_sources(Host(node_root(tmp_path, BANNER.encode(), module=None)))[:3] == ("550.54.15", None, "/proc/driver/nvidia/version")


BAD_PYTHON = {"garbage": 'printf "%s\\n" "lorem ]] [ipsum"; exit 0\n', "nothing": "exit 0\n", "exit-1": "echo oops >&2; exit 1\n",
              "binary": "head -c 300 /bin/sh; exit 0\n", "hang": "sleep 600\n"}


@pytest.mark.parametrize("bad", BAD_PYTHON, ids=list(BAD_PYTHON))
def test_an_interpreter_that_cannot_say_is_named_and_the_version_file_answers(tmp_path, bad):
    site = tmp_path / "site" / "torch"
    site.mkdir(parents=True)
    (site / "version.py").write_text("__version__ = '2.3.1+cu121'\ncuda: Optional[str] = '12.1'\n")
    python = python_script(tmp_path, f'case "$2" in *find_spec*) echo "{site}"; exit 0;; esac\n' + BAD_PYTHON[bad])
    ctx = Context(profile=H100, settings=Settings(nvml_fake=NVML / "h100-sxm-8x-healthy.json", python=python),
                  host=Host(node_root(tmp_path, b"\x1b[1mgarbage\x1b[0m\n")), deadline=time.monotonic() + 16)
    started = time.monotonic()
    r = firmware.Firmware().run(ctx)
    assert time.monotonic() - started < 16 + 3
    assert r.details["parts"]["driver"] == Status.PASS and r.details["parts"]["cuda"] == Status.PASS
    assert r.details["torch"] == {"torch": "2.3.1+cu121", "cuda": "12.1", "error": None}
    assert r.details["sources"] == {"kernel module version": "/sys/module/nvidia/version", "torch.version.cuda": str(site / "version.py")}
    assert set(r.details["unread"]) == {"/proc/driver/nvidia/version", f"{python} (import torch)"}
    assert {m.labels["tool"]: m.labels["fallback"] for m in r.measurements if m.name == "tool_unreadable"} == {
        "/proc/driver/nvidia/version": "/sys/module/nvidia/version", f"{python} (import torch)": str(site / "version.py")}
    assert [p for p, s in r.details["parts"].items() if s != Status.PASS] == ["source"]  # the fake facts' FAIL alone
