#!/usr/bin/env bash
# The system tools the test suite runs for real, from Debian's packages.
# Run as root on Debian or Ubuntu; on other systems install the same tools by
# hand. A test whose tool is missing skips and says which; CI installs all.
set -euo pipefail

# command-that-proves-it-is-there  package
tools=(
    "systemd-analyze systemd"        # `systemd-analyze verify` on the units
    "numactl numactl"                # the topology tests run the advised launch line
    "promtool prometheus"            # lint the rules; a real Prometheus scrapes serve
    "prometheus prometheus"
    "prometheus-node-exporter prometheus-node-exporter"   # node_exporter reads preflight's textfile; Prometheus alerts on it
    "openssl openssl"                # the Kubernetes labeler's TLS test makes its certificate
    "munged munge"                   # a real Slurm on this machine drains and resumes a node
    "slurmctld slurmctld"
    "slurmd slurmd"
    "sbatch slurm-client"
    "tmux tmux"                      # a real terminal for the live progress line (capture-pane)
    "chromium chromium"              # the report page, rendered headless to PNG
)

missing=()
for t in "${tools[@]}"; do
    read -r cmd pkg <<<"$t"
    command -v "$cmd" >/dev/null || missing+=("$pkg")
done
if ((${#missing[@]})); then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
