"""What sysfs and /proc say of this machine: PCIe paths, RDMA ports, memory, /dev/shm's mount, the layout, containers, Slurm jobs."""
