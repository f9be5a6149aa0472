"""Where a verdict goes, and what a person reads.

console (stderr while checks run, then the verdict), gate (`preflight run`:
the plan run under the lock, its textfile and report written), metrics
(Prometheus: the textfile and serve's /metrics), last_report (the report on
disk and what it vouches for now), serve, slurm (slurm-healthcheck), kube
(kube-label), calibrate (a known-good node's figures as a site's floors), and
the text of the explainers (profile_text, detect_text, xid_text,
topology_text, nccl_log_text).

Imports: anything below (base, readers, pipeline, gpuwork, checkkit, and a
check's facts and judges for the explainers); never the CLI.
"""
