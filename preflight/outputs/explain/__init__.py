"""Explanations of saved captures and logs: `preflight explain`, `xid`, `nccl-log`, `topology`."""
