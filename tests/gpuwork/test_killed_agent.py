"""A killed agent leaves nothing running: SIGKILL of `preflight run` (the OOM
killer, systemd's final kill) in the middle of nccl, bandwidth, train and a
30 s burn-in, on the cpu profile's real gloo ranks. One second later no process
of the run lives (torchrun and every rank die with it: base/tether.py), and the
next run removes the folder the killed one left in TMPDIR and passes."""

from __future__ import annotations

import signal
import sys
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import CPU_TOML, clean_env
from fakes import PREFLIGHT

BURN = 30  # seconds of burn-in: the rank is deep in it when the agent dies


def long_burn(tmp_path: Path) -> dict[str, str]:
    """The cpu profile with a 30 s burn-in, as a site profile "cpu-long"."""
    site = tmp_path / "profiles"
    site.mkdir()
    text = CPU_TOML.read_text().replace('name = "cpu"', 'name = "cpu-long"')
    assert "\nseconds = 3\n" in text
    (site / "cpu-long.toml").write_text(text.replace("\nseconds = 3\n", f"\nseconds = {BURN}\n"))
    (tmp_path / "tmp").mkdir()
    return {**clean_env(), "PREFLIGHT_PROFILES_DIR": str(site), "TMPDIR": str(tmp_path / "tmp"), "PREFLIGHT_LOCK_FILE": str(tmp_path / "lock")}


def the_runs_processes(tmp_path: Path) -> list[psutil.Process]:
    """torchrun and the ranks of a run whose TMPDIR is this test's (their --out lies there)."""
    mine = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(str(tmp_path / "tmp") in a for a in p.info["cmdline"] or []):
                mine.append(p)
        except psutil.Error:
            continue
    return mine


def running(procs: list[psutil.Process]) -> list[str]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return left


def run_args(tmp_path: Path, check: str) -> list[str]:
    return ["run", "--profile", "cpu-long", "--level", "full", "--only", check, "--report", str(tmp_path / "report.json")]


@pytest.mark.parametrize("check", ["nccl", "bandwidth", "train", "burnin"])
def test_nothing_of_a_killed_run_lives_on_and_the_next_run_starts_clean(tmp_path: Path, check: str) -> None:
    env = long_burn(tmp_path)
    with open(tmp_path / "agent.log", "wb") as log:
        agent = subprocess.Popen([*PREFLIGHT, *run_args(tmp_path, check)], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        # The check's stage is under way: both ranks have reported from inside it.
        until = time.monotonic() + 240
        while not list((tmp_path / "tmp").glob("preflight-worker-*/out/stage*/rank1.json")):
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            assert time.monotonic() < until, "the stage never started"
            time.sleep(0.05)
        procs = the_runs_processes(tmp_path)
        assert len(procs) >= 3, procs  # torchrun and two ranks
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        time.sleep(1.0)
        assert running(procs) == [], f"alive 1 s after the agent's SIGKILL in {check}"
    finally:
        if agent.poll() is None:
            agent.kill()
        for p in the_runs_processes(tmp_path):
            p.kill()
    left_behind = list((tmp_path / "tmp").glob("preflight-worker-*"))
    assert left_behind, "the killed run left its folder, as a SIGKILL must"

    done = subprocess.run([*PREFLIGHT, *run_args(tmp_path, check)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "tmp").glob("preflight-worker-*")) == [], "the next run did not remove the killed run's folder"


def test_under_a_python_wrapper_that_does_not_exec_the_run_passes_and_nothing_outlives_a_killed_agent(tmp_path: Path) -> None:
    # A site's --python is often a script that sets the environment and runs the interpreter
    # without exec (`conda run` does the same): torchrun is then the wrapper's child, not the
    # process the trampoline became, and the ranks must tie themselves to what really started them.
    env = long_burn(tmp_path)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\n"{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    args = [*run_args(tmp_path, "nccl"), "--python", str(wrapper)]
    done = subprocess.run([*PREFLIGHT, *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr

    with open(tmp_path / "agent.log", "wb") as log:
        agent = subprocess.Popen([*PREFLIGHT, *run_args(tmp_path, "burnin"), "--python", str(wrapper)], env=env,
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        until = time.monotonic() + 240
        while not list((tmp_path / "tmp").glob("preflight-worker-*/out/stage*/rank1.json")):
            assert agent.poll() is None and time.monotonic() < until, (tmp_path / "agent.log").read_text()
            time.sleep(0.05)
        procs = the_runs_processes(tmp_path)
        ranks = [p for p in procs if not any(a.endswith("_torchrun.py") or a == "torch.distributed.run" for a in p.cmdline())]
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        time.sleep(1.0)
        assert running(ranks) == [], "a rank outlived its agent by a second"
        until = time.monotonic() + 10  # torchrun, orphaned by the wrapper, ends once its ranks are gone
        while running(procs) and time.monotonic() < until:
            time.sleep(0.1)
        assert running(procs) == []
    finally:
        if agent.poll() is None:
            agent.kill()
        for p in the_runs_processes(tmp_path):
            p.kill()
