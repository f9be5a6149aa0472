"""The least a job pays before its first step: torch imported, an NCCL process group
(gloo without a GPU), one all_reduce checked, the group destroyed. run.sh times
`torchrun` of this beside `preflight run --level quick` and the standard level.

    python3 checks/workers/_torchrun.py --nnodes 1 --rdzv-backend preflight-loopback --rdzv-endpoint 127.0.0.1:0 --nproc-per-node 1 tests/gpu/bare.py
"""

import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    local, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    x = torch.ones(1, device=device)
    dist.all_reduce(x)
    ok = int(x.item()) == world
    dist.destroy_process_group()
    if not ok:
        print(f"bare.py: all_reduce gave {x.item()}, not {world}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
