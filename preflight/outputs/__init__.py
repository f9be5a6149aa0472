"""Where a verdict goes, and what a person reads.

gate (`preflight run`: the plan run under the lock, its textfile and report
written) and calibrate (a known-good node's figures as a site's floors) at the
top, with the texts of `show-profile`, `list`, `detect` and docs/reference.md;
record/ (the last report and what it vouches for, the run under way, the
history and its trends), exporters/ (the console, Prometheus metrics, serve),
schedulers/ (slurm-healthcheck, kube-label, their caps), html/ (the page),
explain/ (saved captures and logs: explain, xid, nccl-log, topology).

Imports: anything below (base, readers, pipeline, gpuwork, checkkit, and a
check's facts and judges for the explainers); never the CLI. Between the
packages one way: record imports none of the others (tests/test_architecture.py).
"""
