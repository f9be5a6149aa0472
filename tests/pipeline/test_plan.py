"""plan and execute: what the run does around the checks: the first readings taken as it begins,
and one NVML inventory handed to the whole run (real `preflight run`s, in this process, with
NVML's entry points wrapped to count what each run read)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fakes
import psutil
import pytest
from conftest import make_ctx
from typer.testing import CliRunner

from preflight.base.progress import Progress
from preflight.cli.app import app
from preflight.pipeline.check import Check, Context, Result, Status
from preflight.pipeline.plan import Plan, execute
from preflight.pipeline.report import Report
from preflight.pipeline.settings import Settings
from preflight.pipeline import lock
from preflight.readers.nvidia import nvml
from preflight.readers.nvidia import nvml_child as child_module

NVML = Path(__file__).parents[1] / "fixtures" / "nvml"
HEALTHY = NVML / "h100-sxm-8x-healthy.json"


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times this process read the inventory (the fake file or NVML), and how many
    NVML children it started for one: each is counted, then done as it would have been."""
    calls = {"inventory": 0, "child": 0}
    inventory, start = nvml.inventory, child_module.start

    def counting_inventory(*a, **kw):
        calls["inventory"] += 1
        return inventory(*a, **kw)

    def counting_start(what):
        calls["child"] += what == "inventory"
        return start(what)

    monkeypatch.setattr(nvml, "inventory", counting_inventory)
    monkeypatch.setattr(child_module, "start", counting_start)  # the CLI's early child and every later one
    return calls


def failing_python(tmp_path: Path) -> Path:
    """The workers' interpreter, failing at once: this run is about what the agent reads, and
    starts no torch on this 2-core machine (cuda and firmware then FAIL, naming it)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'no training environment here' >&2\nexit 1\n")
    python.chmod(0o755)
    return python


def run(tmp_path: Path, *args: str, exit_codes: tuple[int, ...] = (1,)) -> Report:
    """By default a run expected to fail: fake facts never vouch for a node, and no driver fails."""
    report = tmp_path / "report.json"
    r = CliRunner().invoke(app, ["run", *args, "--keep-going", "--report", str(report)])
    assert r.exit_code in exit_codes, r.output
    return Report.model_validate_json(report.read_text())


@pytest.fixture
def nvml_child(tmp_path, monkeypatch):
    """The NVML child runs for real, against the stand-in nvidia-ml-py (tests/fakes.py):
    ``nvml_child(facts)`` serves a FakeNvml file's facts, ``nvml_child(mode="nodriver")`` fails."""
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))

    def use(facts: Path | None = None, mode: str = "") -> None:
        monkeypatch.setenv("FAKE_NVML", mode)
        if facts is not None:
            monkeypatch.setenv("FAKE_NVML_FACTS", str(facts))

    return use


CHECKS = {"quick": ["cuda", "topology", "pcie", "rdma", "fabric", "firmware"],
          "standard": ["cuda", "topology", "pcie", "rdma", "fabric", "firmware", "nccl", "bandwidth", "train"]}


@pytest.mark.parametrize("level", ["quick", "standard"])
def test_a_run_on_the_fake_file_reads_it_once_for_detection_the_shape_and_every_check(tmp_path, counted, level):
    rep = run(tmp_path, "--level", level, "--nvml-fake", str(HEALTHY), "--python", str(failing_python(tmp_path)), "--skip", "shm")
    assert rep.profile == "h100-sxm" and rep.shape is not None and rep.shape.gpus == 8
    assert [c.check for c in rep.checks] == CHECKS[level]
    assert rep.checks[0].details["parts"]["inventory"] == "PASS"
    assert {c.check: c.summary for c in rep.checks if c.check in ("fabric", "firmware")} == dict.fromkeys(("fabric", "firmware"), "NVML facts are FAKE")
    assert counted["inventory"] == 1


@pytest.mark.parametrize("level", ["quick", "standard"])
def test_a_run_starts_one_nvml_child_for_detection_the_shape_and_every_check(tmp_path, counted, nvml_child, level):
    nvml_child(HEALTHY)
    rep = run(tmp_path, "--level", level, "--python", str(failing_python(tmp_path)), "--skip", "shm")
    assert rep.profile == "h100-sxm" and rep.shape is not None and rep.shape.gpus == 8
    assert [c.check for c in rep.checks] == CHECKS[level]
    cuda, fabric, firmware = rep.checks[0], rep.checks[4], rep.checks[5]
    assert cuda.details["parts"]["inventory"] == "PASS" and cuda.details["inventory"]["source"] == "NVML"
    assert (fabric.status, firmware.status) == ("PASS", "PASS") and firmware.summary.startswith("driver 550.54.15 (CUDA 12.4) on 8 GPUs")
    assert counted["child"] == 1


@pytest.mark.parametrize("level", ["quick", "standard"])
def test_nvml_that_does_not_answer_is_asked_once_and_every_check_still_fails_with_its_cause(tmp_path, counted, nvml_child, level):
    """The driver is missing: the one NVML child says so, the shape is read from sysfs
    alone, and each check that judges NVML's facts FAILs with that cause, never a traceback."""
    nvml_child(mode="nodriver")
    rep = run(tmp_path, "--profile", "h100-sxm", "--level", level, "--python", str(failing_python(tmp_path)), "--only", "cuda,topology,firmware")
    assert counted["child"] == 1
    assert [c.check for c in rep.checks] == ["cuda", "topology", "firmware"]
    for c in rep.checks:
        assert c.status == "FAIL" and c.cause == "no NVIDIA driver: the NVML library libnvidia-ml.so.1 was not found", c


@pytest.mark.gpu
def test_a_quick_run_on_this_gpu_node_starts_one_nvml_child(tmp_path, counted):
    """The real driver: detection, the shape and every check of the quick level judge one
    NVML reading (shm skipped: its write is not NVML's, and the kit's quick step runs it)."""
    rep = run(tmp_path, "--profile", "auto", "--level", "quick", "--skip", "shm", exit_codes=(0, 1))
    assert rep.profile and rep.shape is not None and rep.shape.gpus >= 1
    cuda = next(c for c in rep.checks if c.check == "cuda")
    assert cuda.details["parts"]["inventory"] in ("PASS", "WARN") and cuda.details["inventory"]["source"] == "NVML", cuda
    assert len(cuda.details["inventory"]["gpus"]) == rep.shape.gpus
    assert counted["child"] == 1


class Console:
    progress = Progress()

    def start(self, check: Check) -> None: ...
    def finish(self, result: Result) -> None: ...
    def note(self, text: str) -> None: ...


class Early(Check):
    name, description = "early", "runs first: sees the readings the checks after it took"

    def run(self, ctx: Context) -> Result:
        return self.result(Status.PASS, ", ".join(sorted(ctx.readings)))


class Reads(Check):
    name, description = "reads", "takes its first reading as the run begins"

    def begin(self, ctx: Context) -> None:
        ctx.readings[self.name] = f"taken after {len(ctx.results)} checks"

    def run(self, ctx: Context) -> Result:
        return self.result(Status.PASS, ctx.readings.pop(self.name))


class Broken(Check):
    name, description = "broken", "its first reading raises half way"

    def begin(self, ctx: Context) -> None:
        ctx.readings[self.name] = "half a reading"
        raise OSError("sysfs went away")

    def run(self, ctx: Context) -> Result:
        return self.result(Status.PASS, f"reading: {ctx.readings.get(self.name)}")


def test_every_check_takes_its_first_reading_before_the_first_check_and_a_failed_one_is_dropped():
    plan = Plan(make_ctx().profile, [Early(), Reads(), Broken()])
    report = execute(plan, Settings(), Console())
    assert [(c.check, c.status, c.summary) for c in report.checks] == [
        ("early", Status.PASS, "reads"),
        ("reads", Status.PASS, "taken after 0 checks"),
        ("broken", Status.PASS, "reading: None"),  # the check reads at its turn, as without a first reading
    ]


def test_a_fabric_still_registering_is_waited_for_once_before_the_shape_and_every_check(tmp_path, monkeypatch):
    """A boot gate right after the fabric manager started: GPU 5 still registering, its NVLinks not
    yet trained, at the plan's reading; registered with 18 links when NVML is read again. cuda
    (first, and at quick the one that would stop the run) judges the settled node, as every check does."""
    import json

    from preflight.readers.nvidia import nvml_settle
    from preflight.readers.nvidia.nvml import FakeNvml

    affinity = NVML / "h100-sxm-8x-affinity.json"
    data = json.loads(affinity.read_text())
    for g in data["gpus"]:
        g["fabric"] = {"state": "completed"}
    data["gpus"][5].update({"nvlinks_active": 0, "nvlink_remote": None, "fabric": {"state": "in_progress"}})
    (tmp_path / "registering.json").write_text(json.dumps(data))
    data["gpus"][5].update(json.loads(affinity.read_text())["gpus"][5] | {"fabric": {"state": "completed"}})
    (tmp_path / "registered.json").write_text(json.dumps(data))
    monkeypatch.setattr(nvml_settle, "EVERY_SECONDS", 0.0)
    asked = fakes.nvml_readings(monkeypatch, FakeNvml(tmp_path / "registering.json"), FakeNvml(tmp_path / "registered.json"))
    report = tmp_path / "report.json"
    r = CliRunner().invoke(app, ["run", "--profile", "h100-sxm", "--level", "quick", "--only", "cuda,fabric", "--keep-going", "--report", str(report)])
    assert "NVSwitch fabric registration in progress on GPU 5: waiting up to 20 s" in r.output, r.output
    rep = Report.model_validate_json(report.read_text())
    cuda, fabric = rep.checks
    assert "NVLink" not in (cuda.cause or ""), cuda.cause
    assert fabric.details["parts"]["gpus"] == "PASS", (fabric.summary, fabric.cause)
    assert len(asked) == 2  # the plan's reading, and the one after the wait: no check reads again


def test_a_signal_while_the_run_waits_for_the_fabric_still_writes_the_report_with_every_check_cut_short(tmp_path, monkeypatch):
    import json

    from preflight.base.errors import Interrupted
    from preflight.readers.nvidia.nvml import FakeNvml

    data = json.loads((NVML / "h100-sxm-8x-affinity.json").read_text())
    for g in data["gpus"]:
        g["fabric"] = {"state": "in_progress"}
    (tmp_path / "registering.json").write_text(json.dumps(data))
    reads = []

    def inventory(fake=None, timeout=20.0, started=None):
        if started is not None:
            started.stop()  # this machine's own NVML, begun ahead of the plan: the file stands for it
        reads.append(timeout)
        if len(reads) > 1:
            raise Interrupted(15)  # SIGTERM from systemd while the run waits
        return FakeNvml(tmp_path / "registering.json")

    monkeypatch.setattr(nvml, "inventory", inventory)
    report = tmp_path / "report.json"
    r = CliRunner().invoke(app, ["run", "--profile", "h100-sxm", "--level", "quick", "--only", "cuda,fabric", "--report", str(report)])
    assert r.exit_code == 143, r.output
    rep = Report.model_validate_json(report.read_text())
    assert rep.interrupted_by_signal == 15 and [(c.check, c.status) for c in rep.checks] == [("cuda", "SKIP"), ("fabric", "SKIP")]
    assert all(c.details == {"interrupted_by_signal": 15} for c in rep.checks)


def test_bad_input_after_the_early_nvml_child_leaves_no_child(tmp_path, counted, nvml_child):
    """`preflight run` starts NVML's child before its settings are read: one they refuse (exit 2,
    one line) still ends it, here one that would hang as a wedged driver does."""
    nvml_child(mode="hang")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    r = CliRunner().invoke(app, ["run", "--level", "quick", "--if-locked", "bogus", "--report", str(tmp_path / "r.json"),
                                 "--lock-file", str(tmp_path / "preflight.lock")])  # no other run's: the child starts early
    assert r.exit_code == 2 and "--if-locked 'bogus'" in r.output
    assert counted["child"] == 1
    assert {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE} <= before
    assert not (tmp_path / "r.json").exists()


def test_an_early_child_for_a_profile_without_gpus_named_in_the_config_is_ended_unread(tmp_path, counted, nvml_child):
    nvml_child(mode="hang")  # never read: the cpu profile reads no NVML
    config = tmp_path / "config.toml"
    config.write_text('profile = "cpu"\n')
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    rep = run(tmp_path, "--config", str(config), "--level", "quick", "--only", "shm", "--lock-file", str(tmp_path / "preflight.lock"), exit_codes=(0,))
    assert rep.profile == "cpu" and counted["child"] == 1
    assert {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE} <= before


def test_no_early_nvml_child_while_another_run_holds_the_node(tmp_path, counted, nvml_child, monkeypatch):
    """A reading begun while another run loads the GPUs would see its load, and the gate, finding the
    lock free a moment later, would keep it: the CLI begins NVML's child early only where the lock is free."""
    nvml_child(HEALTHY)
    calls = []
    early = child_module.early
    monkeypatch.setattr(child_module, "early", lambda *a, **kw: calls.append(a) or early(*a, **kw))
    path = tmp_path / "preflight.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\nf = open(sys.argv[1], 'w')\n"
                               "fcntl.flock(f, fcntl.LOCK_EX)\nf.write(str(os.getpid()).rjust(10) + '\\n'); f.flush()\nprint('held', flush=True)\ntime.sleep(60)",
                               str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        os.chmod(path, 0o600)
        r = CliRunner().invoke(app, ["run", "--level", "quick", "--lock-file", str(path), "--lock-timeout", "0.2", "--if-locked", "skip", "--scratch"])
        assert r.exit_code == 0 and "still holds" in r.output, r.output
        assert calls == []
        holder.kill()
        holder.wait()
        rep = run(tmp_path, "--level", "quick", "--lock-file", str(path), "--python", str(failing_python(tmp_path)), "--only", "cuda", exit_codes=(0, 1))
        assert len(calls) == 1 and rep.checks[0].details["inventory"]["source"] == "NVML"
    finally:
        holder.kill()
        holder.wait()


def test_an_early_child_is_ended_where_the_config_names_another_lock(tmp_path, counted, nvml_child, monkeypatch):
    nvml_child(HEALTHY)
    monkeypatch.delenv("PREFLIGHT_LOCK_FILE")  # conftest's, which would name the lock before the config could
    monkeypatch.setattr(lock, "default_path", lambda **kw: tmp_path / "default.lock")  # free, whatever else runs here
    config = tmp_path / "config.toml"
    config.write_text(f'lock_file = "{tmp_path / "site.lock"}"\n')
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    rep = run(tmp_path, "--config", str(config), "--level", "quick", "--python", str(failing_python(tmp_path)), "--only", "cuda", exit_codes=(0, 1))
    # The early child asked a lock that is not this run's: ended, and NVML read after the run's own was asked.
    assert counted["child"] == 2 and rep.checks[0].details["inventory"]["source"] == "NVML"
    assert {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE} <= before
