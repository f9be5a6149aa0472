"""What this process is given: the memory the kernel and its cgroup would still give, /dev/shm's mount, whether it runs in a container, the Slurm jobs beside it."""
