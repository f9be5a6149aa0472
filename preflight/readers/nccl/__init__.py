"""What NCCL says and is told: its settings, its logs and known errors, the network it chose, nccl-tests' tables."""
