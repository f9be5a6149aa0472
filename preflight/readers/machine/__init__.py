"""Where this machine's GPUs, NICs and CPUs sit: the layout from NVML, `nvidia-smi topo -m` and sysfs,
the PCIe tree under them, the matrix derived where nvidia-smi's cannot be read, and the RDMA ports."""
