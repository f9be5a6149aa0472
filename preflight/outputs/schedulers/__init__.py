"""The schedulers' view of the verdict: Slurm's drain and resume, Kubernetes' labels and taints, their caps."""
