"""What machines print, read into facts: text, sysfs or NVML in, a model out.

nvidia/ (NVML through its child, `nvidia-smi -q` and `topo -m`, `dcgmi diag`),
machine/ (where GPUs, NICs and CPUs sit: the layout, the PCIe tree, RDMA ports),
system/ (memory, /dev/shm's mount, containers, the Slurm jobs here), kernel/
(Xids and their catalog, the journal, PCIe notices), nccl/ (NCCL's settings,
logs, errors and network, nccl-tests' tables); at the top capture (a file a
person hands over), df (`df` output) and torch_build (what a torch was built for).

Imports: preflight.base, one another and the package's __version__; never the
pipeline, a check, an output or the CLI, so each can be tested with a recorded
file alone. Between the packages one way: machine reads through nvidia and nccl,
kernel through capture (tests/test_architecture.py).
"""
