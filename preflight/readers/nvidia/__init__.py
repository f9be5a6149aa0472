"""What NVIDIA's driver and tools say: NVML (through its child), `nvidia-smi -q` and `topo -m` texts, `dcgmi diag` tables."""
