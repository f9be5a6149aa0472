"""One launch of the ranks per run (preflight/gpuwork/world.py, checks/workers/world.py),
tested with real gloo ranks under torchrun: the checks share it, a stage that goes
wrong ends it, the next check gets a fresh one, and nothing outlives the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import clean_env, run_preflight, world_processes
from preflight.gpuwork import launch, ranks, ranks_judge
from preflight.gpuwork.world import Worlds
from preflight.readers.nccl import nccl_log
from preflight.pipeline.report import Report

DRIVER = launch.WORKERS_DIR / "world.py"
NVML = Path(__file__).parents[1] / "fixtures" / "nvml"


def ranks_of(check) -> list[dict]:
    return [o["report"] for o in check.details["ranks"] if o.get("report")]


def test_a_cpu_run_starts_the_ranks_once_and_every_check_that_needs_them_shares_them():
    p = run_preflight(["run", "--profile", "cpu", "--json", "-q"], timeout=300)
    report = Report.model_validate_json(p.stdout)
    assert p.returncode == 0, p.stderr
    by = {c.check: c for c in report.checks}
    assert [by[c].details["world"] for c in ("nccl", "bandwidth", "train")] == [
        {"launch": 1, "stage": k, "ended_it": False} for k in (1, 2, 3)
    ]
    # torch was imported once: the first stage paid for it, the later ones found it there.
    assert all(r["import_seconds"] > 0 for r in ranks_of(by["nccl"]))
    assert all(r["import_seconds"] == 0 for c in ("bandwidth", "train") for r in ranks_of(by[c]))
    # The same processes ran every stage.
    pids = [sorted(r["pid"] for r in ranks_of(by[c])) for c in ("nccl", "bandwidth", "train")]
    assert pids[0] == pids[1] == pids[2]
    assert world_processes() == []


def test_a_rank_killed_in_bandwidth_ends_the_launch_and_under_keep_going_the_next_check_gets_a_fresh_one():
    env = {**clean_env(), "PREFLIGHT_WORKER_FAULT": "1:kill@all_gather"}  # a step only bandwidth has
    p = run_preflight(["run", "--profile", "cpu", "--only", "nccl,bandwidth,train", "--keep-going", "--json", "-q"], env=env, timeout=300)
    by = {c.check: c for c in Report.model_validate_json(p.stdout).checks}
    assert p.returncode == 1
    assert by["bandwidth"].status == "FAIL" and "rank 1 died in all_gather" in by["bandwidth"].cause
    assert [by[c].details["world"] for c in ("nccl", "bandwidth")] == [{"launch": 1, "stage": k, "ended_it": k == 2} for k in (1, 2)]
    # Ran, in a launch of its own (a busy 2-core machine may make it WARN of a straggler; never SKIP).
    assert by["train"].status in ("PASS", "WARN") and by["train"].details["world"] == {"launch": 2, "stage": 1, "ended_it": False}
    assert world_processes() == []


def test_without_keep_going_a_failed_stage_skips_the_rest_as_before():
    env = {**clean_env(), "PREFLIGHT_WORKER_FAULT": "1:raise"}
    p = run_preflight(["run", "--profile", "cpu", "--only", "nccl,bandwidth,train", "--json", "-q"], env=env, timeout=300)
    checks = Report.model_validate_json(p.stdout).checks
    assert [(c.check, c.status) for c in checks] == [("nccl", "FAIL"), ("bandwidth", "SKIP"), ("train", "SKIP")]
    assert "rank 1 failed first" in checks[0].cause
    assert world_processes() == []


def test_sigterm_mid_stage_leaves_no_rank_behind(tmp_path):
    env = {**clean_env(), "PREFLIGHT_WORKER_FAULT": "*:stop@latency"}  # every rank hangs in bandwidth
    proc = subprocess.Popen([sys.executable, "-m", "preflight", "run", "--profile", "cpu", "--only", "nccl,bandwidth", "-q",
                             "--report", str(tmp_path / "r.json")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any("--agent-pid" in (p.cmdline() or []) for p in world_processes() if p.status() == psutil.STATUS_STOPPED):
            assert time.monotonic() < deadline and proc.poll() is None, "the ranks never reached the hang"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    report = Report.model_validate_json((tmp_path / "r.json").read_text())
    assert [(c.check, c.status) for c in report.checks] == [("nccl", "PASS"), ("bandwidth", "ERROR")]
    assert world_processes() == []


def test_an_idle_rank_exits_once_its_agent_is_gone(tmp_path):
    # The driver alone, as rank 0 of 1: its agent is a process the test can end.
    agent = subprocess.Popen(["sleep", "60"])
    rank = subprocess.Popen([sys.executable, str(DRIVER), "--out", str(tmp_path), "--agent-pid", str(agent.pid), "--until", str(time.time() + 60)])
    try:
        time.sleep(0.5)
        assert rank.poll() is None  # waiting for its first stage
        agent.kill()
        agent.wait()
        assert rank.wait(timeout=10) == 0
    finally:
        for p in (agent, rank):
            if p.poll() is None:
                p.kill()


def test_an_idle_rank_exits_at_its_time_limit(tmp_path):
    rank = subprocess.Popen([sys.executable, str(DRIVER), "--out", str(tmp_path), "--agent-pid", str(os.getpid()), "--until", str(time.time() + 1)])
    try:
        assert rank.wait(timeout=30) == 0
    finally:
        if rank.poll() is None:
            rank.kill()


def test_each_rank_says_once_it_has_imported_torch_and_which_it_got():
    import torch

    worlds = Worlds()
    worlds.prestart(sys.executable, 2, 0)
    try:
        said = worlds.torch_said(sys.executable, time.monotonic() + 90)
        assert said is not None and sorted(said) == [0, 1]
        for rank in said.values():
            assert rank["torch"] == torch.__version__ and rank["cuda"] == torch.version.cuda and rank["import_seconds"] > 0
        assert worlds.starting() is None  # up: nothing waits for it any more
        assert worlds.torch_said("/another/python", time.monotonic() + 1) is None  # not that interpreter's launch
    finally:
        worlds.close()
    assert world_processes() == []


def test_the_checks_that_need_no_ranks_run_while_the_ranks_import_torch(tmp_path):
    # The ranks' import held 6 s longer, as on a GPU node: cuda asks NVML and reads the kernel log,
    # then waits for them while topology runs; CUDA init goes on once they are up.
    env = {**clean_env(), "PREFLIGHT_WORKER_FAULT": "*:slow=6s@import"}
    args = ["run", "--profile", "h100-sxm", "--nvml-fake", str(NVML / "h100-sxm-8x-healthy.json"), "--only", "cuda,topology",
            "--nproc-per-node", "1", "--keep-going", "--report", str(tmp_path / "r.json")]
    p = run_preflight(args, env=env, timeout=180)
    started = [line.split()[1] for line in p.stderr.splitlines() if line.startswith("  ... ") and len(line.split()) == 2]
    assert started == ["cuda", "topology", "cuda"], p.stderr
    report = Report.model_validate_json((tmp_path / "r.json").read_text())
    cuda, topology = report.checks
    assert (cuda.check, topology.check) == ("cuda", "topology")
    assert cuda.details["init"]["report"]["torch_version"]  # CUDA init ran (a CPU build here: it fails, as it must)
    assert cuda.duration_seconds < report.duration_seconds
    assert topology.status != "SKIP" and "carried_from" not in topology.details
    assert world_processes() == []


# A third-party worker joins the run's launch by path: a gloo all_reduce of each rank's number.
PLUGIN_WORKER = '''
import argparse, sys
import _rank

def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--value", type=float)
    args = p.parse_args(argv)
    me = _rank.whoami()
    _rank.redirect_output(args.out, me.local_rank)
    report = _rank.base_report(me)
    report.update(backend="gloo", device="cpu")
    save = lambda: _rank.write_report(args.out, me.local_rank, report)
    save()

    def body():
        torch, dist, device = _rank.start_torch("cpu", me.local_rank, report, save)
        _rank.init_group(dist, "gloo", device, 30)
        x = torch.tensor([args.value + me.rank])
        dist.all_reduce(x)
        report.update(stage="done", total=float(x.item()))
        save()
        _rank.end_group(dist)
        return 0

    return _rank.guarded(body, report, save)

if __name__ == "__main__":
    sys.exit(main())
'''


def test_a_third_party_worker_runs_as_a_stage_of_the_same_launch(tmp_path):
    script = tmp_path / "plugin_worker.py"
    script.write_text(PLUGIN_WORKER)
    worlds = Worlds()
    try:
        done = []
        for worker in (launch.Worker("nccl_smoke.py", ["--backend", "gloo", "--device", "cpu", "--large-bytes", "65536"], nproc=2),
                       launch.Worker(str(script), ["--value", "10"], nproc=2)):
            f = ranks.RunFacts(python=sys.executable, backend="gloo", nproc=2)
            done.append(ranks.collect(f, worker, ranks.RankReport, {}, 120, None, worlds=worlds))
            assert ranks_judge.judge_run(f, "the stage", "by hand") == []
        assert [d.world for d in done] == [{"launch": 1, "stage": 1, "ended_it": False}, {"launch": 1, "stage": 2, "ended_it": False}]
        assert [done[1].reports[r]["total"] for r in (0, 1)] == [21.0, 21.0]  # 10 + 11 on both ranks
        assert {done[0].reports[r]["pid"] for r in (0, 1)} == {done[1].reports[r]["pid"] for r in (0, 1)}
        assert worlds.launches == 1
    finally:
        worlds.close()
    assert world_processes() == []


# Stands in for NCCL on a machine with none: each rank writes a recorded NCCL log into the file
# NCCL_DEBUG_FILE names, a line at a time, flushed, as NCCL's line-buffered file does.
NCCL_WRITER = '''
import argparse, os, sys
import _rank

def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--lines")
    args = p.parse_args(argv)
    me = _rank.whoami()
    report = _rank.base_report(me)
    report.update(backend="gloo", device="cpu", debug=os.environ.get("NCCL_DEBUG"), debug_file=os.environ.get("NCCL_DEBUG_FILE"))
    with open(os.environ["NCCL_DEBUG_FILE"], "a") as f:
        for line in open(args.lines).read().splitlines(keepends=True):
            f.write(line)
            f.flush()
    report.update(stage="done")
    _rank.write_report(args.out, me.local_rank, report)
    return 0

if __name__ == "__main__":
    sys.exit(main())
'''

NCCL_FIXTURES = Path(__file__).parent.parent / "fixtures"
NVLS_RUN = "11_aws-p5.48xlarge-8xh100_single-node_all_reduce_NVLS_mpirun-tag-output-prefix_ONE-SIZE-ROW-EXCERPT.txt"


def test_each_stage_gets_the_nccl_lines_its_own_collectives_wrote(tmp_path):
    # NCCL reads NCCL_DEBUG_FILE once per process: one file per rank for the launch, cut at each stage's end.
    script = tmp_path / "nccl_writer.py"
    script.write_text(NCCL_WRITER)
    smoke = NCCL_FIXTURES / "nccl" / "02_nccl2.27.5_2gpu-consumer_NET-Socket-16ifaces_SHM-direct-direct_isAllDirectP2p0.log"
    # The 8x H100 all_reduce run: NVLS set up (16 nvls channels), as bandwidth's large collectives would.
    collectives = tmp_path / "nvls.log"
    collectives.write_text("".join(line.split("<stdout>:", 1)[1] for line in (NCCL_FIXTURES / "nccltests" / NVLS_RUN).read_text().splitlines(keepends=True)
                                   if "NCCL INFO" in line))
    worlds = Worlds()
    try:
        done = []
        for lines in (smoke, collectives, None):
            worker = launch.Worker(str(script), ["--lines", str(lines)], nproc=2) if lines else launch.Worker(
                "nccl_smoke.py", ["--backend", "gloo", "--device", "cpu", "--large-bytes", "65536"], nproc=2)
            f = ranks.RunFacts(python=sys.executable, backend="gloo", nproc=2)
            done.append(ranks.collect(f, worker, ranks.RankReport, {}, 120, None, worlds=worlds))
            assert ranks_judge.judge_run(f, "the stage", "by hand") == []
        assert [d.world["launch"] for d in done] == [1, 1, 1]
        for r in (0, 1):
            assert done[0].reports[r]["debug"] == "INFO" and done[0].reports[r]["debug_file"].endswith(f"nccl.rank{r}.log")
            assert done[0].texts[f"nccl.rank{r}.log"] == smoke.read_text()
            assert done[1].texts[f"nccl.rank{r}.log"] == collectives.read_text()
        assert not any(name.startswith("nccl.") for name in done[2].texts)  # gloo: NCCL wrote nothing in that stage
        assert nccl_log.parse(done[0].texts["nccl.rank0.log"]).nvls_channels == 0
        assert nccl_log.parse(done[1].texts["nccl.rank0.log"]).nvls_channels == 16
    finally:
        worlds.close()
    assert world_processes() == []


def test_a_stage_past_its_deadline_ends_the_launch_and_names_the_hung_rank():
    worlds = Worlds()
    try:
        # Rank 1 stops before it writes a word; rank 0 waits for it in init, within its own 60 s.
        env = {"PREFLIGHT_WORKER_FAULT": "1:stop@start"}
        worker = launch.Worker("nccl_smoke.py", ["--backend", "gloo", "--device", "cpu", "--timeout", "60"], env=env, nproc=2)
        f = ranks.RunFacts(python=sys.executable, backend="gloo", nproc=2)
        done = ranks.collect(f, worker, ranks.RankReport, {}, 15, None, worlds=worlds)
        assert done.timed_out and done.world["ended_it"] and done.seconds < 25
        assert ranks_judge.judge_run(f, "the stage", "by hand")[0].summary == "rank 1 never reported"
        assert world_processes() == []
    finally:
        worlds.close()


def test_the_launch_started_early_for_nccl_is_killed_when_a_check_before_it_fails(tmp_path):
    # The run starts the ranks as it begins, so the torch imports overlap shm; shm fails here
    # against a site floor no machine meets, nccl is skipped, and the early launch dies at once.
    site = tmp_path / "config.toml"
    site.write_text("[floors]\nshm_min_bytes = 1125899906842624   # 1 PiB\n")
    p = run_preflight(["run", "--profile", "cpu", "--only", "shm,nccl", "--config", str(site), "--json", "-q"], timeout=120)
    checks = Report.model_validate_json(p.stdout).checks
    assert p.returncode == 1 and [(c.check, c.status) for c in checks] == [("shm", "FAIL"), ("nccl", "SKIP")]
    assert world_processes() == []


def test_the_quick_level_starts_no_launch(tmp_path):
    p = run_preflight(["run", "--profile", "cpu", "--level", "quick", "--json", "-q", "--report", str(tmp_path / "r.json")], timeout=120)
    assert p.returncode == 0, p.stderr
    assert [c.check for c in Report.model_validate_json(p.stdout).checks if "carried_from" not in c.details] == ["shm"]
    assert world_processes() == []


def test_a_launch_across_nodes_starts_only_once_this_nodes_idle_launch_is_gone(monkeypatch):
    # cuda_init runs in this node's launch, whose ranks keep their CUDA contexts; a group
    # check's launch on the same GPUs, in EXCLUSIVE_PROCESS mode, could make none while
    # they live. A group of one node on loopback is a launch across nodes all the same.
    from preflight.gpuwork import world as world_mod

    running_at_start: list[set[int]] = []
    real_start = world_mod.launch.start
    earlier: list[set[int]] = []

    def start(*args, **kwargs):
        running_at_start.append({pid for pids in earlier for pid in pids if _running(pid)})
        return real_start(*args, **kwargs)

    monkeypatch.setattr(world_mod.launch, "start", start)
    group = launch.Group(1, 0, f"127.0.0.1:{launch.free_port()}", "preflight-test", "127.0.0.1", "lo", 30)
    smoke = ["--backend", "gloo", "--device", "cpu", "--large-bytes", "65536"]
    worlds = Worlds()
    try:
        done = []
        for g in (None, group, None):
            f = ranks.RunFacts(python=sys.executable, backend="gloo", nproc=2)
            done.append(ranks.collect(f, launch.Worker("nccl_smoke.py", smoke, nproc=2, group=g), ranks.RankReport, {}, 120, None, worlds=worlds))
            assert ranks_judge.judge_run(f, "the stage", "by hand") == []
            earlier.append(worlds.after_check())  # the idle launch's processes: torchrun and its ranks
        assert all(earlier) and running_at_start == [set(), set(), set()]
        assert [d.world["launch"] for d in done] == [1, 2, 3]  # back on this node alone: a fresh launch
        assert not any(_running(pid) for pid in earlier[0] | earlier[1])
    finally:
        worlds.close()
    assert world_processes() == []


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
