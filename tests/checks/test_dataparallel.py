"""The train probe's data parallelism (checks/workers/_dataparallel.py) against
torch's own, for real: two gloo ranks on this CPU train the same small model
twice, once with GradSync and AdamW, once with DistributedDataParallel and
torch.optim.AdamW, and every parameter must come out with the same bits. Then
the whole probe runs in one process and must never have imported
torch._dynamo, which torch's classes import (seconds a launch on a GPU node)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from preflight.gpuwork import launch

DEADLINE = 120.0

# One rank: the same model trained by both; rank 1 starts from other weights, so the
# broadcast of rank 0's must happen for the two runs to agree. The model has what the probe's
# GPT has: a weight tied to the head (its gradient lands last, from two uses) and a parameter
# whose gradient lands before those registered after it. Tiny buckets make several; a
# parameter that never gets a gradient holds back the first one, which must still go, in
# order, once backward is done. The no_sync passes keep each rank's gradients to itself.
RANK = r"""
import json, sys
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[3])
import _dataparallel as dp
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.gain = torch.nn.Parameter(torch.ones(8))  # registered early, used last: its gradient comes first
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))

    def forward(self, idx):
        return (self.body(self.embed(idx)) * self.gain) @ self.embed.weight.t()  # the head tied to the embedding

def model():
    torch.manual_seed(0)
    m = Net()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * rank)  # each rank its own start: rank 0's must win
    return m

g = torch.Generator().manual_seed(100 + rank)
batches = [(torch.randint(0, 16, (16,), generator=g), torch.randint(0, 16, (16,), generator=g)) for _ in range(6)]
loss = lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1])

ours = model()
spare = torch.nn.Parameter(torch.zeros(3))  # never used: no gradient ever lands
finish = lambda work, what: work.wait()
sync = dp.GradSync(torch, dist, [*ours.parameters(), spare], 2, finish, bucket_bytes=1200, first_bucket_bytes=200)
sync.broadcast()
opt = dp.AdamW(torch, ours.parameters(), lr=1e-2)
for b in batches[:5]:
    sync.zero(); loss(ours, b).backward(); sync.wait(); opt.step()
synced = [p.grad.clone() for p in ours.parameters()]
sync.zero()
with sync.no_sync():
    loss(ours, batches[5]).backward()
dynamo_before = "torch._dynamo" in sys.modules

theirs = model()
ddp = torch.nn.parallel.DistributedDataParallel(theirs, bucket_cap_mb=1200 / 2**20)
topt = torch.optim.AdamW(theirs.parameters(), lr=1e-2, foreach=True)
for b in batches[:5]:
    topt.zero_grad(); loss(ddp, b).backward(); topt.step()
synced_same = all(torch.equal(x, p.grad) for x, p in zip(synced, theirs.parameters(), strict=True))
topt.zero_grad()
with ddp.no_sync():
    loss(ddp, batches[5]).backward()

same = lambda xs, ys: all(torch.equal(x, y) for x, y in zip(xs, ys, strict=True))
print(json.dumps({
    "buckets": len(sync.buckets),
    "params_same": same(ours.parameters(), theirs.parameters()),
    "synced_grads_same": synced_same,
    "local_grads_same": same([p.grad for p in ours.parameters()], [p.grad for p in theirs.parameters()]),
    "checksum": float(sum(p.double().sum() for p in ours.parameters())),
    "dynamo_before_ddp": dynamo_before,
}), flush=True)
dist.destroy_process_group()
import os
os._exit(0)  # as a worker ends (_rank.exit_now): torch's C++ threads can abort the interpreter's teardown (SIGABRT)
"""


# Ranks given different model arguments: told so, before any collective of a size the peers do not share.
MISMATCHED = r"""
import json, sys
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[3])
import _dataparallel as dp
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
m = torch.nn.Linear(4, 4 + rank)
try:
    dp.GradSync(torch, dist, list(m.parameters()), 2, lambda work, what: work.wait()).broadcast()
    said = None
except RuntimeError as e:
    said = str(e)
print(json.dumps({"said": said}), flush=True)
dist.destroy_process_group()
import os
os._exit(0)  # as a worker ends (_rank.exit_now)
"""


def run_ranks(tmp_path: Path, script: str = RANK) -> list[dict]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(tmp_path / "store"), str(launch.WORKERS_DIR)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, start_new_session=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=DEADLINE) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(f"rank {r} exit {p.returncode}: {e[-3000:]}" for r, (p, (_, e)) in enumerate(zip(procs, outs)))
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]


def test_two_ranks_train_to_the_same_bits_as_ddp_and_torch_adamw(tmp_path):
    ranks = run_ranks(tmp_path)
    assert all(r["buckets"] >= 3 for r in ranks)  # several buckets, so their order and overlap are exercised
    assert all(r["params_same"] for r in ranks), ranks  # broadcast, averaged gradients and AdamW's update, bit for bit
    assert all(r["synced_grads_same"] for r in ranks), ranks  # the averaged gradients themselves, before AdamW's near scale-free update
    assert all(r["local_grads_same"] for r in ranks), ranks  # no_sync keeps each rank's own gradients, as DDP's
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # and the ranks agree
    assert not any(r["dynamo_before_ddp"] for r in ranks)  # none of it imported torch._dynamo


def test_ranks_that_built_different_models_are_told_so_before_any_broadcast(tmp_path):
    ranks = run_ranks(tmp_path, MISMATCHED)
    # 4x4 + 4 = 20 values on rank 0, 4x5 + 5 = 25 on rank 1, one bucket each.
    assert ranks[0]["said"] == ("the ranks built different models: 20-25 parameters in 1-1 buckets (this rank 20 in 1); "
                                "every rank must be given the same model arguments")
    assert ranks[1]["said"].endswith("(this rank 25 in 1); every rank must be given the same model arguments")


# The whole probe, one gloo rank on this CPU, run by hand as its docstring says (no torchrun:
# the rank's environment set here), then asked what it imported.
PROBE = r"""
import runpy, sys
sys.path.insert(0, sys.argv[1])
sys.argv = ["train_probe.py", "--backend", "gloo", "--device", "cpu", "--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "16",
            "--vocab", "64", "--batch", "2", "--steps", "6", "--gemm-n", "32", "--gemm-warmup-seconds", "0", "--max-seconds", "1"]
import train_probe
code = train_probe.main()
print("dynamo", "torch._dynamo" in sys.modules, "exit", code, flush=True)
import os
os._exit(0)
"""


def test_the_whole_probe_trains_without_importing_torch_dynamo(tmp_path):
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "0", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", PROBE, str(launch.WORKERS_DIR)], capture_output=True, text=True, env=env, timeout=DEADLINE, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert json.loads(lines[0])["loss"][1] < json.loads(lines[0])["loss"][0], lines  # it trained
    assert lines[-1] == "dynamo False exit 0", lines
