"""What machines print, read into facts: text, sysfs or NVML in, a model out.

nvml (+ nvml_query, the child that talks to pynvml), topo (`nvidia-smi
topo -m`), layout (sysfs, cgroups: where GPUs, NICs and CPUs sit), xid (the
kernel log), nccl_log (NCCL's debug lines) with nccl_errors (what each known
error means), nccl_env, nccl_net (the network NCCL chose between nodes),
nccltests (nccl-tests' tables), pcie_notice (the kernel's PCIe bandwidth
notices), df (`df` output), capture (a file a person hands over).

Imports: preflight.base, one another and the package's __version__; never the pipeline, a check, an
output or the CLI, so each can be tested with a recorded file alone.
"""
