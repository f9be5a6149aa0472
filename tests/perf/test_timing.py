"""tests/perf/timing.py's run(), as the benches use it: a torchrun whose rank
hangs (the attacker's case of issue 34: a rank in a session of its own that
outlived the bench, as root, holding the GPUs and the bench's pipes) is ended
at its deadline with every process of the launch, and a bench's SIGTERM ends
them too. Real runs on CPU: torchrun, one rank that sleeps and ignores SIGTERM."""

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

from preflight.gpuwork.launch import free_port

PERF = Path(__file__).parent
DEADLINE = 15  # past torchrun's start of its rank (about 2 s on the loaded 2-core CI VM), far short of the rank's sleep
SLEEP = 600

RANK = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a rank stuck in NCCL's init may be
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(float(sys.argv[2]))
"""

# One bench's way of running a child, called as the bench calls it, in a process of its own.
DRIVER = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
which, deadline, argv = sys.argv[2], float(sys.argv[3]), sys.argv[4:]
t = time.monotonic()
said = None
if which == "verdict":
    import bench_time_to_verdict as b
    try:
        b.timed(argv, dict(os.environ), time.monotonic() + deadline)
    except b.OutOfTime as e:
        said = str(e)
elif which == "model":
    import bench_time_model as b
    try:
        b.run(argv, timeout=deadline)
    except SystemExit as e:
        said = str(e)
else:
    import timing
    timing.guard()
    timing.run(argv, deadline)
print(json.dumps({"seconds": time.monotonic() - t, "said": said}), flush=True)
"""


# The same rank holding GPU 0: a CUDA context and 256 MiB on it, through the driver
# API (no torch import to wait for); its PID is written once it holds them.
GPU_RANK = """
import ctypes, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, mem = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), 0)), ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), dev)),
                   ("cuCtxSetCurrent", (ctx,)), ("cuMemAlloc_v2", (ctypes.byref(mem), ctypes.c_size_t(256 << 20)))):
    rc = getattr(cuda, call)(*args)
    assert rc == 0, (call, rc)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(float(sys.argv[2]))
"""


def launch(tmp_path: Path, rank: str = RANK) -> list[str]:
    (tmp_path / "rank.py").write_text(rank)
    return [sys.executable, "-m", "torch.distributed.run", "--master-port", str(free_port()), "--nproc-per-node", "1",
            str(tmp_path / "rank.py"), str(tmp_path / "rank.pid"), str(SLEEP)]


def of_the_launch(tmp_path: Path) -> list[psutil.Process]:
    """Live processes whose command line names this test's rank script: torchrun and its rank."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and any(str(tmp_path) in a for a in p.info["cmdline"] or ()):
            found.append(p)
    return found


@pytest.fixture
def no_leftovers(tmp_path):
    yield
    for p in of_the_launch(tmp_path):  # a failed run of this test leaves nothing running either
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.mark.parametrize("bench", ["verdict", "model"])
def test_a_hung_torchrun_is_ended_at_its_deadline_with_its_rank(tmp_path, no_leftovers, bench):
    argv = launch(tmp_path)
    p = subprocess.run([sys.executable, "-c", DRIVER, str(PERF), bench, str(DEADLINE), *argv],
                       capture_output=True, text=True, timeout=DEADLINE + 90)  # a rank waited on: 600 s
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert (tmp_path / "rank.pid").exists(), "the rank never started: the case was not exercised"
    assert f"ran past {DEADLINE} s and was killed" in out["said"], out
    assert of_the_launch(tmp_path) == [], out
    assert not psutil.pid_exists(int((tmp_path / "rank.pid").read_text())) or \
        psutil.Process(int((tmp_path / "rank.pid").read_text())).status() == psutil.STATUS_ZOMBIE


def test_a_bench_ended_by_sigterm_ends_the_torchrun_and_its_rank_first(tmp_path, no_leftovers):
    argv = launch(tmp_path)
    d = subprocess.Popen([sys.executable, "-c", DRIVER, str(PERF), "guarded", str(SLEEP), *argv],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = tmp_path / "rank.pid"
    try:
        for _ in range(600):  # up to 60 s for torchrun to start its rank
            if pid.exists() or d.poll() is not None:
                break
            time.sleep(0.1)
        assert pid.exists(), "the rank never started"
        d.send_signal(signal.SIGTERM)  # as run.sh's `timeout` does at a step's budget
        out, err = d.communicate(timeout=60)
    finally:
        if d.poll() is None:
            d.kill()
            d.wait()
    assert d.returncode == 128 + signal.SIGTERM, (out, err[-3000:])
    assert "SIGTERM: ended" in err
    assert of_the_launch(tmp_path) == []


@pytest.mark.gpu
def test_a_hung_rank_holding_a_gpu_is_ended_at_the_deadline_of_the_kits_bench(tmp_path, no_leftovers):
    """The kit's verdict step on a GPU node: the rank killed is one that held GPU 0."""
    deadline = 10  # torchrun's start and cuInit on the node, with room; the kit's pytest step is 110 s in all
    argv = launch(tmp_path, GPU_RANK)
    p = subprocess.run([sys.executable, "-c", DRIVER, str(PERF), "verdict", str(deadline), *argv],
                       capture_output=True, text=True, timeout=deadline + 60)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert (tmp_path / "rank.pid").exists(), f"the rank never held the GPU within {deadline} s: {out}"
    assert f"ran past {deadline} s and was killed" in out["said"], out
    assert of_the_launch(tmp_path) == [], out
